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
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from wsnmom.core.model import NotificationMessage, _direct_init
from wsnmom.topic_mapping.model import PathPattern, Topic

if TYPE_CHECKING:
    from wsnmom.topic_mapping.syntax import WildcardSyntax


#: Metadata header names carried with every message (AMQP headers, Kafka record headers,
#: MQTT 5 user properties).  Natively published messages may lack all of them.
HEADER_MESSAGE_ID = "wsnmom-message-id"
HEADER_TOPIC_NAMESPACE = "wsnmom-topic-ns"
HEADER_TOPIC_PATH = "wsnmom-topic-path"
HEADER_TOPIC_DIALECT = "wsnmom-topic-dialect"
HEADER_PRODUCER_REFERENCE = "wsnmom-producer-ref"
HEADER_PUBLISHED_AT = "wsnmom-published-at"
#: Set by an adapter on a message the middleware dropped itself from a subscription and
#: sent to ``SubscriptionSpec.dead_letters`` (``Capabilities.native_dead_letters``): why
#: (:data:`DROPPED_MAX_AGE`, :data:`DROPPED_OVERFLOW`) and the ``SubscriptionSpec.name``
#: it was dropped from.
HEADER_DROPPED_REASON = "wsnmom-dropped-reason"
HEADER_DROPPED_FROM = "wsnmom-dropped-from"
#: with them, when it was dropped (ISO 8601, UTC), so that a dead letter keeps its time
#: across gateway restarts; and how many times it had been handed out before (absent: 0)
HEADER_DROPPED_AT = "wsnmom-dropped-at"
HEADER_DROPPED_ATTEMPTS = "wsnmom-dropped-attempts"
DROPPED_MAX_AGE = "max-age"
DROPPED_OVERFLOW = "overflow"
#: the subscription was ended for its full backlog (``limits.on_full = "end"``) and its
#: whole backlog sent to its dead letters (``SubscriptionHandle.delete_into_dead_letters``)
DROPPED_OVERFLOW_END = "overflow-end"

#: Namespaces starting with this prefix are internal to wsnmom (see the module docstring):
#: never matched by ``SubscriptionSpec.patterns=None``, never usable by clients.
INTERNAL_NAMESPACE_PREFIX = "urn:wsnmom:internal:"


def is_internal_namespace(namespace: str) -> bool:
    """True for a namespace reserved for wsnmom's internal traffic."""
    return namespace.startswith(INTERNAL_NAMESPACE_PREFIX)


class AdapterError(Exception):
    """Base class of adapter failures."""


class AdapterUnavailable(AdapterError):
    """The middleware cannot be reached now (connection lost, not yet open).

    Retrying may help, unless it is a :class:`MiddlewareRefused`: the middleware answered
    and turned the gateway away, which needs an operator."""


class MiddlewareBusy(AdapterError):
    """The middleware is connected but did not answer in time: it is overloaded, not
    unreachable (never an ``AdapterUnavailable``).  ``retry_after`` (seconds) is the
    adapter's estimate of when the backlog in front of the operation will have cleared;
    ``backlog`` how many operations were waiting (None when the adapter cannot tell).
    Core answers a ResourceUnavailableFault of its own text, HTTP 503 with that
    ``Retry-After``, and does not treat the middleware as down."""

    def __init__(
        self, message: str, *, retry_after: float | None = None, backlog: int | None = None
    ) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.backlog = backlog


class MiddlewareRefused(AdapterError):
    """The middleware answered but will not serve the gateway; retrying does not help
    (not an ``AdapterUnavailable``: a gateway does not keep waiting for it)."""


class CredentialsRefused(MiddlewareRefused):
    """Wrong user name, password or client certificate."""


class AccessRefused(MiddlewareRefused):
    """The credentials were accepted but the virtual host / namespace does not exist or
    the user may not use it."""


class DirectoryInUse(AdapterError):
    """A directory the adapter keeps (its queues, its session state) is held by another
    process; waiting would not help (not an ``AdapterUnavailable``): another gateway uses
    that data directory."""


class PublishFailed(AdapterError):
    """The middleware did not confirm a publish (nacked, timed out, rejected)."""


class TopicUnavailable(AdapterError):
    """The middleware has no place for this topic and will not create one (e.g. a Kafka
    topic that must exist already, an MQTT name past 65,535 bytes); core answers
    TopicNotSupportedFault to the Notify or Subscribe that needed it."""


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


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What an adapter can do.  New fields are only ever added, with safe defaults.

    The class attribute ``Adapter.capabilities`` says what the adapter class can do in
    general (``wsnmom adapters`` lists it); an adapter whose abilities depend on the
    connection (MQTT 3.1.1 or 5) sets its own instance attribute in ``open()``.  Core reads
    ``adapter.capabilities`` after ``open()`` and acts on the fields that say so; the
    fields marked *informational* change nothing in core: they tell the conformance kit
    which checks apply, and operators (``wsnmom adapters``, the admin page) what the
    middleware does (docs/plugins.md, "Capabilities").
    """

    #: native topic syntax; the adapter translates core's patterns with it
    #: (``topic_mapping.translate``).  Informational for core (the kit checks it)
    syntax: WildcardSyntax
    #: "per_message" (RabbitMQ, MQTT, embedded) or "offset" (Kafka).  With "offset" core
    #: settles the messages of a subscription in the order it received them, filtered-out
    #: ones included, so the adapter can commit a contiguous prefix
    ack_mode: Literal["per_message", "offset"] = "per_message"
    #: subscriptions survive gateway and middleware restarts.  Informational
    durable_subscriptions: bool = True
    #: SubscriptionHandle.pull / take are served by the middleware: GetMessages takes from
    #: the pull point's handle and from the handles of the subscriptions feeding it
    #: (``core.pull_reader``).  False: core never calls them; it starts those handles in
    #: push mode into a pull buffer of unsettled messages, settled as GetMessages hands
    #: them out (``core.pull_buffer``).  Either way the pull point reads its feeds
    #: directly (``core.pull_feeds``)
    native_pull: bool = True
    #: the middleware keeps the last message per topic (MQTT retain, embedded table).
    #: False: core keeps the current message per topic in its own store
    retained_current_message: bool = False
    #: metadata travels as native headers (False: MQTT 3.1.1, wrapped in the body).
    #: Informational: the adapter wraps them itself
    native_headers: bool = True
    #: QueueLimits are enforced by the middleware itself as messages arrive (RabbitMQ
    #: x-max-length ...).  False: core enforces them (``max_age`` when a message is handed
    #: out; counts and bytes every sweep, with ``Adapter.depths`` and
    #: ``SubscriptionHandle.discard``), and the policy document says so
    native_queue_limits: bool = False
    #: order is kept per subscription ("subscription") or only per partition
    #: ("partition"); core states it in the policy document (``GET /wsn/policy``)
    ordering: Literal["subscription", "partition", "none"] = "subscription"
    #: several gateway processes can consume one subscription without duplicates.
    #: Informational
    competing_consumers: bool = True
    #: largest message body the middleware accepts, None = no practical limit.
    #: Informational (the kit checks it)
    max_message_bytes: int | None = None
    #: every message reaches the middleware through this one gateway process (no native
    #: publishers, no other gateway instances).  Core's one optimisation flag: it then
    #: routes a notification to the subscriptions feeding its own pull points (those
    #: without a MessageContent filter, never paused) when it publishes, instead of giving
    #: each a durable subscription its pull point reads (``core.direct_routing``;
    #: embedded: the directory is locked to one process).
    sole_publisher: bool = False
    #: subscriptions' queued messages live in this process's data directory (embedded;
    #: MQTT, whose queues are the gateway's own): one instance per store, so a second
    #: live instance on a shared store is refused at start (docs/scale-out.md)
    local_queues: bool = False
    #: every name ``Adapter.subscription_names`` answers is this gateway's (its data
    #: directory's queues, or sessions under its own topic prefix), never another
    #: gateway's on the same middleware: core's orphan sweep (``core.orphans``) may then
    #: delete a listed name the store has no subscription or pull point of.  False (the
    #: default, and Kafka, whose consumer group names do not say which gateway made
    #: them): nothing listed is ever deleted for having no record
    own_names: bool = False
    #: ``nack(requeue=True)`` puts back exactly that message (queues).  False (logs): a
    #: requeue rewinds the subscription to that message, so later ones may come again.
    #: Informational (core settles every message; the kit checks redelivery with it)
    per_message_nack: bool = True
    #: acknowledgements must reach the middleware in the order messages arrived (MQTT
    #: QoS 1 PUBACK order); core then settles in order as for ``ack_mode="offset"``
    ordered_acks: bool = False
    #: how subscriptions are built on the middleware: "queue", "log" (cursors over
    #: shared logs) or "session".  Informational (shown on the admin overview)
    shape: Literal["queue", "log", "session"] = "queue"
    #: ``SubscriptionHandle.peek`` reads waiting messages without consuming them (no
    #: redelivery flag, no delivery count, nothing hidden from consumers meanwhile).
    #: False: ``peek`` raises ``NotImplementedError`` saying why, and operators see only
    #: what core holds in memory (the admin page says so).  Informational: core calls
    #: ``peek`` either way and takes the ``NotImplementedError`` as the answer
    #: (``core.peek``); the kit runs its ``Peek`` checks with it
    peek: bool = False
    #: what the adapter drops for ``QueueLimits`` goes to the subscription's
    #: ``SubscriptionSpec.dead_letters`` topic, and reaches its subscribers with
    #: ``HEADER_DROPPED_REASON``, ``HEADER_DROPPED_FROM`` and ``HEADER_DROPPED_AT``
    #: (``HEADER_DROPPED_ATTEMPTS`` where it counts hand-outs), before the middleware
    #: forgets it for the subscription: what the middleware drops itself
    #: (``native_queue_limits``: its own ``max_age`` and count/byte limits; RabbitMQ's
    #: dead-letter exchange, the embedded and MQTT queues in the same transaction) and
    #: what ``SubscriptionHandle.discard`` drops (logs: read and published
    #: before the cursor commits past it).  This is the one way an adapter reports a
    #: message it gives up on; core reads the topic like any other (``core.dead_letters``)
    #: and keeps no per-adapter case.  False: such messages are gone
    native_dead_letters: bool = False

    @property
    def settles_in_order(self) -> bool:
        """Whether core must settle each subscription's messages in arrival order."""
        return self.ack_mode == "offset" or self.ordered_acks


@_direct_init
@dataclass(frozen=True, slots=True)
class OutboundMessage:
    """A message core asks the adapter to publish."""

    topic: Topic
    body: bytes
    message_id: str
    headers: Mapping[str, str] = field(default_factory=dict)
    content_type: str = "application/xml"


@_direct_init
@dataclass(frozen=True, slots=True)
class PublishReceipt:
    """The middleware's answer to a confirmed publish."""

    #: False when the middleware said no subscription received it (RabbitMQ unroutable);
    #: None when the middleware cannot tell.  Not an error: there may be no subscriber yet.
    routed: bool | None = None


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A message read back from the middleware without consuming it (the current message
    of a topic, a message ``SubscriptionHandle.peek`` saw waiting)."""

    topic: Topic
    body: bytes
    headers: Mapping[str, str]
    content_type: str = "application/xml"
    #: when the middleware stored it (UTC), None when it cannot tell
    timestamp: datetime | None = None


class SharedMessage:
    """One middleware message handed to several subscriptions (a log record read once
    for many cursors): every copy's ``Received.shared`` is the same object, and core
    keeps there what it derives from the message's content alone (its decoded
    notification), so that is done once per message, not once per subscription."""

    __slots__ = ("notification",)

    def __init__(self) -> None:
        self.notification: NotificationMessage | None = None


class Received(abc.ABC):
    """A message handed to core from a durable subscription; settle it exactly once."""

    topic: Topic
    body: bytes
    headers: Mapping[str, str]
    content_type: str
    #: True when the middleware says this message was handed out before
    redelivered: bool
    #: when the middleware stored the message (UTC), None when it cannot tell; core uses
    #: it (or the gateway's own ``wsnmom-published-at`` header) for ``QueueLimits.max_age``
    #: when the middleware does not enforce limits itself
    timestamp: datetime | None = None
    #: the same object in every subscription's copy of one middleware message, when the
    #: adapter hands one message to several (``SharedMessage``); None: not shared
    shared: SharedMessage | None = None

    @abc.abstractmethod
    def ack(self) -> None:
        """Done: the middleware may forget the message for this subscription."""

    @abc.abstractmethod
    def nack(self, requeue: bool = True) -> None:
        """Not done: requeue for redelivery (in order where possible) or drop it."""

    @property
    def settleable(self) -> bool:
        """False once settling it can no longer reach the middleware (the connection it
        came on is gone): the middleware gives it again, so core must not hand out the
        copy it still holds (``core.pull_buffer`` drops it).  True unless the adapter can
        tell."""
        return True


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

    def take(self, max_messages: int) -> list[Received]:
        """Pull mode, consumed on hand-out: up to ``max_messages`` messages that are ready
        now, oldest first, already removed from the subscription.  The caller must not
        settle them (``ack``/``nack`` do nothing).  For callers that would acknowledge
        everything they pull straight away (GetMessages): a crash after this returns loses
        the messages, exactly as after ``pull`` and ``ack``.

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

    @abc.abstractmethod
    def ping(self, timeout: float = 1.0) -> bool:
        """True when the middleware answers now (readiness)."""

    def available(self) -> bool:
        """False while the adapter *knows* it cannot reach the middleware (connection lost
        and not re-established yet, or not opened yet).  Must answer at once, without I/O:
        core asks before every operation that needs the middleware and fails fast (after
        a short grace) instead of waiting for a timeout.  Default: True."""
        return True

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

    def forget_subscription(self, name: str) -> None:
        """Cluster mode: another instance destroyed the durable subscription ``name``
        (its record is gone from the shared store); this instance stopped its handle.
        Drop what the adapter keeps of it here and write nothing of it to the middleware
        again; an adapter that saved its position itself (a cursor's consumer group)
        makes sure no save of this instance's, also one already under way, is left behind
        the other instance's delete.  Idempotent, also for unknown names.  Default:
        nothing (the middleware keeps nothing this instance wrote)."""
        return None

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
