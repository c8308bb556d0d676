"""RabbitMQ adapter: WS-Topics namespaces on topic exchanges, WS-N subscriptions on durable
queues, through pika.

Features
    * Each topic namespace is a durable **topic exchange** (configured name, or derived by
      ``wsnmom.topic_mapping.translate.NamespaceRoots``).  An exchange that already exists
      is used as it is (passive declare first); a missing one is declared durable.  The
      topic path, escaped with ``topic_mapping``'s RabbitMQ syntax, is the routing key;
      topic patterns become binding keys (one per branch of a union).
    * Every namespace exchange the gateway uses is exchange-to-exchange bound with ``#`` to
      one topic exchange, ``wsnmom.all`` (option ``all_exchange``).  A subscription without
      patterns ("everything") binds its queue with ``#`` there.  Exchanges of *internal*
      namespaces (``core.adapter.is_internal_namespace``: pull point inboxes) are not bound
      to it (an existing binding from older versions is removed), so "everything" never
      includes internal traffic, as the adapter contract requires; their messages get no
      current-message tap copy either.
    * Each durable subscription / pull point is a durable queue ``wsnmom.sub.<name>``
      (classic by default).  ``QueueLimits`` become queue arguments: ``x-max-length``,
      ``x-max-length-bytes``, ``x-overflow`` (``drop-head`` for DROP_OLDEST,
      ``reject-publish`` for DROP_NEWEST) and ``x-message-ttl`` for ``max_age``.  Consumers
      use manual acks and ``basic.qos`` prefetch; ``pull`` is ``basic.get``.  Pull points
      are consumed into core's pull buffer unless the option ``pull`` is ``get``.
    * ``publish`` waits for the publisher confirm; messages are persistent, published with
      ``mandatory`` so unroutable ones are reported as ``PublishReceipt(routed=False)``
      (``report_unrouted = false``: not mandatory, receipts say ``routed=None``, and the
      broker does not send every message no queue takes back to the gateway).
      ``publish_many`` pipelines the confirms.
    * Metadata travels in AMQP headers (``wsnmom-*``), ``content_type`` is the message's.
      Natively published messages (any body, no ``wsnmom-*`` headers) are received with
      the topic derived from their exchange and routing key.
    * Current message (GetCurrentMessage) covers native publishers too: a tap queue
      ``wsnmom.current.<instance>`` bound with ``#`` to ``wsnmom.all`` feeds an in-memory
      last-message-per-routing-key map with native messages; the gateway's own confirmed
      publishes update the map directly, and reach *other* gateway instances' taps as
      copies that the broker keeps from the publishing instance's own tap queue (see
      ``docs/adapters/rabbitmq.md``).
    * Threading: one publishing connection and a pool of consuming connections (one to
      start with; another one per ``consumers_per_connection`` subscriptions), each
      driven by its own I/O thread (``_link.Link``); public methods are thread-safe and
      marshal onto those threads.  Every subscription lives on one consuming connection
      with its own channel per consumer (and per puller), so the number of subscriptions
      is not bounded by the channel limit of one connection (2,047 by default).  Lost
      connections are re-established with backoff; exchanges, queues, bindings and
      consumers are declared again and consumers resumed.  Publishes not confirmed when
      the connection drops raise ``PublishFailed``.

Connection String
    ``amqp://user:password@host:5672/vhost`` or ``amqps://...`` (TLS, port 5671), parsed by
    ``pika.URLParameters`` (so its query arguments such as ``heartbeat``,
    ``connection_attempts`` or ``ssl_options`` work).  The scheme ``rabbitmq://`` is an
    alias of ``amqp://``.  The vhost is the URL path (``%2F`` for ``/``).  These wsnmom
    options may also be given as query arguments: ``prefetch``, ``queue_type``,
    ``instance``.

Options
    ``exchanges``
        mapping namespace URI -> exchange name; other namespaces get derived names.
    ``all_exchange``
        name of the catch-all exchange (default ``wsnmom.all``).
    ``queue_prefix``
        prefix of subscription queue names (default ``wsnmom.sub.``).
    ``queue_type``
        ``classic`` (default) or ``quorum``.
    ``queue_arguments``
        extra arguments for every subscription queue (e.g. ``x-queue-mode``).
    ``prefetch``
        default prefetch for consumers when core gives none (default 64).
    ``heartbeat``
        AMQP heartbeat in seconds (default 30; 0 disables).
    ``tls``
        mapping with ``ca_file``, ``cert_file``, ``key_file``, ``verify`` (default True),
        ``server_hostname`` for ``amqps`` (default: the system trust store).
    ``instance``
        stable name of this gateway instance for its current-message tap queue (default:
        random per process).
    ``current_message``
        keep the current-message tap (default True).
    ``current_peers``
        send a copy of every gateway publish to the other gateway instances' taps
        (default True; false when a single instance runs).
    ``report_unrouted``
        publish with ``mandatory`` so that a message no queue takes is reported to
        ``wsnmom_notification_published`` observers as ``routed=False`` (default True).
        False: receipts say ``routed=None`` and the broker does not return each such
        message to the gateway (for topics that often have no subscriber).
    ``current_tap_max_length``, ``current_tap_expires``, ``current_cache_size``
        tap queue length (10000), seconds an unused tap queue survives (3600) and number
        of routing keys remembered (100000).
    ``fail_on_nack``
        raise PublishFailed when the broker nacks a publish (default False: a nack is what
        a full DROP_NEWEST queue answers; see the docs).
    ``prime_queues``
        send every new (empty) classic subscription queue a primer, a persistent message
        that expires at once, so that the broker creates the queue's files then and not
        with the first notification (default True; see ``RabbitMQAdapter._prime``).
    ``consumers_per_connection``
        subscriptions per consuming connection (default 1000; each uses up to two
        channels, so it is lowered automatically to fit the negotiated channel limit).
    ``declare_channels``
        channels per consuming connection on which subscriptions' queues and bindings
        are declared at once (default 4; each declaration holds one for its round trips,
        so a burst of new subscriptions on one connection does not queue on one channel).
    ``operation_timeout``, ``reconnect_max_delay``
        seconds to wait for declarations (10) and the longest reconnect backoff (5).  An
        operation not answered in time while its connection is up raises
        ``MiddlewareBusy`` (overload, with a backlog estimate), not ``AdapterUnavailable``.
    ``pull``
        ``buffer`` (default): pull points are consumed with prefetch into core's pull
        buffer (``native_pull`` False, so subscriptions feeding a pull point are read by
        it directly); ``get``: a ``basic.get`` per GetMessages (``native_pull``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

try:
    import pika
    from pika import spec
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError('the RabbitMQ adapter needs pika: pip install "wsnmom[rabbitmq]"') from exc

from wsnmom.core.adapter import (
    DROPPED_MAX_AGE,
    DROPPED_OVERFLOW,
    HEADER_DROPPED_AT,
    HEADER_DROPPED_FROM,
    HEADER_DROPPED_REASON,
    HEADER_MESSAGE_ID,
    HEADER_TOPIC_NAMESPACE,
    HEADER_TOPIC_PATH,
    AccessRefused,
    Adapter,
    AdapterError,
    AdapterUnavailable,
    Capabilities,
    CredentialsRefused,
    MiddlewareBusy,
    MiddlewareRefused,
    OutboundMessage,
    Overflow,
    PublishFailed,
    PublishReceipt,
    QueueLimits,
    Received,
    StoredMessage,
    SubscriptionHandle,
    SubscriptionSpec,
    is_internal_namespace,
)
from wsnmom.core.adapter_options import AdapterOptionError, did_you_mean, option, parse_options
from wsnmom.core.config_values import convert
from wsnmom.topic_mapping.errors import NameNotRepresentable
from wsnmom.topic_mapping.model import PathPattern, Topic
from wsnmom.topic_mapping.syntax import RABBITMQ
from wsnmom.topic_mapping.translate import fallback_root

from ._completion import Completion
from ._link import (
    NOT_FOUND,
    PRECONDITION_FAILED,
    RESOURCE_LOCKED,
    Channel,
    ChannelError,
    Declarer,
    FrameReader,
    GetReply,
    Link,
    LinkBusy,
    LinkDown,
    PublishFrames,
    describe,
    encode_table,
)
from .names import Binding, RabbitMQNames, headers_of

log = logging.getLogger("wsnmom.adapters.rabbitmq")

#: RabbitMQ's default largest message (``max_message_size``, 128 MiB)
MAX_MESSAGE_BYTES = 128 * 1024 * 1024
#: header on the barrier messages of the current-message tap
_BARRIER_HEADER = "wsnmom-barrier"
#: header marking messages the gateway published (value "gateway"); the current-message
#: tap filters them out of its native path (they reach it as explicit copies instead)
HEADER_ORIGIN = "wsnmom-origin"
#: headers of the tap copies: where the original message was published
_TAP_EXCHANGE_HEADER = "wsnmom-tap-exchange"
_TAP_KEY_HEADER = "wsnmom-tap-key"
#: header of the tap copies: the instance that published them (its own tap skips them)
_TAP_INSTANCE_HEADER = "wsnmom-tap-instance"
#: a header no message carries: a binding on it never matches
_NEVER_HEADER = "wsnmom-tap-never"
_URL_OPTIONS = ("prefetch", "queue_type", "instance", "pull")
#: the query arguments ``pika.URLParameters`` reads (it has a setter for each)
_PIKA_URL_ARGUMENTS = tuple(
    name.removeprefix("_set_url_")
    for name in dir(pika.URLParameters)
    if name.startswith("_set_url_")
)
#: channels one bulk depth query uses at once per connection
_DEPTH_CHANNELS = 8
#: header of the primer a new subscription queue gets (``RabbitMQAdapter._prime``)
_PRIMER_HEADER = "wsnmom-primer"
#: what RabbitMQ adds to a message it dead-letters: why, and the queue it left
_DEATH_REASON = "x-first-death-reason"
_DEATH_QUEUE = "x-first-death-queue"
_DEATH_REASONS = {"expired": DROPPED_MAX_AGE, "maxlen": DROPPED_OVERFLOW}
_PRIMER_PROPERTIES = pika.BasicProperties(
    delivery_mode=pika.DeliveryMode.Persistent, expiration="0", headers={_PRIMER_HEADER: 1}
)


def _refusal(error: BaseException | None, where: str) -> MiddlewareRefused | None:
    """The permanent error for RabbitMQ refusing us (credentials, vhost, permissions),
    which no retry will change, or None when ``error`` means RabbitMQ is unreachable."""
    if error is None:
        return None
    text = f"RabbitMQ at {where} refused the connection: {describe(error)}"
    if isinstance(
        error, pika.exceptions.ProbableAuthenticationError | pika.exceptions.AuthenticationError
    ):
        return CredentialsRefused(text)
    if isinstance(error, pika.exceptions.ProbableAccessDeniedError):
        return AccessRefused(text)
    code = getattr(error, "reply_code", None)
    if code == 403:  # ACCESS_REFUSED: a login refused, or no permission
        if "login" in describe(error).lower():
            return CredentialsRefused(text)
        return AccessRefused(text)
    if code == 530:  # NOT_ALLOWED: the vhost does not exist or the user may not use it
        return AccessRefused(text)
    return None


def _busy(error: LinkBusy) -> MiddlewareBusy:
    """The adapter error for an operation a connected RabbitMQ did not answer in time."""
    return MiddlewareBusy(
        f"RabbitMQ is connected but overloaded: {error}",
        retry_after=error.retry_after,
        backlog=error.waiting,
    )


class PublishUnavailable(PublishFailed, AdapterUnavailable):
    """A publish could not even be attempted: no connection to RabbitMQ."""


_TLS_KEYS = ("ca_file", "cert_file", "key_file", "verify", "server_hostname")


def _tls(value: Any) -> dict[str, Any] | None:
    """The ``tls`` table, its keys checked and ``verify`` read by the one boolean rule."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValueError(f"must be a table of {', '.join(_TLS_KEYS)}")
    for key in value:
        if key not in _TLS_KEYS:
            raise ValueError(f"unknown key {key!r}{did_you_mean(str(key), _TLS_KEYS)}")
    tls = dict(value)
    if "verify" in tls:
        tls["verify"] = convert(tls["verify"], bool)
    return tls


@dataclass(frozen=True, slots=True)
class RabbitMQOptions:
    """The adapter's options, declared once (see the module docstring; docs/adapters/
    rabbitmq.md lists them, tested against this declaration)."""

    exchanges: Mapping[str, str] = option(
        default_factory=dict, doc="namespace URI -> exchange name"
    )
    all_exchange: str = option(
        "wsnmom.all", doc="catch-all exchange; the tap exchanges are named after it"
    )
    queue_prefix: str = option("wsnmom.sub.", doc="prefix of subscription queue names")
    queue_type: Literal["classic", "quorum"] = option("classic", doc="`classic` or `quorum`")
    queue_arguments: Mapping[str, Any] | None = option(
        None, doc="extra arguments for every subscription queue"
    )
    prefetch: int = option(64, minimum=1, doc="prefetch for consumers when core gives none")
    heartbeat: int = option(30, minimum=0, doc="AMQP heartbeat, seconds (0 disables)")
    tls: Mapping[str, Any] | None = option(
        None,
        parse=_tls,
        doc="`ca_file`, `cert_file`, `key_file`, `verify` (true), `server_hostname`",
    )
    instance: str | None = option(None, doc="name of this instance's tap queue (random)")
    current_message: bool = option(True, doc="run the current-message tap")
    current_tap_max_length: int = option(10000, minimum=0, doc="tap queue length")
    current_tap_expires: float = option(
        3600.0, minimum=0, doc="seconds an unused tap queue survives"
    )
    current_cache_size: int = option(100000, minimum=0, doc="routing keys remembered")
    current_peers: bool = option(True, doc="copy gateway publishes to the other instances' taps")
    report_unrouted: bool = option(
        True, doc="publish `mandatory`: a message no queue takes is reported as unrouted"
    )
    consumers_per_connection: int = option(
        1000, minimum=1, doc="subscriptions per consuming connection"
    )
    declare_channels: int = option(
        4, minimum=1, doc="channels per consuming connection that declare queues at once"
    )
    fail_on_nack: bool = option(False, doc="raise on `basic.nack` instead of `routed=None`")
    prime_queues: bool = option(True, doc="prime new classic subscription queues")
    operation_timeout: float = option(10.0, doc="seconds for declarations and other broker calls")
    reconnect_max_delay: float = option(5.0, doc="longest reconnect backoff, seconds")
    #: how pull points are read: "buffer" (consumed with prefetch into core's pull
    #: buffer) or "get" (``basic.get`` per GetMessages)
    pull: Literal["buffer", "get"] = option(
        "buffer", doc="how pull points are read: `buffer` or `get` (`basic.get`)"
    )

    @classmethod
    def parse(
        cls, options: Mapping[str, Any], query: Iterable[tuple[str, str]] = ()
    ) -> RabbitMQOptions:
        """Build from the URL's query arguments and the options mapping (configuration).

        :raises AdapterOptionError: an unknown option or an unusable value."""
        return parse_options(cls, adapter="RabbitMQ", query=query, options=options)


class _Delivery(Received):
    """A message taken from a subscription queue; settles on the channel it came from."""

    def __init__(
        self,
        link: Link,
        channel: Channel,
        delivery_tag: int,
        topic: Topic,
        body: bytes,
        headers: Mapping[str, str],
        content_type: str,
        redelivered: bool,
        settled: bool = False,
    ) -> None:
        self.topic = topic
        self.body = body
        self.headers = headers
        self.content_type = content_type
        self.redelivered = redelivered
        self._link = link
        self._channel = channel
        self._tag = delivery_tag
        #: settled at most once: the first ack()/nack() takes the only token (none when
        #: RabbitMQ removed the message on delivery)
        self._token = [] if settled else [True]

    def _settle(self, ack: bool, requeue: bool) -> None:
        try:
            self._token.pop()  # atomic: a second settle finds the list empty
        except IndexError:
            return
        self._link.settle(self._channel, self._tag, ack, requeue)

    def ack(self) -> None:
        self._settle(True, False)

    def nack(self, requeue: bool = True) -> None:
        self._settle(False, requeue)

    def __repr__(self) -> str:
        return f"<RabbitMQ delivery {self.topic} tag={self._tag}>"


#: why a RabbitMQ subscription cannot be peeked (``Capabilities.peek`` False)
PEEK_REFUSAL = (
    "RabbitMQ hands a queued message out only by delivering it: a basic.get followed by "
    "a requeueing nack (what the management UI's 'Get messages' does too) marks it "
    "redelivered, hides it from the subscription's consumer meanwhile and, on a quorum "
    "queue, counts a delivery against its delivery limit, so the waiting messages cannot "
    "be read without consuming them"
)


class RabbitMQSubscription(SubscriptionHandle):
    """Handle on one subscription queue.  Methods are thread-safe."""

    def __init__(self, adapter: RabbitMQAdapter, spec_: SubscriptionSpec, link: Link) -> None:
        self.name = spec_.name
        #: the consuming connection this subscription's channels live on
        self.link = link
        self.spec = spec_
        self.queue = adapter.queue_name(spec_.name)
        self._adapter = adapter
        #: bindings in place on the broker (as far as this process knows)
        self.bound: set[Binding] = set()
        self.on_message: Callable[[Received], None] | None = None
        self.prefetch = adapter.opts.prefetch
        self.consuming = False
        self.deleted = False
        self.consumer: Channel | None = None
        self.puller: Channel | None = None
        #: the queue got its primer from this process (``RabbitMQAdapter._prime``)
        self.primed = False

    def start(self, on_message: Callable[[Received], None], prefetch: int = 64) -> None:
        a = self._adapter
        self.on_message = on_message
        self.prefetch = max(1, prefetch)
        self.consuming = True
        a._run(a._start_consumer(self), link=self.link)

    def stop(self) -> None:
        self.consuming = False
        a = self._adapter
        a._run(a._stop_consumer(self), link=self.link)

    def pull(self, max_messages: int, timeout: float = 0.0) -> list[Received]:
        if max_messages <= 0:
            return []
        a = self._adapter
        if timeout <= 0:
            direct = a._pull_direct(self, max_messages)
            if direct is not None:
                return direct
        got: list[Received] = a._run(
            a._pull(self, max_messages, timeout), extra=timeout, link=self.link
        )
        return got

    def take(self, max_messages: int) -> list[Received]:
        """``basic.get`` with auto-ack: RabbitMQ removes each message as it delivers it
        (no ack frame, no unacked state); falls back to pull-and-ack while the puller
        channel is not ready."""
        if max_messages <= 0:
            return []
        a = self._adapter
        direct = a._pull_direct(self, max_messages, no_ack=True)
        if direct is not None:
            return direct
        return super().take(max_messages)

    def peek(self, max_messages: int) -> list[StoredMessage]:
        """Not possible: see :data:`PEEK_REFUSAL`."""
        raise NotImplementedError(PEEK_REFUSAL)

    def purge(self) -> int | None:
        """``queue.purge``: RabbitMQ drops every ready message (unacknowledged ones
        stay) and says how many."""
        a = self._adapter
        purged: int = a._run(a._purge(self.queue, self.link), link=self.link)
        return purged

    def depth(self) -> int | None:
        a = self._adapter
        try:
            depth: int = a._run(a._depth(self.queue, self.link), link=self.link)
            return depth
        except (AdapterUnavailable, MiddlewareBusy):
            return None

    def delete(self) -> None:
        a = self._adapter
        self.consuming = False
        self.deleted = True
        a._forget(self)
        a._run(a._delete_queue(self.queue, self), link=self.link)

    def __repr__(self) -> str:
        return f"<RabbitMQSubscription {self.name} queue={self.queue}>"


class _Stale(Exception):
    """The publishing channel changed between encoding a batch and writing it."""


class _Batch:
    """The messages of one ``publish_many`` call waiting for their confirms: one future
    for the whole batch instead of one per message (an asyncio future when a coroutine
    on the loop waits, a :class:`Completion` when the publishing thread does)."""

    __slots__ = ("future", "receipts", "remaining")

    def __init__(
        self, future: asyncio.Future[None] | Completion, size: int, receipt: PublishReceipt
    ) -> None:
        self.future = future
        #: each message's receipt: ``receipt`` unless a return or nack says otherwise
        self.receipts: list[PublishReceipt] = [receipt] * size
        #: confirms still to come (messages and their peer copies)
        self.remaining = 0

    def confirmed(self) -> None:
        self.remaining -= 1
        if self.remaining <= 0 and not self.future.done():
            self.future.set_result(None)

    def fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)


@dataclass(slots=True)
class _Pending:
    """A publish waiting for its confirm: message ``index`` of ``batch`` (-1: a peer copy,
    whose receipt is not reported)."""

    batch: _Batch
    index: int
    exchange: str
    routing_key: str
    message_id: str


_ROUTED = PublishReceipt(routed=True)
_UNROUTED = PublishReceipt(routed=False)
#: without ``mandatory`` (``report_unrouted = false``) the broker does not tell
_UNKNOWN = PublishReceipt(routed=None)
_NACKED = PublishReceipt(routed=None)
#: entries kept in the topic -> (exchange, routing key) memo
_NAME_CACHE_SIZE = 10000


class RabbitMQAdapter(Adapter):
    """WS-N subscriptions on RabbitMQ queues, topics on topic exchanges (pika)."""

    name = "rabbitmq"
    schemes = ("amqp", "amqps", "rabbitmq")
    extra = "rabbitmq"
    capabilities = Capabilities(
        syntax=RABBITMQ,
        ack_mode="per_message",
        durable_subscriptions=True,
        # pull points are consumed into core's pull buffer (option pull = "buffer"); an
        # instance with pull = "get" declares native_pull (see __init__)
        native_pull=False,
        retained_current_message=True,
        native_headers=True,
        native_queue_limits=True,
        ordering="subscription",
        competing_consumers=True,
        max_message_bytes=MAX_MESSAGE_BYTES,
        native_dead_letters=True,
    )

    declared_options = RabbitMQOptions
    #: several instances on one store: every instance takes a pull point's messages from
    #: its queue (``basic.get``), none holds them in its own buffer
    cluster_options: ClassVar[Mapping[str, Any]] = {"pull": "get"}

    def __init__(self, url: str, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(url, options)
        pika_url, from_url = self._split_url(url)
        self.opts = RabbitMQOptions.parse(self.options, from_url)
        if self.opts.pull == "get":
            self.capabilities = replace(type(self).capabilities, native_pull=True)
        #: a confirmed publish's receipt unless the broker returns or nacks it
        self._receipt = _ROUTED if self.opts.report_unrouted else _UNKNOWN
        #: topic <-> exchange and routing key (shared with the Spark bridge's tap)
        self.names = RabbitMQNames(self.opts.exchanges, self.opts.all_exchange)
        self.roots = self.names.roots
        self.parameters = self._parameters(pika_url)
        self.instance = self.opts.instance or uuid.uuid4().hex[:12]
        self.tap_queue = f"wsnmom.current.{self.instance}"
        self._lock = threading.Lock()
        self._subs: dict[str, RabbitMQSubscription] = {}
        #: serialises opening further consuming connections
        self._pool_lock = threading.Lock()
        self._closed = False
        self._opened = False
        # loop-thread state (consumer link)
        self._declared: dict[str, set[str]] = {"consumer": set(), "publisher": set()}
        self._tap: Channel | None = None
        self._barriers: dict[str, asyncio.Future[None]] = {}
        self._current: OrderedDict[Binding, StoredMessage] = OrderedDict()
        self._current_lock = threading.Lock()
        # loop-thread state (publisher link)
        self._pub: Channel | None = None
        self._pub_tag = 0
        #: publishes waiting for their confirm, by delivery tag (in tag order)
        self._pending: OrderedDict[int, _Pending] = OrderedDict()
        #: basic.return counts by (exchange, routing key, message id), until the confirm
        self._returned: dict[tuple[str, str, str], int] = {}
        self._frames: PublishFrames | None = None
        #: guards _pending and _pub_tag: publishing threads number and register their
        #: publishes while the loop settles confirms (taken before the connection's
        #: write lock, never after it)
        self._pub_lock = threading.RLock()
        #: memo of _target
        self._targets: dict[Topic, tuple[str, str, bool]] = {}
        self._consumer = Link(
            "consumer",
            self.parameters,
            self._on_consumer_connected,
            self._on_consumer_lost,
            max_delay=self.opts.reconnect_max_delay,
            declare_channels=self.opts.declare_channels,
        )
        #: consuming connections (the first is ``_consumer``, which also runs the tap)
        self._links: list[Link] = [self._consumer]
        #: subscriptions assigned to each consuming connection, by link name
        self._load: dict[str, int] = {self._consumer.name: 0}
        self._publisher = Link(
            "publisher",
            self.parameters,
            self._on_publisher_connected,
            self._on_publisher_lost,
            max_delay=self.opts.reconnect_max_delay,
        )

    # --- construction helpers -------------------------------------------------------

    @staticmethod
    def _split_url(url: str) -> tuple[str, list[tuple[str, str]]]:
        """The URL pika should see (amqp/amqps) and the wsnmom options in its query."""
        parts = urlsplit(url)
        scheme = "amqp" if parts.scheme == "rabbitmq" else parts.scheme
        query = parse_qsl(parts.query, keep_blank_values=True)
        ours = [(k, v) for k, v in query if k in _URL_OPTIONS]
        theirs = [(k, v) for k, v in query if k not in _URL_OPTIONS]
        for key, value in theirs:
            if key not in _PIKA_URL_ARGUMENTS:
                raise AdapterOptionError(
                    f"unknown RabbitMQ URL argument ?{key}={value}"
                    f"{did_you_mean(key, (*_URL_OPTIONS, *_PIKA_URL_ARGUMENTS))}"
                )
        return urlunsplit((scheme, parts.netloc, parts.path, urlencode(theirs), "")), ours

    def _parameters(self, url: str) -> pika.URLParameters:
        params = pika.URLParameters(url)
        if "heartbeat" not in urlsplit(url).query:
            params.heartbeat = self.opts.heartbeat
        params.client_properties = {"connection_name": f"wsnmom {self.name}"}
        if self.opts.tls is not None:
            params.ssl_options = self._ssl_options(params.host, self.opts.tls)
        elif url.startswith("amqps") and "ssl_options" not in urlsplit(url).query:
            params.ssl_options = self._ssl_options(params.host, {})
        return params

    @staticmethod
    def _ssl_options(host: str, tls: Mapping[str, Any]) -> pika.SSLOptions:
        context = ssl.create_default_context(cafile=tls.get("ca_file"))
        if tls.get("cert_file"):
            context.load_cert_chain(tls["cert_file"], tls.get("key_file"))
        if not tls.get("verify", True):
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return pika.SSLOptions(context, tls.get("server_hostname") or host)

    def queue_name(self, subscription: str) -> str:
        """The queue that backs the durable subscription ``subscription``."""
        return self.opts.queue_prefix + subscription

    def queue_arguments(
        self, limits: QueueLimits, dead_letters: Binding | None = None
    ) -> dict[str, Any]:
        """Queue arguments for ``limits`` (plus the configured type and extras), with
        ``dead_letters`` (exchange, routing key) as the queue's dead-letter exchange: what
        the queue drops for its TTL or length goes there (``reject-publish-dlx`` rather than
        ``reject-publish`` for DROP_NEWEST, so a refused message goes there too)."""
        args: dict[str, Any] = {"x-queue-type": self.opts.queue_type}
        args.update(self.opts.queue_arguments or {})
        if dead_letters is not None:
            args["x-dead-letter-exchange"], args["x-dead-letter-routing-key"] = dead_letters
        if limits.max_messages is not None:
            args["x-max-length"] = int(limits.max_messages)
        if limits.max_bytes is not None:
            args["x-max-length-bytes"] = int(limits.max_bytes)
        if limits.max_messages is not None or limits.max_bytes is not None:
            newest = "reject-publish-dlx" if dead_letters is not None else "reject-publish"
            args["x-overflow"] = newest if limits.overflow is Overflow.DROP_NEWEST else "drop-head"
        if limits.max_age is not None:
            args["x-message-ttl"] = max(0, int(limits.max_age.total_seconds() * 1000))
        return args

    # --- topic names ----------------------------------------------------------------

    def exchange_for(self, namespace: str) -> str:
        """Exchange of a topic namespace (configured or derived)."""
        return self.names.exchange_for(namespace)

    def native_name(self, topic: Topic) -> tuple[str, str]:
        """(exchange, routing key) of ``topic``; NameNotRepresentable when it has none."""
        return self.names.native_name(topic)

    def bindings_for(self, patterns: Sequence[PathPattern] | None) -> list[Binding]:
        """(exchange, binding key) pairs for a subscription's patterns."""
        return self.names.bindings_for(patterns)

    def topic_of(self, exchange: str, routing_key: str, headers: Mapping[str, str]) -> Topic:
        """Topic of a delivered message (``RabbitMQNames.topic_of``)."""
        return self.names.topic_of(exchange, routing_key, headers)

    # --- lifecycle ------------------------------------------------------------------

    def open(self) -> None:
        """Connect (both connections up within ``operation_timeout``).

        When RabbitMQ cannot be reached, raises ``AdapterUnavailable`` and keeps trying in
        the background: a later ``open()`` waits again, and ``available()`` turns True
        once connected.  Refused credentials or an unknown vhost are not retried: they
        raise ``AdapterError`` and the adapter is closed."""
        if self._closed:
            raise AdapterUnavailable("a closed RabbitMQ adapter cannot be opened again")
        wait = self.opts.operation_timeout
        if not self._opened:
            self._opened = True
            self._consumer.start(wait)
            self._publisher.start(wait)
        deadline = time.monotonic() + wait
        while not self.available():
            error = self._consumer.last_error or self._publisher.last_error
            refusal = _refusal(error, self._safe_url)
            if refusal is not None:
                self.close()
                raise refusal
            if time.monotonic() >= deadline:
                raise AdapterUnavailable(
                    f"cannot connect to RabbitMQ at {self._safe_url}: {describe(error)} "
                    "(still trying)"
                )
            time.sleep(0.05)

    def available(self) -> bool:
        """Both the publishing and every consuming connection are up."""
        if not self._opened or self._closed or not self._publisher.is_up:
            return False
        with self._lock:
            links = list(self._links)
        return all(link.is_up for link in links)

    @property
    def _safe_url(self) -> str:
        p = self.parameters
        return f"{'amqps' if p.ssl_options else 'amqp'}://{p.host}:{p.port}/{p.virtual_host}"

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._publisher.close()
        with self._lock:
            links = list(self._links)
        for link in links:
            link.close()

    def stats(self) -> Mapping[str, int]:
        """Counts for tests: consuming connections, subscriptions, the most declaration
        channels one connection used at once, and the acks/nacks other threads settled,
        the loop wake-ups they asked for and the socket writes that carried them (summed
        over the consuming connections; see ``Link.settle``)."""
        with self._lock:
            links = list(self._links)
            subscriptions = len(self._subs)
        return {
            "connections": len(links),
            "subscriptions": subscriptions,
            "declare_peak": max((ln.declare_peak for ln in links), default=0),
            "settles": sum(ln.settles_queued for ln in links),
            "settle_wakeups": sum(ln.settle_wakeups for ln in links),
            "settle_writes": sum(ln.settle_flushes for ln in links),
        }

    def ping(self, timeout: float = 1.0) -> bool:
        with self._lock:
            links = list(self._links)
        if self._closed or not (self._publisher.is_up and all(ln.is_up for ln in links)):
            return False
        try:
            self._consumer.submit(self._ping(), timeout)
        except Exception:
            return False
        return True

    async def _ping(self) -> None:
        async with self._consumer.declaring() as admin:
            # a round trip that cannot fail for topology reasons
            await admin.call("basic_qos", prefetch_count=0)

    def _run(self, coro: Any, extra: float = 0.0, link: Link | None = None) -> Any:
        """Run a coroutine on a consuming link (default: the first one).

        Failures become adapter errors, so that core answers with a WS-N fault instead of
        an internal error: no connection or no answer -> AdapterUnavailable, a channel the
        broker closed -> AdapterUnavailable, anything else pika or the adapter raises
        (``NoFreeChannels``, a connection closed under the call) -> AdapterError.
        """
        target = link or self._consumer
        try:
            return target.submit(coro, self.opts.operation_timeout + extra)
        except AdapterError:
            raise
        except LinkBusy as exc:
            raise _busy(exc) from exc
        except (LinkDown, TimeoutError) as exc:
            raise AdapterUnavailable(str(exc)) from exc
        except ChannelError as exc:
            raise AdapterUnavailable(f"RabbitMQ refused: {exc}") from exc
        except Exception as exc:
            log.warning("RabbitMQ operation failed: %r", exc)
            raise AdapterError(f"RabbitMQ operation failed: {describe(exc)}") from exc

    # --- declarations (run on either link's loop) ------------------------------------

    async def _ensure_exchange(self, link: Link, exchange: str, internal: bool = False) -> None:
        """Declare ``exchange`` if absent (used as it is if present) and bind it to the
        catch-all exchange -- unless it is the exchange of an ``internal`` namespace, which
        is kept (and, if an older version bound it, taken) out of the catch-all; once per
        connection."""
        declared = self._declared.setdefault(link.name, set())
        if exchange in declared:
            return
        if exchange == "":
            declared.add(exchange)  # the default exchange: nothing to declare or bind
            return
        all_exchange = self.opts.all_exchange
        if exchange != all_exchange and all_exchange not in declared:
            await self._ensure_exchange(link, all_exchange)
        async with link.declaring() as admin:
            try:
                await admin.call("exchange_declare", exchange, passive=True)
            except ChannelError as exc:
                if exc.code != NOT_FOUND:
                    raise
                await admin.call("exchange_declare", exchange, exchange_type="topic", durable=True)
                log.info("declared topic exchange %r", exchange)
            if exchange != all_exchange:
                # exchange.unbind of a missing binding is a no-op in RabbitMQ
                await admin.call(
                    "exchange_unbind" if internal else "exchange_bind",
                    destination=all_exchange,
                    source=exchange,
                    routing_key="#",
                )
        declared.add(exchange)

    async def _declare_queue(self, admin: Declarer, queue: str, args: dict[str, Any]) -> int | None:
        """Declare a durable queue; on an argument mismatch re-create it if it is empty
        and unused, else keep the existing queue (and its arguments) with a warning.

        Returns the number of messages the queue holds (None when it was kept with other
        arguments)."""
        try:
            frame = await admin.call("queue_declare", queue, durable=True, arguments=args)
            return int(frame.method.message_count)
        except ChannelError as exc:
            if exc.code != PRECONDITION_FAILED:
                raise
            mismatch = exc.text
        try:
            await admin.call("queue_delete", queue, if_unused=True, if_empty=True)
        except ChannelError as exc:
            if exc.code not in (PRECONDITION_FAILED, RESOURCE_LOCKED):
                raise
            await admin.call("queue_declare", queue, passive=True)
            log.warning(
                "queue %r exists with other arguments and holds messages or consumers; "
                "it keeps its arguments (%s)",
                queue,
                mismatch,
            )
            return None
        frame = await admin.call("queue_declare", queue, durable=True, arguments=args)
        log.info("queue %r re-created with new arguments %s", queue, args)
        return int(frame.method.message_count)

    def _primes(self, args: Mapping[str, Any]) -> bool:
        """Whether queues declared with ``args`` get a primer (see :meth:`_prime`)."""
        # a primer dead-lettered to the gateway's own dead-letter destination reaches only
        # the gateway, which acks it silently; an operator's dead-letter exchange would
        # hand it to others
        return (
            self.opts.prime_queues
            and args.get("x-queue-type", "classic") == "classic"
            and "x-dead-letter-exchange" not in (self.opts.queue_arguments or {})
        )

    async def _prime(self, admin: Declarer, queue: str) -> None:
        """Make the broker create a new classic queue's files now rather than on its first
        real message.

        RabbitMQ creates a classic queue's directory and index journal (and fsyncs them)
        lazily, with the first persistent message.  That costs ~1.3 ms of broker I/O per
        queue; a Notify to thousands of new subscriptions pays it for all of them before
        the publish is confirmed (13 s for 10,000 here, beyond core's publish timeout).
        The primer is a persistent, empty message that expires at once (``expiration``
        0): the broker writes it, which creates the files, and drops it.  Nobody waits
        for it.  A consumer that happens to get it before it expires never sees it: the
        adapter acks primers silently (:meth:`_delivery`).
        """
        (await admin.channel()).pika.basic_publish("", queue, b"", _PRIMER_PROPERTIES)

    def _internal_exchanges(self, namespaces: Iterable[str]) -> set[str]:
        """Exchanges of the internal namespaces among ``namespaces``."""
        return {self.exchange_for(ns) for ns in namespaces if is_internal_namespace(ns)}

    async def _declare_subscription(self, sub: RabbitMQSubscription) -> None:
        link = sub.link
        bindings = self.bindings_for(sub.spec.patterns)
        internal = self._internal_exchanges(p.namespace for p in sub.spec.patterns or ())
        for exchange in dict.fromkeys(ex for ex, _ in bindings):
            await self._ensure_exchange(link, exchange, exchange in internal)
        dead_letters: Binding | None = None
        if sub.spec.dead_letters is not None:
            dead_letters = self.names.native_name(sub.spec.dead_letters)
            await self._ensure_exchange(link, dead_letters[0], True)
        args = self.queue_arguments(sub.spec.limits, dead_letters)
        wanted = set(bindings)
        # one declaration channel for the queue, its primer and its bindings, in order;
        # other subscriptions of this connection declare on the other channels meanwhile
        async with link.declaring() as admin:
            depth = await self._declare_queue(admin, sub.queue, args)
            if depth == 0 and not sub.primed and self._primes(args):
                await self._prime(admin, sub.queue)
                sub.primed = True
            for exchange, key in sorted(sub.bound - wanted):
                await admin.call("queue_unbind", sub.queue, exchange, key)
            for exchange, key in bindings:
                await admin.call("queue_bind", sub.queue, exchange, key)
        sub.bound = wanted

    # --- consumer link --------------------------------------------------------------

    async def _on_consumer_connected(self, link: Link) -> None:
        self._declared[link.name] = set()
        primary = link is self._consumer
        if primary:
            self._tap = None
        await self._ensure_exchange(link, self.opts.all_exchange)
        for namespace in self.opts.exchanges:
            await self._ensure_exchange(
                link, self.exchange_for(namespace), is_internal_namespace(namespace)
            )
        if primary and self.opts.current_message:
            await self._start_tap(link)
        with self._lock:
            subs = [s for s in self._subs.values() if not s.deleted and s.link is link]
        for sub in subs:
            sub.consumer = None
            sub.puller = None
            try:
                await self._declare_subscription(sub)
                if sub.consuming:
                    await self._start_consumer(sub, ready=False)
            except ChannelError as exc:
                # one broken subscription must not keep the others from resuming
                log.error("cannot restore subscription queue %s: %s", sub.queue, exc)

    def _on_consumer_lost(self, link: Link, reason: BaseException | None) -> None:
        if link is not self._consumer:
            return
        self._tap = None
        for fut in self._barriers.values():
            if not fut.done():
                fut.set_result(None)
        self._barriers.clear()

    def subscription(self, spec: SubscriptionSpec) -> SubscriptionHandle:
        with self._lock:
            sub = self._subs.get(spec.name)
            if sub is not None and not sub.deleted:
                sub.spec = spec
            else:
                sub = None
        if sub is None:
            link = self._reserve_link()
            with self._lock:
                sub = self._subs.get(spec.name)
                if sub is not None and not sub.deleted:  # created concurrently
                    self._load[link.name] -= 1
                    sub.spec = spec
                else:
                    sub = RabbitMQSubscription(self, spec, link)
                    self._subs[spec.name] = sub
        self._run(self._declare_for(sub), link=sub.link)
        return sub

    def _capacity(self) -> int:
        """Subscriptions per consuming connection: the option, lowered so that a
        subscription's two channels (consumer, puller) plus the declaration and tap
        channels fit the channel limit negotiated with the broker."""
        per = self.opts.consumers_per_connection
        conn = self._consumer.connection
        channel_max = int(getattr(getattr(conn, "params", None), "channel_max", 0) or 0)
        if channel_max > 0:
            reserved = 2 + self.opts.declare_channels
            per = min(per, max(1, (channel_max - reserved) // 2))
        return per

    def _reserve_link(self) -> Link:
        """A consuming connection with room for one more subscription (counted as taken);
        opens another connection when all are full."""
        per = self._capacity()
        with self._pool_lock:
            with self._lock:
                for link in self._links:
                    if self._load[link.name] < per:
                        self._load[link.name] += 1
                        return link
                name = f"consumer-{len(self._links)}"
            if self._closed:
                raise AdapterUnavailable("the RabbitMQ adapter is closed")
            link = Link(
                name,
                self.parameters,
                self._on_consumer_connected,
                self._on_consumer_lost,
                max_delay=self.opts.reconnect_max_delay,
                declare_channels=self.opts.declare_channels,
            )
            if not link.start(self.opts.operation_timeout):
                error = link.last_error
                link.close()
                raise AdapterUnavailable(
                    f"cannot open another consuming connection: {describe(error)}"
                )
            log.info("opened consuming connection %s (%d subscriptions each)", name, per)
            with self._lock:
                self._links.append(link)
                self._load[name] = 1
            return link

    async def _declare_for(self, sub: RabbitMQSubscription) -> None:
        await sub.link.ready(self.opts.operation_timeout)
        await self._declare_subscription(sub)

    def _forget(self, sub: RabbitMQSubscription) -> None:
        with self._lock:
            if self._subs.get(sub.name) is sub:
                del self._subs[sub.name]
                self._load[sub.link.name] -= 1

    def delete_subscription(self, name: str) -> None:
        with self._lock:
            sub = self._subs.get(name)
        if sub is not None:
            sub.delete()
        else:
            self._run(self._delete_queue(self.queue_name(name), None))

    async def _delete_queue(self, queue: str, sub: RabbitMQSubscription | None) -> None:
        link = sub.link if sub is not None else self._consumer
        await link.ready(self.opts.operation_timeout)
        if sub is not None:
            await self._stop_consumer(sub)
            if sub.puller is not None:
                await sub.puller.close()
                sub.puller = None
        async with link.declaring() as admin:
            await admin.call("queue_delete", queue)

    async def _start_consumer(self, sub: RabbitMQSubscription, ready: bool = True) -> None:
        link = sub.link
        if ready:
            await link.ready(self.opts.operation_timeout)
        if (sub.consumer is not None and sub.consumer.is_open) or not sub.consuming:
            return
        ch = await link.open_channel()
        await ch.call("basic_qos", prefetch_count=sub.prefetch)
        generation = link.generation

        def on_message(_ch: Any, method: Any, properties: Any, body: bytes) -> None:
            self._dispatch(sub, ch, method, properties, body)

        def on_close(closed: Channel, reason: BaseException) -> None:
            # Closed by the broker while the connection stays up (queue deleted
            # elsewhere, an ack for an unknown tag): consume again shortly.
            if sub.consumer is closed:
                sub.consumer = None
            conn = link.connection
            if (
                sub.consuming
                and not sub.deleted
                and conn is not None
                and conn.is_open
                and link.generation == generation
            ):
                log.warning("consumer channel of %s closed (%s); restarting", sub.queue, reason)
                link.loop.call_later(0.5, lambda: link.loop.create_task(self._restart(sub)))

        ch.add_close_listener(on_close)
        # deliveries are read straight from the wire; pika's consumer callback is the
        # fallback
        ch.read(FrameReader(on_deliver=lambda m, p, b: self._dispatch(sub, ch, m, p, b)))
        await ch.call("basic_consume", sub.queue, on_message, auto_ack=False)
        sub.consumer = ch

    async def _restart(self, sub: RabbitMQSubscription) -> None:
        try:
            await self._declare_subscription(sub)
            await self._start_consumer(sub, ready=False)
        except Exception as exc:
            log.warning("cannot restart consumer of %s: %s", sub.queue, exc)

    async def _stop_consumer(self, sub: RabbitMQSubscription) -> None:
        ch = sub.consumer
        sub.consumer = None
        if ch is not None:
            # closing the channel also requeues what was delivered but not settled
            await ch.close()

    def _dispatch(
        self,
        sub: RabbitMQSubscription,
        ch: Channel,
        method: Any,
        properties: Any,
        body: bytes,
    ) -> None:
        delivery = self._delivery(ch, method, properties, body)
        if delivery is None:
            return
        callback = sub.on_message
        if callback is None:
            delivery.nack(requeue=True)
            return
        try:
            callback(delivery)
        except Exception:
            log.exception("on_message callback failed for %s; message requeued", sub.queue)
            delivery.nack(requeue=True)

    def _delivery(
        self, ch: Channel, method: Any, properties: Any, body: bytes, *, no_ack: bool = False
    ) -> _Delivery | None:
        """The Received for a delivery, or None (settled here) for a queue primer or a
        message without a representable topic; ``no_ack``: RabbitMQ already removed it."""
        headers = headers_of(properties)
        if _PRIMER_HEADER in headers:
            if not no_ack:  # a queue primer (see _prime), not a message
                ch.pika.basic_ack(method.delivery_tag)
            return None
        if _DEATH_REASON in headers and HEADER_DROPPED_REASON not in headers:
            headers = self._dropped(headers, properties)
        try:
            topic = self.topic_of(method.exchange, method.routing_key, headers)
        except NameNotRepresentable as exc:
            # Nothing a WS-N consumer could be told about; do not redeliver it forever.
            log.warning("dropping message without a topic: %s", exc)
            if not no_ack:
                ch.pika.basic_nack(method.delivery_tag, requeue=False)
            return None
        return _Delivery(
            ch.link,
            ch,
            method.delivery_tag,
            topic,
            body,
            headers,
            properties.content_type or "application/octet-stream",
            bool(method.redelivered),
            settled=no_ack,
        )

    def _dropped(self, headers: Mapping[str, str], properties: Any = None) -> dict[str, str]:
        """``headers`` of a message RabbitMQ dead-lettered, with ``HEADER_DROPPED_REASON``
        (``expired``: max-age, ``maxlen``: overflow, RabbitMQ's word otherwise),
        ``HEADER_DROPPED_FROM`` (the subscription whose queue it left) and
        ``HEADER_DROPPED_AT`` (the time of its first ``x-death`` entry, when it has one)."""
        out = dict(headers)
        deaths = (getattr(properties, "headers", None) or {}).get("x-death")
        if isinstance(deaths, list) and deaths and isinstance(deaths[-1], dict):
            # entries are newest first: the last one is the first death
            when = deaths[-1].get("time")
            if isinstance(when, datetime):
                stamp = when if when.tzinfo is not None else when.replace(tzinfo=UTC)
                out[HEADER_DROPPED_AT] = stamp.isoformat()
        reason = headers[_DEATH_REASON]
        out[HEADER_DROPPED_REASON] = _DEATH_REASONS.get(reason, reason)
        queue = headers.get(_DEATH_QUEUE, "")
        prefix = self.opts.queue_prefix
        out[HEADER_DROPPED_FROM] = queue[len(prefix) :] if queue.startswith(prefix) else queue
        return out

    async def _pull(
        self, sub: RabbitMQSubscription, max_messages: int, timeout: float
    ) -> list[Received]:
        link = sub.link
        await link.ready(self.opts.operation_timeout)
        if sub.puller is None or not sub.puller.is_open:
            sub.puller = await link.open_channel()
            sub.puller.start_fast_get()
        ch = sub.puller
        deadline = time.monotonic() + max(0.0, timeout)
        out: list[Received] = []
        while len(out) < max_messages:
            got = await ch.get(sub.queue)
            if got is None:
                if out or time.monotonic() >= deadline:
                    break
                await asyncio.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
                continue
            method, properties, body = got
            delivery = self._delivery(ch, method, properties, body)
            if delivery is not None:
                out.append(delivery)
            if out and not method.message_count:
                break  # the queue had nothing behind it: spare the basic.get-empty trip
        return out

    def _pull_direct(
        self, sub: RabbitMQSubscription, max_messages: int, *, no_ack: bool = False
    ) -> list[Received] | None:
        """``pull`` without waiting (GetMessages) and without a coroutine: the gets are
        chained by their replies on the loop thread; the caller waits for the last.  None
        when the puller channel is not ready (then :meth:`_pull` runs).  ``no_ack``: the
        messages are removed on delivery (``take``)."""
        link, ch = sub.link, sub.puller
        if not link.is_up or ch is None or not ch.fast_get or not ch.is_open:
            return None
        queue = sub.queue
        out: list[Received] = []
        done = Completion()

        def reply(result: GetReply) -> None:
            if done.done():
                return
            if isinstance(result, BaseException):
                done.set_exception(result)
                return
            if result is not None:
                method, properties, body = result
                delivery = self._delivery(ch, method, properties, body, no_ack=no_ack)
                if delivery is not None:
                    out.append(delivery)
                # stop when full, or when the queue had nothing behind this message
                if len(out) < max_messages and (method.message_count or not out):
                    ch.request_get(queue, reply, no_ack=no_ack)
                    return
            done.set_result(None)

        def first() -> None:
            ch.request_get(queue, reply, no_ack=no_ack)

        try:
            link.loop.call_soon_threadsafe(first)
        except RuntimeError:
            return None
        timeout = self.opts.operation_timeout
        link.backlog.begin()
        completed = False
        try:
            done.result(timeout)
            completed = True
        except TimeoutError:
            # what was taken meanwhile goes back to the queue with the channel
            link.loop.call_soon_threadsafe(lambda: link.loop.create_task(ch.close()))
            error = link.timed_out(timeout)
            if isinstance(error, LinkBusy):
                raise _busy(error) from None
            raise AdapterUnavailable(str(error)) from None
        except ChannelError as exc:
            raise AdapterUnavailable(f"RabbitMQ refused: {exc}") from exc
        finally:
            link.backlog.end(completed=completed)
        return out

    def depths(self, handles: Sequence[SubscriptionHandle]) -> list[int | None]:
        """Depths of many subscription queues: per consuming connection one call onto its
        I/O thread, which asks for all its queues concurrently over a few channels
        (AMQP has no bulk query; ``queue.declare`` passive answers one queue)."""
        out: list[int | None] = [None] * len(handles)
        by_link: dict[str, tuple[Link, list[tuple[int, str]]]] = {}
        for i, handle in enumerate(handles):
            if isinstance(handle, RabbitMQSubscription):
                if not handle.deleted:
                    entry = by_link.setdefault(handle.link.name, (handle.link, []))
                    entry[1].append((i, handle.queue))
            else:
                out[i] = handle.depth()
        for link, items in by_link.values():
            queues = [q for _, q in items]
            try:
                counts: list[int | None] = self._run(
                    self._depths(link, queues), extra=len(queues) * 0.01, link=link
                )
            except AdapterError:
                continue
            for (i, _), count in zip(items, counts, strict=True):
                out[i] = count
        return out

    async def _depths(self, link: Link, queues: Sequence[str]) -> list[int | None]:
        """Passive declares of ``queues`` on up to ``_DEPTH_CHANNELS`` channels at once;
        None for a queue that is gone (its channel is replaced)."""
        await link.ready(self.opts.operation_timeout)
        results: list[int | None] = [None] * len(queues)
        pending = iter(range(len(queues)))

        async def worker() -> None:
            channel: Channel | None = None
            try:
                for i in pending:
                    if channel is None or not channel.is_open:
                        channel = await link.open_channel()
                    try:
                        frame = await channel.call("queue_declare", queues[i], passive=True)
                        results[i] = int(frame.method.message_count)
                    except ChannelError:
                        results[i] = None  # deleted meanwhile: the broker closed the channel
            finally:
                if channel is not None and channel.is_open:
                    await channel.close()

        width = min(_DEPTH_CHANNELS, len(queues))
        await asyncio.gather(*(worker() for _ in range(width)))
        return results

    async def _purge(self, queue: str, link: Link) -> int:
        await link.ready(self.opts.operation_timeout)
        async with link.declaring() as admin:
            frame = await admin.call("queue_purge", queue)
        return int(frame.method.message_count)

    async def _depth(self, queue: str, link: Link) -> int:
        await link.ready(self.opts.operation_timeout)
        async with link.declaring() as admin:
            frame = await admin.call("queue_declare", queue, passive=True)
        return int(frame.method.message_count)

    # --- current message tap ---------------------------------------------------------

    @property
    def tap_exchanges(self) -> tuple[str, str, str]:
        """(headers filter, native fanout, drop) exchanges of the current-message tap."""
        base = self.opts.all_exchange
        return f"{base}.tap", f"{base}.tap.native", f"{base}.tap.drop"

    @property
    def peer_exchanges(self) -> tuple[str, str, str, str]:
        """Exchanges that carry gateway copies to the *other* instances' tap queues:
        (shared fanout, this instance's headers filter, own-copy sink, inlet fanout)."""
        base, me = self.opts.all_exchange, self.instance
        return (
            f"{base}.tap.peers",
            f"{base}.tap.from.{me}",
            f"{base}.tap.own.{me}",
            f"{base}.tap.in.{me}",
        )

    async def _start_peer_tap(self, admin: Declarer) -> None:
        """Let the gateway copies of other instances, but not this instance's own, reach
        this instance's tap queue.

        ``<all>.tap.peers`` (fanout, shared) -> ``<all>.tap.from.<me>`` (headers,
        alternate exchange ``<all>.tap.in.<me>``, a fanout bound to the tap queue).  A copy
        whose ``wsnmom-tap-instance`` is this instance matches the filter's one binding, to
        ``<all>.tap.own.<me>``, whose only binding to the tap queue never matches: the copy
        is dropped by the broker.  Every other copy is unroutable at the filter and goes
        to the alternate exchange, so into the tap queue.  The three per-instance exchanges
        are auto-delete and bound, directly or in a chain, only to the tap queue: when the
        tap queue expires they go away with it.
        """
        peers_x, from_x, own_x, in_x = self.peer_exchanges
        await admin.call("exchange_declare", peers_x, exchange_type="fanout", durable=True)
        await admin.call("exchange_declare", in_x, exchange_type="fanout", auto_delete=True)
        await admin.call("queue_bind", self.tap_queue, in_x, "")
        await admin.call("exchange_declare", own_x, exchange_type="headers", auto_delete=True)
        await admin.call(
            "queue_bind",
            self.tap_queue,
            own_x,
            "",
            arguments={"x-match": "all", _NEVER_HEADER: "never"},
        )
        await admin.call(
            "exchange_declare",
            from_x,
            exchange_type="headers",
            auto_delete=True,
            arguments={"alternate-exchange": in_x},
        )
        await admin.call(
            "exchange_bind",
            destination=own_x,
            source=from_x,
            routing_key="",
            arguments={"x-match": "all", _TAP_INSTANCE_HEADER: self.instance},
        )
        await admin.call("exchange_bind", destination=from_x, source=peers_x, routing_key="")

    async def _start_tap(self, link: Link) -> None:
        """Declare the tap topology (shared by all gateway instances) and consume this
        instance's tap queue.

        ``<all>`` -> ``<all>.tap`` (headers exchange, alternate exchange
        ``<all>.tap.native``) -> ``<all>.tap.drop`` (no bindings) for messages carrying
        ``wsnmom-origin: gateway``; everything else is unroutable there and goes to the
        alternate exchange, a fanout every instance's tap queue is bound to.  So the tap
        never counts as a route for the gateway's own (mandatory) publishes.  Those update
        this instance's map directly when confirmed, and reach the other instances' taps
        as explicit copies (see :meth:`_start_peer_tap`).
        """
        filter_x, native_x, drop_x = self.tap_exchanges
        args = {
            "x-queue-type": "classic",
            "x-max-length": self.opts.current_tap_max_length,
            "x-overflow": "drop-head",
            "x-expires": int(self.opts.current_tap_expires * 1000),
        }
        async with link.declaring() as admin:
            await admin.call("exchange_declare", native_x, exchange_type="fanout", durable=True)
            await admin.call("exchange_declare", drop_x, exchange_type="fanout", durable=True)
            await admin.call(
                "exchange_declare",
                filter_x,
                exchange_type="headers",
                durable=True,
                arguments={"alternate-exchange": native_x},
            )
            await admin.call(
                "exchange_bind",
                destination=drop_x,
                source=filter_x,
                routing_key="",
                arguments={"x-match": "any", HEADER_ORIGIN: "gateway"},
            )
            await admin.call(
                "exchange_bind",
                destination=filter_x,
                source=self.opts.all_exchange,
                routing_key="#",
            )
            await admin.call("queue_declare", self.tap_queue, durable=False, arguments=args)
            await admin.call("queue_bind", self.tap_queue, native_x, "")
            await self._start_peer_tap(admin)
        ch = await link.open_channel()

        def on_message(_ch: Any, method: Any, properties: Any, body: bytes) -> None:
            self._on_tap(method, properties, body)

        ch.read(FrameReader(on_deliver=lambda m, p, b: self._on_tap(m, p, b)))
        await ch.call("basic_consume", self.tap_queue, on_message, auto_ack=True)
        self._tap = ch

    def _on_tap(self, method: Any, properties: Any, body: bytes) -> None:
        headers = headers_of(properties)
        barrier = headers.get(_BARRIER_HEADER)
        if barrier is not None and method.exchange == "":
            fut = self._barriers.pop(barrier, None)
            if fut is not None and not fut.done():
                fut.set_result(None)
            return
        exchange, key = method.exchange, method.routing_key
        if _TAP_EXCHANGE_HEADER in headers and exchange in (
            self.tap_exchanges[1],  # copies from gateway versions before the peer tap
            self.peer_exchanges[0],
        ):
            if headers.pop(_TAP_INSTANCE_HEADER, None) == self.instance:
                return  # already in the map (the broker normally drops these)
            exchange = headers.pop(_TAP_EXCHANGE_HEADER)
            key = headers.pop(_TAP_KEY_HEADER, "")
        try:
            topic = self.topic_of(exchange, key, headers)
        except NameNotRepresentable:
            return
        stored = StoredMessage(
            topic=topic,
            body=body,
            headers=headers,
            content_type=properties.content_type or "application/octet-stream",
        )
        self._remember([((exchange, key), stored)])

    def _remember(self, entries: Iterable[tuple[Binding, StoredMessage]]) -> None:
        """Make ``entries`` the current messages of their (exchange, routing key)."""
        with self._current_lock:
            for where, stored in entries:
                self._current[where] = stored
                self._current.move_to_end(where)
            while len(self._current) > self.opts.current_cache_size:
                self._current.popitem(last=False)

    async def _tap_barrier(self, timeout: float) -> None:
        """Wait until the tap consumed everything routed before now (best effort)."""
        if self._tap is None or not self._tap.is_open:
            return
        token = uuid.uuid4().hex
        fut: asyncio.Future[None] = self._consumer.loop.create_future()
        self._barriers[token] = fut
        self._tap.pika.basic_publish(
            "",
            self.tap_queue,
            b"",
            pika.BasicProperties(headers={_BARRIER_HEADER: token}),
        )
        try:
            await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            log.debug("current-message barrier timed out")
        finally:
            self._barriers.pop(token, None)

    def current_message(self, topic: Topic) -> StoredMessage | None:
        if not self.opts.current_message:
            return None
        try:
            key = self.native_name(topic)
        except NameNotRepresentable:
            return None
        if self._consumer.is_up:
            with contextlib.suppress(Exception):
                self._consumer.submit(self._tap_barrier(2.0), 3.0)
        with self._current_lock:
            stored = self._current.get(key)
        if stored is None:
            return None
        return StoredMessage(topic, stored.body, stored.headers, stored.content_type)

    # --- publisher link --------------------------------------------------------------

    async def _on_publisher_connected(self, link: Link) -> None:
        self._declared["publisher"] = set()
        await self._open_publish_channel(link)

    async def _open_publish_channel(self, link: Link) -> Channel:
        ch = await link.open_channel()
        with self._pub_lock:
            self._pub_tag = 0
        self._frames = None
        ch.pika.add_on_return_callback(self._on_return)
        ch.add_close_listener(self._on_publish_channel_closed)
        await ch.call("confirm_delivery", self._on_confirm)
        # confirms and returns are read straight from the wire (pika's callbacks above
        # stay as the fallback); Confirm.SelectOk has gone through pika
        ch.read(FrameReader(on_confirm=self._confirmed, on_return=self._on_returned))
        self._pub = ch
        return ch

    def _fail_pending(self, reason: str) -> None:
        with self._pub_lock:
            pending = list(self._pending.values())
            self._pending.clear()
        self._returned.clear()
        for p in pending:
            p.batch.fail(PublishFailed(reason))

    def _on_publish_channel_closed(self, ch: Channel, reason: BaseException) -> None:
        if self._pub is ch:
            self._pub = None
            self._frames = None
            self._fail_pending(f"channel closed before the broker confirmed: {reason}")

    def _on_publisher_lost(self, link: Link, reason: BaseException | None) -> None:
        self._pub = None
        self._frames = None
        self._fail_pending(f"connection lost before the broker confirmed: {reason}")

    def _on_return(self, _ch: Any, method: Any, properties: Any, body: bytes) -> None:
        self._on_returned(method, properties, body)

    def _on_returned(self, method: Any, properties: Any, _body: bytes) -> None:
        # A return precedes the confirm of the same message on the channel: count it, and
        # the confirm of the oldest pending message with this exchange, routing key and
        # message id reports it unrouted.
        key = (method.exchange, method.routing_key, properties.message_id or "")
        self._returned[key] = self._returned.get(key, 0) + 1

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        nack = isinstance(method, spec.Basic.Nack)
        self._confirmed(method.delivery_tag, method.multiple, nack)

    def _confirmed(self, tag: int, multiple: bool, nack: bool) -> None:
        pending = self._pending
        with self._pub_lock:
            if multiple:
                # tags are confirmed in order: pop from the front, O(1) each
                settled = []
                while pending:
                    first = next(iter(pending))
                    if first > tag:
                        break
                    settled.append(pending.pop(first))
            else:
                p = pending.pop(tag, None)
                settled = [p] if p is not None else []
        for p in settled:
            self._settle(p, nack)

    def _settle(self, p: _Pending, nack: bool) -> None:
        batch = p.batch
        if p.index >= 0:
            returned = self._returned
            if returned:
                key = (p.exchange, p.routing_key, p.message_id)
                count = returned.get(key, 0)
                if count:
                    if count == 1:
                        del returned[key]
                    else:
                        returned[key] = count - 1
                    batch.receipts[p.index] = _UNROUTED
            if nack:
                if self.opts.fail_on_nack:
                    batch.fail(PublishFailed("RabbitMQ rejected the message (nack)"))
                    return
                log.warning(
                    "RabbitMQ nacked message %s on %s/%s (a full reject-publish queue?)",
                    p.message_id,
                    p.exchange,
                    p.routing_key,
                )
                batch.receipts[p.index] = _NACKED
        # a peer copy's nack is not the publisher's concern
        batch.confirmed()

    def _target(self, topic: Topic) -> tuple[str, str, bool]:
        """(exchange, routing key, internal namespace) of a published topic, memoised."""
        target = self._targets.get(topic)
        if target is None:
            try:
                exchange, key = self.native_name(topic)
            except NameNotRepresentable as exc:
                raise PublishFailed(f"{topic} has no RabbitMQ name: {exc}") from exc
            target = (exchange, key, is_internal_namespace(topic.namespace))
            # a fallback namespace's name may stop being representable once another
            # namespace claims its exchange: only configured or derived names are stable
            if fallback_root(topic.namespace) is None:
                if len(self._targets) >= _NAME_CACHE_SIZE:
                    self._targets.clear()
                self._targets[topic] = target
        return target

    def _encode(
        self,
        messages: Sequence[OutboundMessage],
        targets: Sequence[tuple[str, str, bool]],
        frames: PublishFrames,
        batch: _Batch,
    ) -> tuple[bytes, list[_Pending], list[tuple[Binding, StoredMessage]]]:
        """The frames of ``messages`` (and their peer copies), the pending entries in
        publish order and the current-message updates.  Pure: runs on any thread."""
        keep_current = self.opts.current_message
        peers = self.peer_exchanges[0] if keep_current and self.opts.current_peers else None
        # only the last message per (exchange, routing key) of the batch becomes current
        # and is copied to the other instances: the earlier ones are superseded at once
        last: dict[tuple[str, str], int] = {}
        if keep_current:
            last = {(ex, key): i for i, (ex, key, internal) in enumerate(targets) if not internal}
        out: list[bytes] = []
        pendings: list[_Pending] = []
        current: list[tuple[Binding, StoredMessage]] = []
        timestamp = int(time.time())
        instance = self.instance
        for i, message in enumerate(messages):
            exchange, key, _internal = targets[i]
            headers: dict[str, Any] = dict(message.headers)
            headers[HEADER_MESSAGE_ID] = message.message_id
            # the topic headers name the message's own topic when core gave them (a copy
            # routed into a pull point inbox keeps the topic it was published on)
            topic = message.topic
            if HEADER_TOPIC_NAMESPACE not in headers:
                headers[HEADER_TOPIC_NAMESPACE] = topic.namespace
            if HEADER_TOPIC_PATH not in headers:
                headers[HEADER_TOPIC_PATH] = "/".join(topic.path)
            headers[HEADER_ORIGIN] = "gateway"
            frames.message(
                out,
                frames.method(exchange, key, self.opts.report_unrouted),
                message.body,
                content_type=message.content_type,
                table=encode_table(headers),
                persistent=True,
                message_id=message.message_id,
                timestamp=timestamp,
            )
            pendings.append(_Pending(batch, i, exchange, key, message.message_id))
            if last.get((exchange, key)) != i:
                continue
            current.append(
                (
                    (exchange, key),
                    StoredMessage(topic, message.body, headers, message.content_type),
                )
            )
            if peers is not None:
                # for the other instances' taps, right behind the original on the same
                # channel: they see gateway and native messages of one topic in (almost
                # exactly) routing order; this instance's own tap never gets it
                copy_headers = {
                    **headers,
                    _TAP_EXCHANGE_HEADER: exchange,
                    _TAP_KEY_HEADER: key,
                    _TAP_INSTANCE_HEADER: instance,
                }
                frames.message(
                    out,
                    frames.method(peers, "", False),
                    message.body,
                    content_type=message.content_type,
                    table=encode_table(copy_headers),
                    persistent=False,
                    message_id=message.message_id,
                    timestamp=timestamp,
                )
                pendings.append(_Pending(batch, -1, peers, "", message.message_id))
        return b"".join(out), pendings, current

    def _register(self, pendings: list[_Pending]) -> None:
        """Number ``pendings`` with the channel's next delivery tags (with ``_pub_lock``
        and the connection's write lock held, right before their frames are written)."""
        pending = self._pending
        tag = self._pub_tag
        for p in pendings:
            tag += 1
            pending[tag] = p
        pendings[0].batch.remaining = len(pendings)
        self._pub_tag = tag

    def _send(self, ch: Channel, data: bytes, pendings: list[_Pending]) -> None:
        """Number ``pendings`` and write ``data`` (loop thread)."""
        with self._pub_lock, ch.write_lock:
            self._register(pendings)
            ch.write(data)

    def _send_now(
        self, ch: Channel, frames: PublishFrames, data: bytes, pendings: list[_Pending]
    ) -> bool:
        """Number ``pendings`` and write ``data`` from the calling thread, when the
        publishing channel is current and nothing waits to be written before it; False
        (nothing done) otherwise.  This saves the loop wake-up per publish."""
        with self._pub_lock, ch.write_lock:
            if self._pub is not ch or self._frames is not frames or not ch.can_send_now():
                return False
            self._register(pendings)
            ch.send_now(data)
            return True

    async def _publish(
        self, messages: Sequence[OutboundMessage], timeout: float
    ) -> list[PublishReceipt]:
        link = self._publisher
        try:
            await link.ready(timeout)
        except LinkDown as exc:
            raise PublishUnavailable(str(exc)) from None
        targets = [self._target(m.topic) for m in messages]
        for exchange, internal in {t[0]: t[2] for t in targets}.items():
            await self._ensure_exchange(link, exchange, internal)
        ch = self._pub
        if ch is None or not ch.is_open:
            ch = await self._open_publish_channel(link)
        frames = self._frames
        if frames is None:
            frames = self._frames = ch.frames()
        done: asyncio.Future[None] = link.loop.create_future()
        batch = _Batch(done, len(messages), self._receipt)
        data, pendings, current = self._encode(messages, targets, frames, batch)
        self._send(ch, data, pendings)
        await done
        # confirmed (with the peer copies: another instance's following current_message()
        # sees this publish): this instance's current-message map has them from now on,
        # without a tap round trip through the broker
        if current:
            self._remember(current)
        return batch.receipts

    def _publish_direct(
        self, messages: Sequence[OutboundMessage], timeout: float
    ) -> list[PublishReceipt] | None:
        """The common case without a coroutine: connected, publishing channel open, every
        exchange declared.  Encodes on the calling thread, hands the bytes to the loop in
        one callback and waits for the batch's confirms.  None when the case does not
        apply (or the channel changed before the write): then :meth:`_publish` runs."""
        link = self._publisher
        ch, frames = self._pub, self._frames
        if not link.is_up or ch is None or frames is None or not ch.is_open:
            return None
        targets = [self._target(m.topic) for m in messages]
        declared = self._declared.get(link.name, ())
        if any(t[0] not in declared for t in targets):
            return None
        done = Completion()
        batch = _Batch(done, len(messages), self._receipt)
        data, pendings, current = self._encode(messages, targets, frames, batch)
        if self._send_now(ch, frames, data, pendings):
            return self._wait_confirms(done, batch, current, timeout)

        def send() -> None:
            if self._pub is not ch or self._frames is not frames or not ch.is_open:
                batch.fail(_Stale())  # nothing written: take the coroutine path
                return
            self._send(ch, data, pendings)

        try:
            link.loop.call_soon_threadsafe(send)
        except RuntimeError:
            return None  # the loop is closed
        return self._wait_confirms(done, batch, current, timeout)

    def _wait_confirms(
        self,
        done: Completion,
        batch: _Batch,
        current: list[tuple[Binding, StoredMessage]],
        timeout: float,
    ) -> list[PublishReceipt] | None:
        """Wait for a directly published batch's confirms (None: take the coroutine path)."""
        try:
            done.result(timeout)
        except _Stale:
            return None
        except TimeoutError:
            raise PublishFailed(
                f"not confirmed: RabbitMQ did not answer within {timeout:.1f}s"
            ) from None
        if current:
            self._remember(current)
        return batch.receipts

    def publish(self, message: OutboundMessage, timeout: float = 10.0) -> PublishReceipt:
        return self.publish_many([message], timeout)[0]

    def publish_many(
        self, messages: Sequence[OutboundMessage], timeout: float = 10.0
    ) -> list[PublishReceipt]:
        if not messages:
            return []
        if self._closed or not self._opened:
            raise PublishUnavailable("the RabbitMQ adapter is not open")
        messages = list(messages)
        try:
            receipts = self._publish_direct(messages, timeout)
            if receipts is not None:
                return receipts
            return self._publisher.submit(self._publish(messages, timeout), timeout + 1)
        except PublishFailed:
            raise
        except (LinkDown, TimeoutError) as exc:
            raise PublishFailed(f"not confirmed: {exc}") from exc
        except ChannelError as exc:
            raise PublishFailed(f"RabbitMQ refused the publish: {exc}") from exc
