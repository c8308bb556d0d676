"""``wsn_kafka``: the Kafka source of the bridge (Python Data Source API, confluent-kafka).

The source reads the Kafka topics the gateway's Kafka adapter writes, with the adapter's own
mapping (``wsnmom.adapters.kafka.public.KafkaMapping``, built from the same URL and
options): the Kafka topics that may carry the selected WS topics are read, each record gets
the WS topic the gateway would give it, and the residual filter keeps exactly what a WS-N
subscription with the same filter receives (gateway-published and natively produced
records alike).

Streams are Kafka topic partitions, named ``topic/partition``; offsets are Kafka offsets.
Every task reads one exact offset range with its own consumer (``assign``, no group, no
commits), so re-running a micro-batch reads the same records.  A task turns the messages
it consumes into Arrow record batches column-wise (``kafka_rows``), without a Python
object per record beyond the message and a dict of its headers.

Options (besides the common ones of ``reader``)
    ``url``
        the gateway's Kafka adapter URL, ``kafka://host:port[,host:port][?topic_prefix=...]``
        (query arguments as in the adapter: mapping options and librdkafka properties).
    ``adapterOptions``
        JSON object of further adapter options (e.g. the ``namespaces`` table).
    ``exactWatermarks``
        true (default, and the adapter's ``exact_watermarks``): the end offsets the cluster
        reports are exact (Apache Kafka); ``bounds`` confirms them once by reading (once a
        selected partition holds records), and when they are not, the source warns and
        behaves as with false.
        false: confirm each end by reading to the end of the partition (brokers such as
        tansu report the first offset of the last batch).
    ``groupId``
        when set, offsets Spark has committed are mirrored into this consumer group, so
        ``kafka-consumer-groups --describe`` shows the query's lag (monitoring only).
    ``pollTimeout``
        seconds a task waits for the next record of its range before it fails (60).
    ``verifyPayloads``
        false (default): a record with the gateway's message id header and an XML media
        type is taken as the gateway wrote it, its body is the payload unchecked (the
        gateway publishes well-formed payload elements only); other records are checked
        as a delivery is.  true: every record's payload is parsed (~3 µs per record).
    ``kafka.<property>``
        librdkafka properties for every client of the source (SASL, SSL, ...).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from wsnmom.adapters.kafka.public import (
    KafkaMapping,
    KafkaSettings,
    LogRecord,
    parse_settings,
    records,
)
from wsnmom.core.redaction import redact_url

from .options import SourceError, get_bool, get_float, get_json
from .reader import EARLIEST, Backend, OffsetSource, RangePartition, RecordsMissing
from .selection import Compiled, Selection

if TYPE_CHECKING:
    import pyarrow as pa
    from wsnmom.core.filters import CompiledFilter

log = logging.getLogger("wsnmom.spark_bridge.kafka")

__all__ = ["KafkaBackend", "KafkaSource", "kafka_settings", "stream_name", "topic_partition"]

#: records one ``consume`` call returns at most: ``consume`` waits until it has that many
#: or its timeout passed, so a large batch stalls on every partial fetch
_CONSUME_BATCH = 500
#: records converted to one Arrow batch (the conversion's fixed cost per call is then
#: negligible; Spark's Arrow transfer also prefers batches of thousands of rows)
_BATCH_RECORDS = 4096


def stream_name(topic: str, partition: int) -> str:
    """The stream name of a Kafka topic partition (Kafka names never contain ``/``)."""
    return f"{topic}/{partition}"


def topic_partition(stream: str) -> tuple[str, int]:
    """Inverse of :func:`stream_name`."""
    topic, _, partition = stream.rpartition("/")
    return topic, int(partition)


def kafka_settings(options: Mapping[str, str]) -> KafkaSettings:
    """The adapter settings of a source's options (``url``, ``adapterOptions``,
    ``kafka.*``)."""
    url = options.get("url") or ""
    if not url:
        bootstrap = options.get("bootstrap") or options.get("kafka.bootstrap.servers")
        if not bootstrap:
            raise ValueError("the Kafka source needs the option url (kafka://host:port)")
        url = f"kafka://{bootstrap}"
    extra = get_json(options, "adapteroptions") or {}
    if not isinstance(extra, dict):
        raise ValueError("option adapterOptions must be a JSON object")
    config = dict(extra.pop("config", None) or {})
    for key, value in options.items():
        if key.startswith("kafka.") and key != "kafka.bootstrap.servers":
            config[key.removeprefix("kafka.")] = value
    if config:
        extra["config"] = config
    return parse_settings(url, extra)


class KafkaBackend(Backend):
    """Kafka topic partitions as the reader's streams (see the module docstring)."""

    middleware = "kafka"
    format_name = "wsn_kafka"
    option_names = (
        "url",
        "bootstrap",
        "adapterOptions",
        "exactWatermarks",
        "groupId",
        "verifyPayloads",
    )
    option_prefixes = ("kafka.",)

    def __init__(self, options: Mapping[str, str]) -> None:
        super().__init__(options)
        self.settings = kafka_settings(self.options)
        self.mapping = KafkaMapping(self.settings)
        self.exact = get_bool(self.options, "exactwatermarks", self.settings.exact_watermarks)
        self.poll_timeout = get_float(self.options, "polltimeout", 60.0)
        self.group = self.options.get("groupid") or None
        self.verify_payloads = get_bool(self.options, "verifypayloads", False)
        compiled = Compiled(Selection.from_options(self.options))
        self.patterns = compiled.patterns
        for pattern in self.patterns or ():
            # derived roots map back to their namespace only once registered
            self.mapping.register(pattern.namespace)
        self._admin: Any = None
        self._probe: Any = None
        #: whether the reported ends were confirmed once (``_check_exact``)
        self._ends_checked = False

    def default_alias(self) -> str:
        return kafka_settings(self.options).bootstrap

    def broker(self) -> str:
        return redact_url(f"kafka://{self.settings.bootstrap}")

    # -- clients --------------------------------------------------------------------------
    def _config(self) -> dict[str, Any]:
        config = self.settings.admin()
        config["client.id"] = f"wsnmom-spark-{self.alias}"
        return config

    def admin(self) -> Any:
        if self._admin is None:
            from confluent_kafka.admin import AdminClient

            self._admin = AdminClient(self._config())
        return self._admin

    def _consumer(self) -> Any:
        from confluent_kafka import Consumer

        config = self.settings.consumer(f"wsnmom-spark-{uuid.uuid4().hex[:12]}")
        config.update(
            {
                "client.id": f"wsnmom-spark-{self.alias}",
                "enable.partition.eof": True,
                # the records of a task's range exist already: never wait for more
                "fetch.wait.max.ms": 10,
            }
        )
        return Consumer(config)

    def close(self) -> None:
        probe, self._probe = self._probe, None
        if probe is not None:
            probe.close()
        self._admin = None

    # -- offsets --------------------------------------------------------------------------
    def streams(self) -> list[tuple[str, int]]:
        """The topic partitions that may carry selected notifications."""
        metadata = self.admin().list_topics(timeout=self.settings.connect_timeout)
        out: list[tuple[str, int]] = []
        for name, topic in metadata.topics.items():
            if topic.error is not None or not self.mapping.follows(name):
                continue
            if not self.mapping.may_carry(name, self.patterns):
                continue
            out.extend((name, p) for p in topic.partitions)
        return sorted(out)

    def bounds(self) -> dict[str, tuple[int, int]]:
        from confluent_kafka import TopicPartition
        from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]

        parts = [TopicPartition(t, p) for t, p in self.streams()]
        if not parts:
            return {}
        timeout = self.settings.connect_timeout
        admin = self.admin()
        earliest = OffsetSpec.earliest()  # type: ignore[no-untyped-call]
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        lows = admin.list_offsets({tp: earliest for tp in parts}, request_timeout=timeout)
        highs = admin.list_offsets({tp: latest for tp in parts}, request_timeout=timeout)
        out: dict[str, tuple[int, int]] = {}
        for tp in parts:
            key = TopicPartition(tp.topic, tp.partition)
            low = max(0, lows[key].result().offset)
            high = max(low, highs[key].result().offset)
            out[stream_name(tp.topic, tp.partition)] = (low, high)
        if not self.exact:
            out = self._confirm_ends(out)
        elif not self._ends_checked and out:
            out = self._check_exact(out)
        return out

    def _check_exact(self, reported: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
        """Once per source: confirm the reported ends by reading.  A broker whose ends are
        not exact (tansu: the first offset of the last batch) would otherwise have the
        source silently read part of each partition; the source then says so and confirms
        every end from here on, as with ``exactWatermarks=false``."""
        confirmed = self._confirm_ends(reported)
        # tansu reports an end at the start of a partition holding one batch: only a
        # partition with records tells exact ends apart, so until one has some, check again
        self._ends_checked = any(high > low for low, high in confirmed.values())
        short = {
            s: (reported[s][1], confirmed[s][1]) for s in reported if confirmed[s] != reported[s]
        }
        if short:
            examples = ", ".join(
                f"{stream}: reported {end}, records up to {true - 1}"
                for stream, (end, true) in sorted(short.items())[:3]
            )
            log.warning(
                "%s: the broker's end offsets are not exact (%s); the source confirms "
                "every end by reading from now on. Set exactWatermarks=false (or "
                "exact_watermarks=false in the URL) for this broker",
                self.where(),
                examples,
            )
            self.exact = False
        return confirmed

    def _confirm_ends(self, bounds: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
        """The true end of every partition, read from the fetch responses: assign just
        before the reported end and wait for each partition's end-of-partition event."""
        from confluent_kafka import KafkaError, TopicPartition

        if self._probe is None:
            self._probe = self._consumer()
        probe = self._probe
        assignment = []
        for stream, (low, high) in bounds.items():
            topic, partition = topic_partition(stream)
            assignment.append(TopicPartition(topic, partition, max(low, high - 1)))
        probe.assign(assignment)
        waiting = dict(bounds)
        out = dict(bounds)
        deadline = time.monotonic() + self.settings.connect_timeout
        while waiting:
            if time.monotonic() > deadline:
                raise SourceError(
                    self.where(), f"no end-of-partition answer for {sorted(waiting)} (probe)"
                )
            # a short wait: consume() waits for a full list until its timeout
            for message in probe.consume(_CONSUME_BATCH, 0.01):
                error = message.error()
                if error is None or error.code() != KafkaError._PARTITION_EOF:
                    continue
                stream = stream_name(message.topic(), message.partition())
                if stream in waiting:
                    low, _ = waiting.pop(stream)
                    out[stream] = (low, max(low, message.offset()))
        probe.unassign()
        return out

    def commit(self, offsets: Mapping[str, int]) -> None:
        if self.group is None or not offsets:
            return
        from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

        parts = [
            TopicPartition(*topic_partition(stream), offset)
            for stream, offset in offsets.items()
            if offset >= 0
        ]
        futures = self.admin().alter_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(self.group, parts)]
        )
        for future in futures.values():
            future.result()

    # -- records --------------------------------------------------------------------------
    def read(self, stream: str, start: int, end: int) -> Iterator[LogRecord]:
        for messages in self._messages(stream, start, end):
            yield from records(messages, self.mapping)

    def batches(self, part: RangePartition, selection: CompiledFilter) -> Iterator[pa.RecordBatch]:
        """The accepted rows of one task, built column-wise from the consumed messages
        (``kafka_rows``)."""
        from .kafka_rows import KafkaRows, collector_paused

        rows = KafkaRows(
            self.alias,
            self.mapping,
            selection,
            verify_payloads=self.verify_payloads,
            include_headers=self.include_headers,
        )
        topic, partition = topic_partition(part.stream)
        with collector_paused():
            for messages in self._messages(part.stream, part.start, part.end, _BATCH_RECORDS):
                batch = rows.from_messages(topic, partition, messages)
                if batch.num_rows:
                    yield batch

    def _messages(
        self, stream: str, start: int, end: int, chunk: int = _CONSUME_BATCH
    ) -> Iterator[list[Any]]:
        """The messages of ``stream`` with offsets in ``[start, end)``, in lists of up to
        about ``chunk``."""
        from confluent_kafka import (
            OFFSET_BEGINNING,
            KafkaError,
            KafkaException,
            Message,
            TopicPartition,
        )

        topic, partition = topic_partition(stream)
        consumer = self._consumer()
        try:
            first = OFFSET_BEGINNING if start == EARLIEST else start
            consumer.assign([TopicPartition(topic, partition, first)])
            idle_since = time.monotonic()
            pending: list[Any] = []
            while True:
                messages = consumer.consume(_CONSUME_BATCH, 0.1)
                if not messages:
                    if time.monotonic() - idle_since > self.poll_timeout:
                        raise TimeoutError(
                            f"no record for {self.poll_timeout:.0f}s while reading "
                            f"{stream} up to offset {end - 1}"
                        )
                    continue
                idle_since = time.monotonic()
                done = False
                if any(map(Message.error, messages)):
                    good = []
                    for message in messages:
                        error = message.error()
                        if error is None:
                            good.append(message)
                            continue
                        code = error.code()
                        if code == KafkaError._PARTITION_EOF:
                            done = done or message.offset() >= end
                            continue
                        if code == KafkaError._AUTO_OFFSET_RESET:
                            low, _ = consumer.get_watermark_offsets(
                                TopicPartition(topic, partition), timeout=10
                            )
                            raise RecordsMissing(stream, start, low)
                        raise KafkaException(error)
                    messages = good
                if messages and messages[-1].offset() >= end - 1:
                    # the range ends in this list
                    done = True
                    while messages and messages[-1].offset() >= end:
                        messages.pop()
                pending.extend(messages)
                if done or len(pending) >= chunk:
                    if pending:
                        yield pending
                    pending = []
                if done:
                    return
        finally:
            consumer.close()


class KafkaSource(OffsetSource):
    """Spark data source ``wsn_kafka`` (see the module docstring)."""

    backend_class = KafkaBackend

    @classmethod
    def name(cls) -> str:
        return "wsn_kafka"
