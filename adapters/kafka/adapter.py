"""Kafka adapter: WS-Topics trees on Kafka topics, WS-N subscriptions as cursors over the
log, through confluent-kafka (librdkafka).

Features
    * **Mapping per namespace** (``KafkaMapping``): *topic-per-path* (default) stores the
      WS topic ``tns:a/b/c`` in the Kafka topic ``[topic_prefix.]root.a.b.c`` (the root is
      configured per namespace or derived from its URI; levels escaped by
      ``topic_mapping``'s Kafka syntax); *topic-per-namespace* stores a whole namespace in
      one Kafka topic, the WS topic path in the record key and a header.  Pull point
      inboxes share one internal topic (``internal_topic``), keyed by the inbox.
    * **Subscriptions are cursors** (``adapters.logbase.CursorEngine``): one head reader
      follows every mapped topic and dispatches in process to every subscription at the
      head; a few catch-up readers serve subscriptions that lag (paused, slow consumer,
      restored at start-up).  Positions of cursors away from the head are the offsets of
      one consumer group per subscription (``group_prefix`` + name, no members), so
      ``kafka-consumer-groups --describe --group wsnmom.sub.<id>`` shows its lag; the
      head's position is the offsets of the group ``head_group``.  10,000 subscriptions
      cost no more Kafka clients or threads than one.
    * Offset acknowledgement (``ack_mode="offset"``): a position advances only past records
      that were settled in order; no per-message nack (a requeue rewinds the cursor); no
      native pull (core keeps a pull buffer); ``QueueLimits`` enforced by core; order per
      partition (a WS topic always goes to one partition: the key is its path).
    * Publishing (``Publisher``): idempotent producer, ``acks=all``; ``publish`` returns after
      the delivery report; ``publish_many`` pipelines.  Topics are created on first publish
      with ``partitions``, ``replication_factor`` and ``topic_config``, or, with
      ``topic_policy = "existing"``, a missing topic is refused (TopicNotSupportedFault).
    * Record headers carry the metadata (``wsnmom-*``, ``content-type``).  Records produced
      natively by any Kafka client (no wsnmom headers; XML, JSON, text or binary body) reach
      matching subscribers: their topic comes from the Kafka topic (and the key or header
      in a per-namespace topic), their media type from a ``content-type`` header or the body.
    * GetCurrentMessage (``CurrentMessages``): the newest record of the WS topic, native
      ones included, from an in-memory map the head reader keeps current, looked up in the
      tail of the Kafka topic on a miss.
    * Cluster mode (``shared_by_instances``): the instance that starts delivering a
      subscription continues from the positions its last deliverer saved in the
      subscription's consumer group; a deliverer saves them at most every second while
      they change.
    * Reachability (``Health``): ``available()`` is False while the cluster is known to be
      unreachable (all brokers down, or a metadata probe unanswered for ``health_timeout``);
      ``open()`` raises ``AdapterUnavailable`` then and can be retried.

Connection String
    ``kafka://host1:9092,host2:9092`` (the ``bootstrap.servers`` list).  Query arguments:
    adapter options (``?topic_prefix=wsn&partitions=3``) and, when the name contains a dot,
    librdkafka properties for every client (``?security.protocol=SASL_SSL``).  A user part
    (``kafka://user:secret@host:9092``) sets ``sasl.username``/``sasl.password``
    (mechanism ``PLAIN`` and ``SASL_PLAINTEXT`` unless configured otherwise).  Passwords
    and other secrets never appear in log lines or ``repr``.

Options
    ``topic_prefix``
        prefix level of every per-path Kafka topic (default none: every topic of the
        cluster whose name does not start with ``_`` is followed and mapped).
    ``mode``
        ``path`` (default) or ``namespace``: the mapping of namespaces not configured.
    ``namespaces``
        table namespace URI -> root name (``"orders"``), or a table with ``mode``
        (``path``/``namespace``), ``root`` and, in namespace mode, ``topic`` (the full Kafka
        topic name).
    ``internal_topic``, ``internal_partitions``
        the pull point inbox topic (``wsnmom-internal``) and its partitions (1).
    ``topic_policy``
        ``create`` (default) or ``existing``.
    ``partitions``, ``replication_factor``, ``topic_config``
        for created topics: 1, -1 (the broker's default) and a table of topic configs
        (e.g. ``retention.ms``).
    ``default_path``
        WS topic path of a record in a per-namespace topic that has neither a path header
        nor a key that is a topic path (default ``native``).
    ``group_prefix``, ``head_group``
        consumer group names: ``wsnmom.sub.`` + subscription, ``wsnmom.head``.  Give each
        gateway instance sharing a cluster its own ``head_group``.
    ``catch_up_readers``
        readers for lagging subscriptions (4).
    ``fetch_wait_ms``
        ``fetch.wait.max.ms`` of the readers (20): an upper bound of the head's latency on
        brokers that do not answer a fetch as soon as data arrives (tansu).
    ``discovery_interval``, ``topic_id_check_interval``
        seconds between looks for new topics (2) and between topic id checks (10).
    ``delivery_timeout``
        ``message.timeout.ms`` of the producer, in seconds (30).
    ``health_interval``, ``health_timeout``
        reachability probe period and timeout, seconds (1, 2).
    ``unavailable_grace``
        seconds a publish waits for an unreachable cluster before it fails without
        sending anything (2).
    ``current_cache_size``, ``current_scan_limit``
        topics remembered for GetCurrentMessage (100000) and records per partition read
        back to find one (1000).
    ``max_message_bytes``
        largest body accepted (1000000, Kafka's default ``message.max.bytes``).
    ``exact_watermarks``
        the brokers report exact end offsets (default true, as Apache Kafka does): a new
        subscription starts at the end offsets the cluster reports (one ListOffsets
        request).  Set it false for brokers whose high watermark is not exact (tansu
        reports the first offset of the last batch): a new subscription then starts where
        the head reader is once it has read everything fetched (a few tens of ms).
    ``connect_timeout``
        seconds ``open()`` waits for the cluster to answer (10).
    ``close_timeout``
        seconds ``close()`` waits for the cluster in all (2): position saves, the head's
        commit, the producer's flush (``closing.py``).
    ``config``, ``producer_config``, ``consumer_config``
        tables of librdkafka properties (all clients, the producer, the readers): SASL,
        SSL (``ssl.ca.location``, ...), ``client.id`` and tuning.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

try:
    from confluent_kafka import KafkaError, KafkaException, TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        'the Kafka adapter needs confluent-kafka: pip install "wsnmom[kafka]"'
    ) from exc

from wsnmom.core.adapter import (
    AdapterError,
    AdapterUnavailable,
    Capabilities,
    OutboundMessage,
    PositionKeeper,
    PublishReceipt,
    StoredMessage,
    SubscriptionHandle,
    SubscriptionSpec,
)
from wsnmom.core.adapter_options import AdapterOptionError
from wsnmom.topic_mapping.errors import NameNotRepresentable
from wsnmom.topic_mapping.model import Topic
from wsnmom.topic_mapping.syntax import KAFKA

from ..logbase.adapter import LogAdapter
from ..logbase.backend import StreamId
from ..logbase.engine import CursorEngine
from .backend import KafkaBackend
from .clients import Health, client_hooks
from .config import KafkaSettings, parse_settings, redact_url
from .current import CurrentMessages
from .mapping import Destination, KafkaMapping
from .publisher import Publisher
from .topics import Topics

__all__ = ["KafkaAdapter"]

log = logging.getLogger("wsnmom.adapters.kafka")


@dataclass
class _Open:
    """Everything an open adapter holds."""

    health: Health
    admin: AdminClient
    topics: Topics
    current: CurrentMessages
    publisher: Publisher
    backend: KafkaBackend
    engine: CursorEngine


class _Backend(KafkaBackend):
    """The engine's backend, with exact end offsets where the option says they are."""

    exact_watermarks = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._published_lock = threading.Lock()
        self._published: dict[StreamId, int] = {}

    def note_published(
        self, dest: Destination, message: OutboundMessage, partition: int, offset: int, ts: int
    ) -> None:
        """The gateway's own publish to ``dest``'s ``partition`` was confirmed at
        ``offset`` (the publisher's last per topic of a batch)."""
        stream = (dest.log, partition)
        with self._published_lock:
            if offset + 1 > self._published.get(stream, 0):
                self._published[stream] = offset + 1

    def forget_published(self) -> None:
        """A followed topic started again below its old end: the offsets noted are of
        the old log (kept, a cursor's end would wait for offsets that never come)."""
        with self._published_lock:
            self._published.clear()

    def published_ends(self) -> dict[StreamId, int]:
        """Where each stream ends at least: after the gateway's own confirmed publishes
        (what a cursor's end must read up to when the brokers' watermark is not trusted,
        ``exact_watermarks = false``)."""
        with self._published_lock:
            return dict(self._published)

    def end_positions(self) -> dict[StreamId, int] | None:
        if not self.exact_watermarks:
            return None
        listing = self.topics.listing(max_age=self.settings.discovery_interval)
        request = {
            TopicPartition(name, p): OffsetSpec.latest()  # type: ignore[no-untyped-call]
            for name, count in listing.items()
            if self.mapping.follows(name)
            for p in range(count)
        }
        if not request:
            return {}
        out: dict[StreamId, int] = {}
        for tp, future in self.admin.list_offsets(request, request_timeout=10).items():
            try:
                out[(tp.topic, tp.partition)] = max(0, future.result().offset)
            except KafkaException:
                return None
        return out


class KafkaAdapter(LogAdapter):
    """Kafka adapter (see the module docstring)."""

    name = "kafka"
    schemes = ("kafka",)
    extra = "kafka"
    capabilities = Capabilities(
        syntax=KAFKA,
        ack_mode="offset",
        durable_subscriptions=True,
        native_pull=False,
        retained_current_message=True,
        native_headers=True,
        native_queue_limits=False,
        ordering="partition",
        competing_consumers=False,
        max_message_bytes=1_000_000,
        sole_publisher=False,
        per_message_nack=False,
        shape="log",
        # a reader of its own reads from the cursor's positions, committing nothing
        peek=True,
        # what discard skips (the oldest or the newest) is read and published to
        # SubscriptionSpec.dead_letters before the cursor commits past it
        native_dead_letters=True,
    )

    declared_options = KafkaSettings

    def __init__(self, url: str, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(url, options)
        try:
            self.settings: KafkaSettings = parse_settings(url, options)
            self.mapping = KafkaMapping(self.settings)
        except AdapterOptionError:
            raise  # names the option already
        except ValueError as exc:
            raise AdapterOptionError(f"bad Kafka adapter configuration: {exc}") from exc
        self.capabilities = replace(
            KafkaAdapter.capabilities, max_message_bytes=self.settings.max_message_bytes
        )
        self._lock = threading.Lock()
        self._open: _Open | None = None
        #: several gateway instances deliver these subscriptions (``shared_by_instances``)
        self._shared = False
        #: core's fence for position writes (``shared_by_instances``)
        self._may_save: Callable[[str], bool] | None = None
        #: core's keeper of positions fenced in the store (``positions_kept_by``)
        self._keeper: PositionKeeper | None = None

    def __repr__(self) -> str:
        return f"<KafkaAdapter {redact_url(self.url)} {self.settings.redacted()}>"

    # -- lifecycle --------------------------------------------------------------------------
    def open(self) -> None:
        """Connect, create the internal topic, start the cursor engine."""
        with self._lock:
            if self._open is not None:
                return
            self._open = self._connect()

    def _connect(self) -> _Open:
        settings = self.settings
        health = Health(settings.health_interval, settings.health_timeout)
        admin = AdminClient(
            {**settings.admin(), **client_hooks(health), "allow.auto.create.topics": False}
        )
        topics = Topics(admin, settings)
        try:
            topics.refresh(timeout=settings.connect_timeout)
        except AdapterUnavailable:
            if health.fatal is not None:
                raise AdapterError(f"Kafka refused the gateway: {health.fatal.str()}") from None
            raise AdapterUnavailable(
                f"the Kafka cluster {settings.bootstrap} does not answer"
            ) from None
        parts: list[Any] = []
        try:
            topics.ensure(
                settings.internal_topic, partitions=settings.internal_partitions, internal=True
            )
            current = CurrentMessages(settings, self.mapping, topics, health)
            parts.append(current)
            backend = _Backend(settings, self.mapping, admin, topics, health, current.observe)

            def confirmed(
                dest: Destination, message: OutboundMessage, partition: int, offset: int, ts: int
            ) -> None:
                current.published(dest, message, partition, offset, ts)
                backend.note_published(dest, message, partition, offset, ts)

            publisher = Publisher(settings, self.mapping, topics, health, confirmed)
            publisher.start()
            parts.append(publisher)
            backend.exact_watermarks = settings.exact_watermarks
            topics.on_created = backend.topic_created

            def reset(seen: float) -> None:
                backend.forget_published()  # the offsets it knew are of the old log
                # a producer made since the old topic was last seen was made (but for a
                # race of one discovery interval) by the publisher once it found the
                # cluster without its topics (``TopicCheck.check``): it has a producer id
                # of the new cluster, and replacing it would fail what it is sending now
                publisher.renew("a followed topic was re-created", made_before=seen)

            backend.on_reset = reset
            engine = CursorEngine(
                backend, catch_up_readers=settings.catch_up_readers, poll_timeout=0.02
            )
            engine.shared = self._shared
            engine.may_save = self._may_save
            engine.keeper = self._keeper
            engine.start()
        except KafkaException as exc:
            self._release(parts)
            raise AdapterUnavailable(f"the Kafka cluster did not answer: {exc}") from exc
        except Exception:
            self._release(parts)
            raise

        def probe(timeout: float) -> None:
            admin.list_topics(topic=settings.internal_topic, timeout=timeout)
            admin.poll(0)  # its queued log lines and errors

        health.start(probe)
        log.info("Kafka adapter open on %s", redact_url(self.url))
        return _Open(health, admin, topics, current, publisher, backend, engine)

    @staticmethod
    def _release(parts: list[Any]) -> None:
        for part in reversed(parts):
            try:
                part.close()
            except Exception:
                log.debug("releasing %r failed", part, exc_info=True)

    def close(self) -> None:
        """Stop the engine (positions saved), deliver what is queued, disconnect."""
        with self._lock:
            state, self._open = self._open, None
        if state is None:
            return
        closing = state.backend.closing
        closing.begin(self.settings.close_timeout)  # adapters/kafka/closing.py
        state.health.stop()
        try:
            state.engine.close()
        finally:
            self._release([state.current])
            try:
                state.publisher.close(timeout=closing.remaining(10.0))
            except Exception:
                log.debug("releasing %r failed", state.publisher, exc_info=True)

    def shared_by_instances(self, may_save: Callable[[str], bool] | None = None) -> None:
        """Cluster mode: a subscription's delivery moves between instances, so every
        cursor this instance starts takes up the positions its last deliverer saved in
        its consumer group, and keeps them saved while it delivers, each write fenced by
        ``may_save`` (the engine's ``shared`` and ``may_save``; docs/scale-out.md)."""
        with self._lock:
            self._shared = True
            self._may_save = may_save
            if self._open is not None:
                self._open.engine.shared = True
                self._open.engine.may_save = may_save

    def positions_kept_by(self, keeper: PositionKeeper) -> None:
        """Cluster mode on PostgreSQL: positions are kept by core's ``keeper`` (fenced
        by shard epochs in the store), the consumer groups written after it as a mirror
        for ``kafka-consumer-groups`` (``adapters.logbase.kept``; docs/scale-out.md)."""
        with self._lock:
            self._keeper = keeper
            if self._open is not None:
                self._open.engine.keep_positions(keeper)

    def _require(self) -> _Open:
        state = self._open
        if state is None:
            raise AdapterUnavailable("the Kafka adapter is not open")
        return state

    def ping(self, timeout: float = 1.0) -> bool:
        """Whether the cluster answers a metadata request now."""
        state = self._open
        if state is None:
            return False
        try:
            state.admin.list_topics(topic=self.settings.internal_topic, timeout=timeout)
        except KafkaException:
            return False
        return True

    def available(self) -> bool:
        """False while the cluster is known to be unreachable (no I/O)."""
        state = self._open
        return state is not None and state.health.available

    def unavailable_reason(self) -> str | None:
        """Why the cluster is known to be unreachable: the error that said so, or the
        credentials or rights Kafka refused (no I/O)."""
        state = self._open
        if state is None:
            return "the Kafka adapter is not open"
        health = state.health
        if health.fatal is not None:
            return f"Kafka refused the gateway's credentials or rights: {health.fatal.str()}"
        return None if health.available else f"the Kafka cluster is unreachable: {health.reason}"

    # -- publishing -------------------------------------------------------------------------
    def publish(self, message: OutboundMessage, timeout: float = 10.0) -> PublishReceipt:
        """Publish and wait for the delivery report."""
        return self._require().publisher.publish_many([message], timeout)[0]

    def publish_many(
        self, messages: Sequence[OutboundMessage], timeout: float = 10.0
    ) -> list[PublishReceipt]:
        """Publish all, then wait for every delivery report (pipelined)."""
        if not messages:
            return []
        return self._require().publisher.publish_many(messages, timeout)

    # -- subscriptions (the rest is LogAdapter's) --------------------------------------------
    def cursor_engine(self) -> CursorEngine:
        return self._require().engine

    def subscription(self, spec: SubscriptionSpec) -> SubscriptionHandle:
        """The cursor ``spec.name`` (created at the end of the logs, or re-attached)."""
        self._require()
        for pattern in spec.patterns or ():
            self.mapping.register(pattern.namespace)
        try:
            return super().subscription(spec)
        except KafkaException as exc:
            raise AdapterUnavailable(f"Kafka did not answer: {exc}") from exc

    # -- current message --------------------------------------------------------------------
    def current_message(self, topic: Topic) -> StoredMessage | None:
        """The newest record on ``topic`` (native ones included), if any."""
        state = self._require()
        try:
            return state.current.get(topic, following=state.backend.following)
        except NameNotRepresentable:
            return None
        except KafkaException as exc:
            error = exc.args[0]
            if isinstance(error, KafkaError) and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                return None
            raise AdapterUnavailable(f"reading the current message failed: {exc}") from exc
