"""GetCurrentMessage on Kafka: the last record of a WS topic, natively produced ones
included.

Kafka keeps no "last message per topic" that can be looked up, so the adapter keeps an
in-memory map (``current_cache_size`` topics, least recently used dropped first), fed by
every record the head reader reads (the gateway's own and native ones) and by the
gateway's own confirmed publishes.  A topic not in the map is looked up once in Kafka by
reading the tail of its log backwards in windows of 100 records per partition (also while
the head reader is not reading, before core restored the subscriptions): the
newest record on that topic (per-path logs: the newest record of the Kafka topic;
per-namespace logs: the newest whose path matches), scanning at most
``current_scan_limit`` records per partition.  "Newest" across partitions is the record
timestamp.  The answer, also "none", is cached; the head keeps it current from then on.

Tail reading never trusts the high watermark alone (tansu reports one past the *first*
record of the last batch): it reads from the watermark window until no record arrives.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition
from wsnmom.adapters.logbase.backend import LogRecord
from wsnmom.core.adapter import (
    AdapterUnavailable,
    OutboundMessage,
    StoredMessage,
    is_internal_namespace,
)
from wsnmom.topic_mapping.model import Topic

from .clients import Health, client_hooks, record_from_message
from .config import KafkaSettings
from .mapping import Destination, KafkaMapping
from .topics import Topics

__all__ = ["CurrentMessages"]

log = logging.getLogger("wsnmom.adapters.kafka")

_WINDOW = 100


class _Entry:
    """The newest record known for a topic (no message: known to have none).

    A record the head reader read is kept as it is (``LogRecord``, converted lazily) and
    turned into a ``StoredMessage`` only when GetCurrentMessage asks: the head reads every
    record of every followed topic, and converting each one here cost more than reading it
    (under 100-message Notifies nobody asked for most of them)."""

    __slots__ = ("_message", "_record", "_stamp", "offset", "partition")

    def __init__(
        self,
        message: StoredMessage | None,
        partition: int = -1,
        offset: int = -1,
        timestamp_ms: int = -1,
        *,
        record: LogRecord | None = None,
    ) -> None:
        self._message = message
        self._record = record
        self.partition = partition
        self.offset = offset
        self._stamp = timestamp_ms

    @property
    def message(self) -> StoredMessage | None:
        """The message (converted from the record on first use)."""
        record = self._record
        if record is not None:
            # set before the record is dropped: a reader on another thread sees one of them
            stamp = record.timestamp
            self._stamp = int(stamp.timestamp() * 1000) if stamp is not None else -1
            self._message = StoredMessage(
                record.topic, record.body, record.headers, record.content_type
            )
            self._record = None
        return self._message

    @property
    def empty(self) -> bool:
        """Known to have no message."""
        return self._message is None and self._record is None

    @property
    def timestamp_ms(self) -> int:
        """When the record was stored (ms), -1 when unknown."""
        if self._record is not None:
            self.message  # noqa: B018 - converts, which reads the timestamp
        return self._stamp

    def newer_than(self, other: _Entry) -> bool:
        if other.empty:
            return True
        if self.partition == other.partition:
            return self.offset > other.offset
        return self.timestamp_ms > other.timestamp_ms


class CurrentMessages:
    """The current-message map and its Kafka lookups (see the module docstring)."""

    def __init__(
        self, settings: KafkaSettings, mapping: KafkaMapping, topics: Topics, health: Health
    ) -> None:
        self._settings = settings
        self._mapping = mapping
        self._topics = topics
        self._health = health
        self._lock = threading.Lock()
        self._entries: OrderedDict[Topic, _Entry] = OrderedDict()
        self._scan_lock = threading.Lock()
        self._consumer: Consumer | None = None

    # -- feeding ----------------------------------------------------------------------------
    def _offer(self, topic: Topic, entry: _Entry) -> None:
        with self._lock:
            old = self._entries.get(topic)
            if old is None or entry.newer_than(old):
                self._entries[topic] = entry
                self._entries.move_to_end(topic)
                while len(self._entries) > self._settings.current_cache_size:
                    self._entries.popitem(last=False)

    def observe(self, record: LogRecord) -> None:
        """A record the head read."""
        topic = record.topic
        if is_internal_namespace(topic.namespace):
            return
        with self._lock:
            known = self._entries.get(topic)
        if (
            known is not None
            and known.partition == record.stream[1]
            and known.offset >= record.offset
        ):
            return  # this gateway's own publish, remembered when it was confirmed
        self._offer(topic, _Entry(None, record.stream[1], record.offset, record=record))

    def published(
        self, dest: Destination, message: OutboundMessage, partition: int, offset: int, ts: int
    ) -> None:
        """The gateway's own publish was confirmed (the publisher calls this for the last
        message per topic of a batch only)."""
        topic = message.topic
        if is_internal_namespace(topic.namespace):
            return
        headers = dict(message.headers)
        headers.setdefault("wsnmom-message-id", message.message_id)
        stored = StoredMessage(topic, message.body, headers, message.content_type)
        self._offer(topic, _Entry(stored, partition, offset, ts))

    # -- lookup -----------------------------------------------------------------------------
    def get(self, topic: Topic, *, following: bool = True) -> StoredMessage | None:
        """The newest message on ``topic`` (see the module docstring).  ``following``:
        the head reader is reading now, so what the map holds is current; otherwise the
        tail of the topic is read again."""
        with self._lock:
            entry = self._entries.get(topic)
            if entry is not None and following:
                self._entries.move_to_end(topic)
                return entry.message
        dest = self._mapping.destination(topic)
        partitions = self._topics.partitions(dest.log)
        if not partitions:
            partitions = self._topics.refresh().get(dest.log, 0)
        if not partitions:
            return None  # no such Kafka topic (yet): nothing to remember
        found = self._scan(topic, dest, partitions)
        self._offer(topic, found)
        with self._lock:
            entry = self._entries.get(topic)
        return entry.message if entry is not None else found.message

    def _reader(self) -> Consumer:
        if self._consumer is None:
            config: dict[str, Any] = {
                **self._settings.consumer(f"{self._settings.head_group}.current"),
                **client_hooks(self._health, side=True),
            }
            self._consumer = Consumer(config)
        return self._consumer

    def _scan(self, topic: Topic, dest: Destination, partitions: int) -> _Entry:
        best = _Entry(None)
        with self._scan_lock:
            consumer = self._reader()
            for partition in range(partitions):
                try:
                    entry = self._scan_partition(consumer, topic, dest, partition)
                except KafkaException as exc:
                    raise AdapterUnavailable(
                        f"reading the tail of {dest.log} failed: {exc}"
                    ) from exc
                if entry.message is not None and entry.newer_than(best):
                    best = entry
        return best

    def _scan_partition(
        self, consumer: Consumer, topic: Topic, dest: Destination, partition: int
    ) -> _Entry:
        tp = TopicPartition(dest.log, partition)
        low, high = consumer.get_watermark_offsets(tp, timeout=5)
        end = max(int(high), int(low))
        scanned = 0
        while end > low and scanned < self._settings.current_scan_limit:
            start = max(int(low), end - _WINDOW)
            found = self._read_window(consumer, topic, dest, partition, start, end)
            if found is not None:
                return found
            scanned += end - start
            end = start
        return _Entry(None)

    def _read_window(
        self,
        consumer: Consumer,
        topic: Topic,
        dest: Destination,
        partition: int,
        start: int,
        end: int,
    ) -> _Entry | None:
        """The newest matching record from ``start`` on (reading past ``end`` while
        records keep coming: the watermark may be short)."""
        consumer.assign([TopicPartition(dest.log, partition, start)])
        quiet = max(0.05, 3 * self._settings.fetch_wait_ms / 1000)
        best: _Entry | None = None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            messages = consumer.consume(500, quiet)
            if not messages:
                break
            for message in messages:
                if message.error() is not None:
                    continue
                record = record_from_message(message, self._mapping)
                if dest.per_path or record.topic == topic:
                    stamp = message.timestamp()[1]
                    best = _Entry(
                        StoredMessage(topic, record.body, record.headers, record.content_type),
                        partition,
                        record.offset,
                        stamp,
                    )
        consumer.unassign()
        return best

    def close(self) -> None:
        """Release the lookup consumer."""
        with self._scan_lock:
            consumer, self._consumer = self._consumer, None
        if consumer is not None:
            try:
                consumer.close()
            except Exception:
                log.debug("closing the current-message reader failed", exc_info=True)
