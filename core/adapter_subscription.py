"""The durable subscription of the adapter contract: what core asks an adapter to keep
(``SubscriptionSpec``, with its bounds ``QueueLimits`` and ``Overflow``) and the live
handle on it (``SubscriptionHandle``: push, pull, hand-out, peek, discard, purge, delete,
dead letters).

Part of the contract :mod:`wsnmom.core.adapter` documents (delivery guarantees,
internal namespaces, threading) and re-exports: plugin authors import these names from
``wsnmom.core.adapter``.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from wsnmom.core.adapter_messages import OutboundMessage, Received, StoredMessage
from wsnmom.topic_mapping.model import PathPattern, Topic

__all__ = [
    "Overflow",
    "QueueLimits",
    "SpecOrigin",
    "SubscriptionHandle",
    "SubscriptionSpec",
]


class Overflow(enum.Enum):
    """What a full durable subscription does with one more message."""

    DROP_OLDEST = "drop_oldest"
    DROP_NEWEST = "drop_newest"


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """Bounds on what a durable subscription accumulates; None = unbounded."""

    max_messages: int | None = None
    max_bytes: int | None = None
    overflow: Overflow = Overflow.DROP_OLDEST
    #: retention: messages older than this are discarded undelivered
    max_age: timedelta | None = None


#: ``SubscriptionSpec.origin``
SpecOrigin = Literal["", "new", "elsewhere"]


@dataclass(frozen=True, slots=True)
class SubscriptionSpec:
    """A durable subscription core wants to exist.

    ``patterns`` None means every topic of every namespace except the internal ones
    (:func:`is_internal_namespace`); an internal topic reaches only subscriptions whose
    patterns name its namespace.  The same ``name`` always
    re-attaches to the same durable state (after restarts too); a different ``patterns``
    for an existing name re-binds it.
    """

    name: str
    patterns: tuple[PathPattern, ...] | None
    limits: QueueLimits = QueueLimits()
    #: where the adapter sends what it drops for ``limits``, where it can
    #: (``Capabilities.native_dead_letters``); None: nowhere
    dead_letters: Topic | None = None
    #: an adapter that publishes what it drops to ``dead_letters`` itself (a log's
    #: cursor reads and publishes it) publishes through this when given: core's confirmed
    #: publish, which counts each one in the metric once it is confirmed (it raises
    #: ``AdapterError`` as ``publish_many`` does).  None: the adapter's own
    #: ``publish_many``.  Adapters whose middleware moves what it drops (a dead-letter
    #: exchange, a transaction) ignore it
    dead_letter_sink: Callable[[Sequence[OutboundMessage]], object] | None = None
    #: core reads this durable subscription with :meth:`SubscriptionHandle.pull` (a pull
    #: point's inbox, or a subscription feeding a pull point on a middleware with native
    #: pull), never with ``start``: an adapter that lets one consumer at a time receive
    #: (RabbitMQ's single-active-consumer in cluster mode) must keep it readable by pull
    pulled: bool = False
    #: how core came to want it: ``"new"``, made by a Subscribe a moment ago under a new
    #: name (nothing of it can exist on the middleware yet: an adapter need not look);
    #: ``"elsewhere"``, made through another gateway instance on the same middleware,
    #: which declares it before it answers the Subscribe (this instance follows the
    #: store, ``core.follow``: an adapter of a middleware shared by instances may leave
    #: the declaration to this instance's first consume, ``start``); ``""``, anything
    #: else (a restart's restore, a re-attach, a shard taken over): declared as needed
    origin: SpecOrigin = ""


class SubscriptionHandle(abc.ABC):
    """A live handle on one durable subscription."""

    #: empty, so a subclass that declares ``__slots__`` has no per-instance ``__dict__``
    __slots__ = ()

    name: str

    @abc.abstractmethod
    def start(self, on_message: Callable[[Received], None], prefetch: int = 64) -> None:
        """Push mode: call ``on_message`` for each message; at most ``prefetch`` unsettled.

        Idempotent; resumes after ``stop``.  Unsettled messages are redelivered when the
        handle is stopped or the gateway dies.
        """

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop consuming; the durable subscription keeps accumulating (pause)."""

    @abc.abstractmethod
    def pull(self, max_messages: int, timeout: float = 0.0) -> list[Received]:
        """Pull mode: take up to ``max_messages`` now (waiting up to ``timeout`` seconds
        for the first one), oldest first.  Not to be mixed with ``start`` on one handle."""

    def hand_out(self, max_messages: int) -> list[Received]:
        """GetMessages' read: up to ``max_messages`` messages that are ready now, oldest
        first, not settled.  Core acknowledges them once the HTTP server accepted the whole
        answer that carries them, or gives them back (``nack(requeue=True)``, newest first)
        when the answer was not written; they must stay out of later reads meanwhile and
        come again if the gateway dies before either (at-least-once: a crash duplicates at
        most the answers in flight, it never loses them).

        The default pulls without waiting; override it when the middleware has a cheaper
        read with later acknowledgement (RabbitMQ: ``basic.get`` on a shared channel).
        """
        return self.pull(max_messages, timeout=0.0)

    def take(self, max_messages: int) -> list[Received]:
        """Pull mode, consumed on hand-out: up to ``max_messages`` messages that are ready
        now, oldest first, already removed from the subscription.  The caller must not
        settle them (``ack``/``nack`` do nothing).  For callers that drop what they read
        (``discard``): a crash after this returns loses the messages, exactly as after
        ``pull`` and ``ack``.  GetMessages reads with ``hand_out`` instead.

        The default pulls without waiting and acknowledges each message; override it when
        the middleware hands out and removes in one step (one transaction, an auto-ack
        ``basic.get``, ...).
        """
        received = self.pull(max_messages, timeout=0.0)
        for r in received:
            r.ack()
        return received

    @abc.abstractmethod
    def depth(self) -> int | None:
        """Messages waiting (not yet handed out), or None when the middleware can't tell."""

    def peek(self, max_messages: int) -> list[StoredMessage]:
        """The first ``max_messages`` waiting messages (not handed out), oldest first,
        left exactly where they are: an operator's look into the backlog.  Nothing about
        them changes (not marked redelivered, no delivery counted, never hidden from
        consumers meanwhile), and nothing is committed.

        Adapters declare ``Capabilities.peek`` when they implement it.  The default raises
        ``NotImplementedError``; an adapter whose middleware can only hand a message out by
        delivering it overrides it to raise with the reason (core shows it to operators).
        """
        raise NotImplementedError("this adapter cannot read waiting messages without consuming")

    def discard(self, count: int, *, newest: bool = False) -> int:
        """Drop up to ``count`` waiting messages (not handed out): the oldest ones, or with
        ``newest`` the most recent ones.  Returns how many were dropped.

        Core calls it to enforce ``QueueLimits`` when the middleware does not
        (``native_queue_limits=False``).  With ``Capabilities.native_dead_letters`` and a
        ``SubscriptionSpec.dead_letters`` topic, the messages dropped go there
        (``HEADER_DROPPED_REASON`` = :data:`DROPPED_OVERFLOW`).  The default takes the
        oldest messages (and dead-letters nothing); an
        adapter that cannot drop the newest raises ``NotImplementedError`` for it (core
        then drops the oldest instead and logs an error, ``core.limits``).
        """
        if newest:
            raise NotImplementedError("this adapter cannot drop the newest messages")
        return len(self.take(count))

    def purge(self) -> int | None:
        """Drop every waiting message (not handed out): an operator's purge.  Returns how
        many were dropped, or None when the middleware cannot tell.

        The default asks ``depth()`` and discards that many with ``discard``; it raises
        ``NotImplementedError`` when the depth is unknown.  Override it when the
        middleware empties a queue in one step (RabbitMQ ``queue.purge``, one SQL
        statement).
        """
        waiting = self.depth()
        if waiting is None:
            raise NotImplementedError("the middleware cannot tell how many messages wait")
        return self.discard(waiting) if waiting else 0

    def lost(self) -> int:
        """Messages the middleware deleted before this subscription read them (a log's
        retention), since the subscription was created.  Core reports the count in the
        subscription's properties.  0 when nothing can be lost."""
        return 0

    @abc.abstractmethod
    def delete(self) -> None:
        """Destroy the durable subscription and everything it holds.  Idempotent."""

    def delete_into_dead_letters(
        self, reason: str, context: Mapping[str, str], timeout: float = 30.0
    ) -> int:
        """Destroy the durable subscription as ``delete`` does, after sending every message
        it holds to its ``SubscriptionSpec.dead_letters`` topic: the waiting ones and those
        handed out and not settled (the caller stopped consuming first), each marked as
        what the adapter drops for the limits is (``HEADER_DROPPED_REASON`` = ``reason``,
        ``HEADER_DROPPED_FROM``, ``HEADER_DROPPED_AT``, ``HEADER_DROPPED_ATTEMPTS`` where
        known) plus the headers ``context`` (the consumer, the error).  Nothing that
        reaches the subscription before it is gone is left out: the adapter stops it
        receiving first, or buries and deletes in one step.  Returns how many were sent.

        Raises ``AdapterError`` when the middleware refused them or stopped confirming
        them for ``timeout`` seconds (a long backlog may take longer as long as it
        progresses): those it confirmed are gone from the subscription, the rest stay (it
        is not deleted; core tries again later).  Adapters with
        ``Capabilities.native_dead_letters`` implement it; the default raises
        ``NotImplementedError`` (core then deletes without dead letters and says so).
        """
        raise NotImplementedError("this adapter cannot send a backlog to its dead letters")
