"""The adapter contract: what a middleware adapter must provide to back the broker.

An adapter knows its middleware and nothing of WS-N.  Core hands it concrete topics and
topic patterns (``wsnmom.topic_mapping`` types) and opaque message bodies; the adapter turns
them into native names with ``wsnmom.topic_mapping.translate`` driven by its
``Capabilities.syntax`` and never parses topic expressions itself.

Delivery guarantees
    ``publish`` returns only after the middleware confirmed the message (publisher confirm,
    Kafka delivery report with acks=all, MQTT PUBACK, SQLite commit).  Every WS-N subscription
    and pull point is a *durable subscription* named by core (``SubscriptionSpec.name``) that
    keeps accumulating while nobody consumes it — also while the gateway is down.  Messages
    are handed out as ``Received`` objects; core calls ``ack()`` only once the consumer has
    answered 2xx (push) or GetMessages has handed the message out (pull), so delivery is
    at-least-once.  ``nack(requeue=True)`` puts a message back for redelivery.

Internal namespaces
    Topic namespaces starting with :data:`INTERNAL_NAMESPACE_PREFIX` carry wsnmom's own
    traffic (a pull point's private inbox ``urn:wsnmom:internal:pull-point``).  Such a topic
    reaches only subscriptions whose ``patterns`` name its namespace explicitly:
    ``SubscriptionSpec.patterns=None`` means every topic of every *non-internal* namespace.
    (Otherwise every subscription without a topic filter would receive, and have to ack
    away, every copy made into every pull point.)  RabbitMQ: internal exchanges are not
    bound to the catch-all exchange; Kafka: the "everything" regex excludes the internal
    topic prefix; MQTT: "everything" subscribes to the non-internal namespace roots, not
    to a bare ``#``; embedded: the router skips match-all subscriptions for internal topics.
    The conformance kit checks it (``TopicRouting.test_patterns_none_skips_internal``).

How the three middleware families fit (``Capabilities.shape``)
    *queue* (RabbitMQ, embedded): a durable queue per subscription, bound with one binding
    key per pattern; ``ack``/``nack`` settle one message each.  *log* (Kafka, RabbitMQ
    streams): every subscription is a cursor over shared append-only logs, served by a
    bounded set of shared readers (``wsnmom.adapters.logbase``); an ``ack`` lets the
    cursor's committed position advance past the message once everything before it is
    settled (``ack_mode="offset"``: core settles in order); there is no per-message nack
    (``per_message_nack=False``: a requeue rewinds the cursor).  *session* (MQTT): a
    persistent session delivers into queues the gateway keeps durable per subscription;
    acknowledgements to the middleware go out in arrival order.

Threading
    Core calls adapter methods from many threads (HTTP workers, delivery workers, the
    scheduler): every public method must be thread-safe.  Client libraries that are not
    (pika) must own one I/O thread per connection and marshal calls onto it.  The
    ``on_message`` callback given to ``SubscriptionHandle.start`` is called on an adapter
    thread and must not block: core only enqueues there.  ``Received.ack``/``nack`` may be
    called from any thread.

Where the contract's parts are written
    This module holds the ``Adapter`` itself; ``adapter_subscription`` holds the durable
    subscription (``SubscriptionSpec``, ``QueueLimits``, ``Overflow``,
    ``SubscriptionHandle``), ``adapter_capabilities`` ``Capabilities``,
    ``adapter_messages`` the header names and message types, ``adapter_errors`` the
    exceptions.  Every name is re-exported here: import them from ``wsnmom.core.adapter``
    (the paths of the parts are not part of the contract).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, ClassVar, Protocol

from wsnmom.core.adapter_capabilities import Capabilities
from wsnmom.core.adapter_errors import (
    AccessRefused,
    AdapterError,
    AdapterUnavailable,
    CredentialsRefused,
    DirectoryInUse,
    MiddlewareBusy,
    MiddlewareRefused,
    PublishFailed,
    TopicUnavailable,
)
from wsnmom.core.adapter_messages import (
    DROPPED_MAX_AGE,
    DROPPED_OVERFLOW,
    DROPPED_OVERFLOW_END,
    HEADER_DROPPED_AT,
    HEADER_DROPPED_ATTEMPTS,
    HEADER_DROPPED_FROM,
    HEADER_DROPPED_REASON,
    HEADER_MESSAGE_ID,
    HEADER_PRODUCER_REFERENCE,
    HEADER_PUBLISHED_AT,
    HEADER_TOPIC_DIALECT,
    HEADER_TOPIC_NAMESPACE,
    HEADER_TOPIC_PATH,
    INTERNAL_NAMESPACE_PREFIX,
    OutboundMessage,
    PublishReceipt,
    Received,
    SharedMessage,
    StoredMessage,
    is_internal_namespace,
)
from wsnmom.core.adapter_subscription import (
    Overflow,
    QueueLimits,
    SpecOrigin,
    SubscriptionHandle,
    SubscriptionSpec,
)
from wsnmom.topic_mapping.model import Topic

#: the contract's names; those defined in ``adapter_subscription``, ``adapter_errors``,
#: ``adapter_messages`` and ``adapter_capabilities`` are re-exported here, where plugin
#: authors import them from
__all__ = [
    "DROPPED_MAX_AGE",
    "DROPPED_OVERFLOW",
    "DROPPED_OVERFLOW_END",
    "HEADER_DROPPED_AT",
    "HEADER_DROPPED_ATTEMPTS",
    "HEADER_DROPPED_FROM",
    "HEADER_DROPPED_REASON",
    "HEADER_MESSAGE_ID",
    "HEADER_PRODUCER_REFERENCE",
    "HEADER_PUBLISHED_AT",
    "HEADER_TOPIC_DIALECT",
    "HEADER_TOPIC_NAMESPACE",
    "HEADER_TOPIC_PATH",
    "INTERNAL_NAMESPACE_PREFIX",
    "AccessRefused",
    "Adapter",
    "AdapterError",
    "AdapterUnavailable",
    "Capabilities",
    "CredentialsRefused",
    "DirectoryInUse",
    "MiddlewareBusy",
    "MiddlewareRefused",
    "OutboundMessage",
    "Overflow",
    "PositionKeeper",
    "PublishFailed",
    "PublishReceipt",
    "QueueLimits",
    "Received",
    "SharedMessage",
    "SpecOrigin",
    "StoredMessage",
    "SubscriptionHandle",
    "SubscriptionSpec",
    "TopicUnavailable",
    "is_internal_namespace",
]


#: a stream of a log-based middleware, ``(log name, partition)`` (a Kafka topic partition)
Stream = tuple[str, int]


class PositionKeeper(Protocol):
    """Cluster mode: where core keeps the delivery positions of durable subscriptions
    (offsets per stream, by subscription name) in the shared store, each write fenced by
    the shard this instance holds for the name (``Adapter.positions_kept_by``).
    Thread-safe; every call is a store round trip (never on a thread that must not wait).
    Exceptions mean "not known / not done now"."""

    def load(self, names: Collection[str]) -> dict[str, dict[Stream, int]]:
        """The kept positions of these names (a name with none kept is left out)."""

    def load_all(self) -> dict[str, dict[Stream, int]]:
        """Every kept name's positions."""

    def save(self, changes: Mapping[str, Mapping[Stream, int]]) -> dict[str, str]:
        """Keep these positions (the streams named are replaced, others kept), in one
        statement; returns the names refused, each with why (words for a log line):
        this instance does not hold the shard the name is fenced by (it let it go or its
        lease lapsed: refused without asking the store), or the store found the shard's
        epoch moved on (another instance took it over since).  Nothing of a refused name
        is written."""

    def delete(self, names: Collection[str]) -> None:
        """Forget these names' positions (not fenced; unknown names are ignored)."""


class Adapter(abc.ABC):
    """Base class of middleware adapters.

    Subclasses are registered by URL scheme (see ``core.plugins``) and constructed with the
    adapter URL and a mapping of options (from configuration).  Importing an adapter module
    whose client library is missing raises ImportError naming the extra to install.
    """

    #: short name shown by ``wsnmom adapters``
    name: ClassVar[str]
    #: URL schemes this adapter serves, e.g. ("amqp", "amqps")
    schemes: ClassVar[tuple[str, ...]]
    #: the pip extra that installs the client library, e.g. "rabbitmq"
    extra: ClassVar[str | None] = None
    #: what the adapter can do.  Set it on the class; an adapter whose abilities depend on
    #: the connection assigns an instance attribute in ``open()`` (never the class's).
    #: Core reads it after ``open()``.
    capabilities: Capabilities
    #: the adapter keeps state of its own on local disk (MQTT: the queues its session
    #: feeds): ``wsnmom serve`` passes the gateway's data directory as the option
    #: ``data_dir`` unless the adapter options name one
    uses_data_dir: ClassVar[bool] = False
    #: option values ``wsnmom serve`` sets when the store is shared by several gateway
    #: instances (cluster mode), unless the URL's query or the configured options name them
    #: (RabbitMQ: ``pull = "get"``, so that any instance takes a pull point's messages)
    cluster_options: ClassVar[Mapping[str, Any]] = {}
    #: the dataclass declaring the adapter's options, one field each with its doc string
    #: (``wsnmom.core.adapter_options.option``); the constructor reads them with
    #: ``wsnmom.core.adapter_options.parse_options``.  None: the adapter takes no options
    declared_options: ClassVar[type[Any] | None] = None

    def __init__(self, url: str, options: Mapping[str, Any] | None = None) -> None:
        self.url = url
        self.options: Mapping[str, Any] = dict(options or {})

    @abc.abstractmethod
    def open(self) -> None:
        """Connect and declare what is needed.  Raises AdapterUnavailable when the
        middleware cannot be reached; core may call ``open()`` again later (a gateway
        started before its middleware keeps retrying), so a failed ``open`` leaves the
        adapter ready for another attempt.  Other errors (bad credentials, bad options)
        raise ``AdapterError`` and are not retried."""

    @abc.abstractmethod
    def close(self) -> None:
        """Disconnect; idempotent.  Durable subscriptions stay on the middleware."""

    def shared_by_instances(self, may_save: Callable[[str], bool] | None = None) -> None:
        """Several gateway instances share this middleware as one broker (cluster mode,
        docs/scale-out.md): a durable subscription is delivered by one of them at a time,
        and which one changes (its delivery starts on one instance after it stopped on
        another, or while the other is dead).  Called once, before or after ``open()``,
        before any subscription is made.  An adapter that keeps a subscription's
        delivery position itself must then continue from the position the last
        deliverer saved, and save it while it delivers.

        ``may_save(name)`` is core's fence for those saves: whether this instance may
        still write the position of the durable subscription ``name`` (it holds the lease
        of its shard, or handed it back cleanly a moment ago; for a subscription that
        feeds a pull point core buffers, the shard of that pull point, whose holder reads
        the feed, ``core.pull_owners``).  Cheap: no I/O.  Such an adapter asks it
        just before every position write and drops the write when it says no: an instance
        that was stopped past its lease (a zombie) then never moves a position back behind
        the one the new deliverer saved.  Default: nothing to do."""
        return None

    def positions_kept_by(self, keeper: PositionKeeper) -> None:
        """Cluster mode on a store that can fence position writes (PostgreSQL): an
        adapter that keeps delivery positions itself (``shared_by_instances``) may keep
        them in ``keeper`` instead, whose writes land only while this instance holds the
        subscription's shard at the epoch it holds it with, checked by the store in the
        write's own statement: a write that passed ``may_save`` and was then held up (a
        process stopped, SIGCONT after another instance took the shard over) is refused
        rather than moving the new deliverer's position back.  Names ``save`` refuses are
        to be treated as a ``may_save`` refusal.  Called right after
        ``shared_by_instances``, before any subscription is made.  Default: nothing (the
        adapter keeps its positions in the middleware, fenced by ``may_save`` alone)."""
        return None

    def kept_in_store(self, stored: Callable[[str], bool]) -> None:
        """Cluster mode: ``stored(name)`` answers whether the store still holds the durable
        subscription ``name`` (a subscription's or a pull point's; one store query, so
        asked only on a rare path, never per message, and never on a thread that must
        not wait).  Core removes the store's record *before* it deletes the durable
        subscription on the middleware (``Subscriptions.destroy``, ``PullPoints.destroy``),
        so an adapter that finds what it kept of ``name`` on the middleware gone (a
        broker that lost its state) tells a deletion through another instance from a
        loss by asking ``stored`` *after* it saw the loss: True, and it was not deleted
        before that moment; to make the durable subscription again race-free, make it
        first and ask then (a deletion after the answer deletes what was made, as core
        deletes it after its record).  An exception from ``stored`` means "not known
        now".  Called after ``shared_by_instances``, before any subscription is made.
        Default: nothing (such an adapter takes a loss as a deletion)."""
        return None

    def kept_in_store_many(self, held: Callable[[Collection[str]], set[str]]) -> None:
        """Cluster mode: the plural of ``kept_in_store``: ``held(names)`` answers which of
        ``names`` the store still holds, in **one** store query for them all.  A
        middleware that lost what it kept of every subscription (a broker restarted
        without its state) finds the loss for each subscription of a shard this instance
        gains: ask once per batch, not once per name, and off the thread that opens the
        deliveries when the delivery can wait for the answer.  The same rules as
        ``kept_in_store`` (ask after the loss was seen and what is made again was made;
        an exception means "not known now" for every name asked).  Called right after
        ``kept_in_store``.  Default: nothing (an adapter asks ``stored`` per name)."""
        return None

    def joined_as(self, instance_id: str) -> None:
        """Cluster mode: this gateway instance's id in the cluster's instance table
        (``cluster.instance_id``, or the one made per process).  Called after
        ``shared_by_instances`` and before any subscription is made.  An adapter that keeps
        sessions of its own per instance on the middleware (MQTT's dead-letter boxes)
        notes it there, so that ``retire_departed`` on another instance can tell whose
        they are.  Default: nothing."""
        return None

    def retire_departed(self, live: Callable[[], Collection[str]]) -> list[str]:
        """Cluster mode, on the instance that runs periodic work once: take back what
        departed instances kept for themselves on the middleware (MQTT: their dead-letter
        boxes, whose letters go to a live box and which take no share of new ones
        afterwards), losing nothing; an instance that comes back afterwards makes its
        own again.  ``live()`` answers the ids (``joined_as``) of the instances whose
        heartbeat is current, this one among them; the adapter asks it *after* it read
        what the instances kept, so an instance that joined after that read (it joins
        before it makes anything) counts as live.  Returns what was retired (names for
        the log).  AdapterUnavailable when the middleware cannot be reached.  Default:
        nothing kept per instance, ``[]``."""
        return []

    @abc.abstractmethod
    def ping(self, timeout: float = 1.0) -> bool:
        """True when the middleware answers now (readiness)."""

    def available(self) -> bool:
        """False while the adapter *knows* it cannot reach the middleware (connection lost
        and not re-established yet, or not opened yet).  Must answer at once, without I/O:
        core asks before every operation that needs the middleware and fails fast (after
        a short grace) instead of waiting for a timeout.  Default: True."""
        return True

    def unavailable_reason(self) -> str | None:
        """While ``available`` is False or ``ping`` fails: what the adapter knows failed
        ("1/1 brokers are down", "connection refused"), for the text of core's 503
        refusal and the ``middleware:`` line of ``/readyz``; None while available.
        Answers at once, without I/O; it may name hosts, never a credential (core shows
        it through ``availability.shown_reason``: redacted, on one line).  Default: None
        (the refusal names only the middleware; the conformance kit's
        ``test_says_why_it_is_unavailable`` skips such an adapter)."""
        return None

    @abc.abstractmethod
    def publish(self, message: OutboundMessage, timeout: float = 10.0) -> PublishReceipt:
        """Publish and wait for the middleware's confirmation; raises PublishFailed."""

    def publish_many(
        self, messages: Sequence[OutboundMessage], timeout: float = 10.0
    ) -> list[PublishReceipt]:
        """Publish several messages, all confirmed on return.  Override to pipeline."""
        return [self.publish(m, timeout) for m in messages]

    @abc.abstractmethod
    def subscription(self, spec: SubscriptionSpec) -> SubscriptionHandle:
        """Create, or re-attach to, the durable subscription ``spec.name``."""

    @abc.abstractmethod
    def delete_subscription(self, name: str) -> None:
        """Destroy the durable subscription ``name`` without a handle; idempotent."""

    def forget_subscription(self, name: str) -> bool:
        """Cluster mode: another instance destroyed the durable subscription ``name``
        (its record is gone from the shared store); this instance stopped its handle.
        Drop what the adapter keeps of it here and write nothing of it to the middleware
        again; an adapter that saved its position itself (a cursor's consumer group)
        makes sure no save of this instance's, also one already under way, is left behind
        the other instance's delete.  Idempotent, also for unknown names.

        True when something this instance made stays in the middleware under the name
        because it could not be deleted now (it holds messages the destroying instance
        may still take, as an end draining a queue into a pull point does): core then
        writes an intent for the name, so the orphan sweep deletes it once the intent is
        ``termination.orphan_grace`` old, unless the destroying instance's own delete
        removed both first.  Default: False (the middleware keeps nothing this instance
        wrote)."""
        return False

    def depths(self, handles: Sequence[SubscriptionHandle]) -> list[int | None]:
        """``handle.depth()`` of each handle, in order, in as few middleware round trips
        as possible (``/metrics`` and the sweep call this once for every subscription).
        Override when the middleware can answer for many subscriptions at once."""
        out: list[int | None] = []
        for handle in handles:
            try:
                out.append(handle.depth())
            except AdapterError:
                out.append(None)
        return out

    def restoring(self) -> None:
        """Core is about to re-attach (``subscription``) the durable subscriptions it
        keeps, at start-up; ``restored`` follows.  Adapters that dispatch from shared
        readers to many subscriptions hold dispatching back until then, so no
        subscription misses what arrives before core re-attached it.  Without this call
        (the conformance kit, scripts) they dispatch as soon as a handle starts.
        Default: nothing."""
        return None

    def restored(self) -> None:
        """Core has re-attached every durable subscription it keeps (see ``restoring``).
        Default: nothing."""
        return None

    def subscription_names(self) -> list[str] | None:
        """Names of the durable subscriptions that exist now, or None when the middleware
        cannot list them (core then assumes any name may exist)."""
        return None

    def current_message(self, topic: Topic) -> StoredMessage | None:
        """The last message published on ``topic`` (also by native producers), if kept.

        Adapters whose middleware keeps no such thing return None; core then answers
        GetCurrentMessage from its own cache.
        """
        return None
