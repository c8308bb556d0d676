"""RabbitMQ adapter: WS-Topics namespaces on topic exchanges, WS-N subscriptions on durable queues.

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
    * Threading: one publishing connection and a pool of consuming connections (another
      one per ``consumers_per_connection`` subscriptions), each driven by its own I/O
      thread (``_link.Link``); public methods are thread-safe.  A subscription has its own
      channel per consumer (and per puller) on one consuming connection.  Lost connections
      are re-established with backoff, everything declared again and consumers resumed;
      publishes not confirmed when the connection drops raise ``PublishFailed``.

Connection String
    ``amqp://user:password@host:5672/vhost`` or ``amqps://...`` (TLS, port 5671), parsed by
    ``pika.URLParameters`` (so its query arguments such as ``heartbeat``,
    ``connection_attempts`` or ``ssl_options`` work).  The scheme ``rabbitmq://`` is an
    alias of ``amqp://``.  The vhost is the URL path (``%2F`` for ``/``).  These wsnmom
    options may also be given as query arguments: ``prefetch``, ``queue_type``, ``instance``
    and ``pull`` (``options.URL_OPTIONS``).

Parts
    ``RabbitMQAdapter`` implements core's ``Adapter`` by delegating to parts of one job
    each: ``options`` (declared options, URL, pika parameters), ``names`` (topic <->
    exchange and routing key), ``declarations`` (exchanges, queues, bindings, primers),
    ``pool`` (the consuming connections), ``subscription`` (core's handle on a queue),
    ``consumers`` (consuming, pulling, counting, deleting), ``deliveries`` (a delivery as
    core's ``Received``), ``current`` (the current-message tap), ``publisher`` (publisher
    confirms), ``errors`` (adapter errors); ``_link`` (one connection and its I/O thread)
    with ``_channel`` (awaitable channels), ``_fast`` (the connection that reads and
    writes frames itself) and ``_wire`` (those frames).

Options
    ``exchanges``
        mapping namespace URI -> exchange name; other namespaces get derived names.
    ``all_exchange``, ``queue_prefix``
        the catch-all exchange (``wsnmom.all``), subscription queues' prefix (``wsnmom.sub.``).
    ``queue_type``, ``single_active_consumer``
        ``classic`` (default) or ``quorum`` (cluster mode); push subscription queues with
        ``x-single-active-consumer`` (default: in cluster mode; see ``declarations``).
    ``queue_arguments``
        extra arguments for every subscription queue (e.g. ``x-queue-mode``).
    ``prefetch``
        default prefetch for consumers when core gives none (default 64).
    ``heartbeat``
        AMQP heartbeat in seconds (default 30, 3 in cluster mode; 0 disables).
    ``tls``
        mapping with ``ca_file``, ``cert_file``, ``key_file``, ``verify`` (default True),
        ``server_hostname`` for ``amqps`` (default: the system trust store).
    ``instance``
        stable name of this gateway instance for its current-message tap queue (random).
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
        raise PublishFailed when the broker nacks a publish (default False: see the docs).
    ``prime_queues``
        send every new (empty) classic subscription queue a primer, a persistent message
        that expires at once, so that the broker creates the queue's files then and not
        with the first notification (default True; see ``Declarations.prime``).
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

import time
import uuid
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import replace
from typing import Any, ClassVar

try:
    import pika  # noqa: F401  (the extra's check, before the parts import it)
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError('the RabbitMQ adapter needs pika: pip install "wsnmom[rabbitmq]"') from exc

from wsnmom.core.adapter import (
    Adapter,
    AdapterError,
    AdapterUnavailable,
    Capabilities,
    OutboundMessage,
    PublishReceipt,
    QueueLimits,
    StoredMessage,
    SubscriptionHandle,
    SubscriptionSpec,
)
from wsnmom.core.adapter_options import AdapterOptionError
from wsnmom.topic_mapping.model import PathPattern, Topic
from wsnmom.topic_mapping.syntax import RABBITMQ

from ._link import Link
from .consumers import Consumers
from .current import HEADER_ORIGIN, CurrentMessages
from .declarations import Declarations, quorum_refusal
from .deliveries import Deliveries
from .errors import PublishUnavailable, outage, reason, refusal
from .names import Binding, RabbitMQNames
from .options import CLUSTER_OPTIONS, RabbitMQOptions, connection_parameters, safe_url, split_url
from .pool import ConsumerPool
from .publisher import Publisher
from .subscription import PEEK_REFUSAL, RabbitMQSubscription

__all__ = [
    "HEADER_ORIGIN",
    "MAX_MESSAGE_BYTES",
    "PEEK_REFUSAL",
    "PublishUnavailable",
    "RabbitMQAdapter",
    "RabbitMQOptions",
    "RabbitMQSubscription",
]

#: RabbitMQ's default largest message (``max_message_size``, 128 MiB)
MAX_MESSAGE_BYTES = 128 * 1024 * 1024


class RabbitMQAdapter(Adapter):
    """WS-N subscriptions on RabbitMQ queues, topics on topic exchanges (pika)."""

    name = "rabbitmq"
    schemes = ("amqp", "amqps", "rabbitmq")
    extra = "rabbitmq"
    capabilities = Capabilities(
        syntax=RABBITMQ,
        ack_mode="per_message",
        durable_subscriptions=True,
        native_pull=False,  # pull = "buffer" (core's pull buffer); "get": see __init__
        retained_current_message=True,
        native_headers=True,
        native_queue_limits=True,
        ordering="subscription",
        competing_consumers=True,
        max_message_bytes=MAX_MESSAGE_BYTES,
        native_dead_letters=True,
    )

    declared_options = RabbitMQOptions
    cluster_options: ClassVar[Mapping[str, Any]] = CLUSTER_OPTIONS

    def __init__(self, url: str, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(url, options)
        pika_url, from_url = split_url(url)
        self.opts = RabbitMQOptions.parse(self.options, from_url)
        if (refused := quorum_refusal(self.opts)) is not None:
            raise AdapterOptionError(refused)
        if self.opts.pull == "get":
            self.capabilities = replace(type(self).capabilities, native_pull=True)
        #: topic <-> exchange and routing key (shared with the Spark bridge's tap)
        self.names = RabbitMQNames(self.opts.exchanges, self.opts.all_exchange)
        self.roots = self.names.roots
        self.parameters = connection_parameters(pika_url, self.opts, self.name)
        self.instance = self.opts.instance or uuid.uuid4().hex[:12]
        self._closed = False
        self._opened = False
        self.declarations = Declarations(self.opts, self.names)
        self.pool = ConsumerPool(
            self.parameters, self.opts, self._on_consumer_connected, self._on_consumer_lost
        )
        self.consumers = Consumers(
            self.pool.primary,
            self.declarations,
            Deliveries(self.names, self.opts.queue_prefix),
            self.opts.operation_timeout,
        )
        self.current = CurrentMessages(self.opts, self.names, self.instance, self.pool.primary)
        self.tap_queue = self.current.queue
        self.publisher = Publisher(
            self.parameters, self.opts, self.names, self.declarations, self.current
        )

    # --- topic names and queue arguments ---------------------------------------------

    def queue_name(self, subscription: str) -> str:
        """The queue that backs the durable subscription ``subscription``."""
        return self.declarations.queue_name(subscription)

    def queue_arguments(
        self, limits: QueueLimits, dead_letters: Binding | None = None, single_active: bool = False
    ) -> dict[str, Any]:
        """Queue arguments for ``limits`` (``Declarations.queue_arguments``)."""
        return self.declarations.queue_arguments(limits, dead_letters, single_active)

    def shared_by_instances(self, may_save: Callable[[str], bool] | None = None) -> None:
        """Cluster mode: push subscription queues let one consumer at a time receive
        (``x-single-active-consumer``; docs/scale-out.md, "What fences what").  RabbitMQ
        keeps the positions (acks), so ``may_save`` is not needed."""
        self.declarations.shared = True

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

    @property
    def tap_exchanges(self) -> tuple[str, str, str]:
        """(headers filter, native fanout, drop) exchanges of the current-message tap."""
        return self.current.tap_exchanges

    @property
    def peer_exchanges(self) -> tuple[str, str, str, str]:
        """Exchanges that carry gateway copies to the other instances' tap queues."""
        return self.current.peer_exchanges

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
        consumer, publisher = self.pool.primary, self.publisher.link
        if not self._opened:
            self._opened = True
            consumer.start(wait)
            publisher.start(wait)
        deadline = time.monotonic() + wait
        while not self.available():
            error = consumer.last_error or publisher.last_error
            refused = refusal(error, safe_url(self.parameters))
            if refused is not None:
                self.close()
                raise refused
            if time.monotonic() >= deadline:
                raise AdapterUnavailable(
                    f"{reason(error, safe_url(self.parameters))} (still trying)"
                )
            time.sleep(0.05)

    def available(self) -> bool:
        """Both the publishing and every consuming connection are up."""
        if not self._opened or self._closed or not self.publisher.link.is_up:
            return False
        return self.pool.all_up()

    def unavailable_reason(self) -> str | None:
        """Why a connection is down (``errors.outage``; no I/O)."""
        if not self._opened or self._closed:
            return "the RabbitMQ adapter is not open"
        return outage([self.publisher.link, *self.pool.snapshot()], safe_url(self.parameters))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.pool.closed = True
        self.publisher.link.close()
        self.pool.close()

    def stats(self) -> Mapping[str, int]:
        """Counts for tests: consuming connections, subscriptions, the most declaration
        channels one connection used at once, and the acks/nacks other threads settled,
        the loop wake-ups they asked for and the socket writes that carried them (summed
        over the consuming connections; see ``Link.settle``)."""
        with self.pool.lock:
            links = list(self.pool.links)
            subscriptions = len(self.pool.subs)
        return {
            "connections": len(links),
            "subscriptions": subscriptions,
            "declare_peak": max((ln.declare_peak for ln in links), default=0),
            "settles": sum(ln.settles_queued for ln in links),
            "settle_wakeups": sum(ln.settle_wakeups for ln in links),
            "settle_writes": sum(ln.settle_flushes for ln in links),
        }

    def ping(self, timeout: float = 1.0) -> bool:
        if self._closed or not (self.publisher.link.is_up and self.pool.all_up()):
            return False
        try:
            self.pool.primary.submit(self._ping(), timeout)
        except Exception:
            return False
        return True

    async def _ping(self) -> None:
        async with self.pool.primary.declaring() as admin:
            # a round trip that cannot fail for topology reasons
            await admin.call("basic_qos", prefetch_count=0)

    def _run(
        self, coro: Coroutine[Any, Any, Any], extra: float = 0.0, link: Link | None = None
    ) -> Any:
        """Run a coroutine on a consuming link (default: the first one), failures turned
        into adapter errors (``errors.run``)."""
        return self.consumers.run(coro, extra, link)

    # --- consuming connections --------------------------------------------------------

    async def _on_consumer_connected(self, link: Link) -> None:
        self.declarations.reset(link)
        primary = link is self.pool.primary
        if primary:
            self.current.channel = None
        await self.declarations.ensure_configured(link)
        if primary and self.opts.current_message:
            await self.current.start(link)
        for sub in self.pool.subscriptions_on(link):
            await self.consumers.resume(sub)

    def _on_consumer_lost(self, link: Link, reason: BaseException | None) -> None:
        if link is self.pool.primary:
            self.current.lost()

    # --- subscriptions ---------------------------------------------------------------

    def _new_subscription(self, spec: SubscriptionSpec, link: Link) -> RabbitMQSubscription:
        return RabbitMQSubscription(
            self.consumers,
            spec,
            link,
            self.queue_name(spec.name),
            self.opts.prefetch,
            self.pool.forget,
            lambda messages, timeout: self.publish_many(messages, timeout=timeout),
        )

    def subscription(self, spec: SubscriptionSpec) -> SubscriptionHandle:
        sub = self.pool.subscription(spec, self._new_subscription)
        if not self.declarations.deferred(sub) and not self.declarations.in_place(sub):
            self._run(self.declarations.declare_for(sub), link=sub.link)
        return sub

    def delete_subscription(self, name: str) -> None:
        if (sub := self.pool.find(name)) is not None:
            sub.delete()
        else:
            self._run(self.consumers.delete_queue(self.queue_name(name), None))

    def forget_subscription(self, name: str) -> bool:
        """Destroyed by another instance (``RabbitMQSubscription.forget``): True when its
        queue was left because messages wait in it."""
        sub = self.pool.find(name)
        return sub.forget() if sub is not None else False

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
                    self.consumers.depths(link, queues), extra=len(queues) * 0.01, link=link
                )
            except AdapterError:
                continue
            for (i, _), count in zip(items, counts, strict=True):
                out[i] = count
        return out

    # --- current message and publishing ------------------------------------------------

    def current_message(self, topic: Topic) -> StoredMessage | None:
        if not self.opts.current_message:
            return None
        return self.current.lookup(topic)

    def publish(self, message: OutboundMessage, timeout: float = 10.0) -> PublishReceipt:
        return self.publish_many([message], timeout)[0]

    def publish_many(
        self, messages: Sequence[OutboundMessage], timeout: float = 10.0
    ) -> list[PublishReceipt]:
        if not messages:
            return []
        if self._closed or not self._opened:
            raise PublishUnavailable("the RabbitMQ adapter is not open")
        return self.publisher.publish_many(list(messages), timeout)
