"""The readers of the ``adapters.logbase`` backend over confluent-kafka: the head reader and
the catch-up readers.

Readers never join a consumer group: each is a consumer with ``assign`` at chosen offsets
(no group membership means no rebalances and no group-join delay).  Offsets out of range
are reported (``auto.offset.reset=error``) and become ``RecordsLost``.

Head reader
    Follows every stream (topic partition) the gateway maps (``KafkaMapping.follows``).
    It looks for new topics and partitions every ``discovery_interval`` seconds (and at
    once when the adapter created a topic), so a wildcard subscription receives a topic
    created after it within that bound plus one fetch.  A stream found later is read from
    its beginning; at the very first start (no committed offsets in the head's consumer
    group ``head_group``) existing streams are followed from their end.  Its position is
    committed as that group's offsets.  Topic ids are compared every
    ``topic_id_check_interval`` seconds and after every lost connection: a topic that was
    deleted and created again (or emptied by a restart of a memory-only broker) starts
    from its beginning, reported as ``RecordsLost(stream, old position, new start)``.
    The broker requests of both are made by a thread of their own (``Discovery``): the
    head thread only applies what was found.

The position store is ``positions.py``, and ``backend.py`` the ``LogBackend`` that makes
all three.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from wsnmom.adapters.logbase.backend import EARLIEST, LogRecord, RecordsLost, StreamId
from wsnmom.topic_mapping.model import Topic

from .clients import client_hooks, message_topic, record_from_message
from .discovery import Discovery

if TYPE_CHECKING:
    from .backend import KafkaBackend

__all__ = ["KafkaHeadReader", "KafkaReader"]

log = logging.getLogger("wsnmom.adapters.kafka")

Item = LogRecord | RecordsLost
#: errors of a consumed message that mean "this offset is gone or never was"
_OUT_OF_RANGE = {KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET}
_BENIGN = {KafkaError._PARTITION_EOF, KafkaError.UNKNOWN_TOPIC_OR_PART}


class _Consuming:
    """What the head and catch-up readers share: a consumer and message conversion."""

    def __init__(self, backend: KafkaBackend, group: str) -> None:
        self._backend = backend
        self._mapping = backend.mapping
        config: dict[str, Any] = {
            **backend.settings.consumer(group),
            **client_hooks(backend.health, side=True),
        }
        self._consumer = Consumer(config)
        #: next offset expected per assigned stream
        self._next: dict[StreamId, int] = {}

    def _take(self, max_records: int, timeout: float) -> list[Message]:
        """Up to ``max_records`` messages, returning as soon as the first is there.

        ``Consumer.consume(n, timeout)`` waits until it has ``n`` messages or the timeout
        ran out, so a lone record waited the whole timeout (20 ms on the head) before it
        was dispatched.  Instead: what is queued now, else one ``poll`` that returns on
        the first arrival, then whatever came with it."""
        messages = self._consumer.consume(max_records, 0)
        if messages or timeout <= 0:
            return messages
        first = self._consumer.poll(timeout)
        if first is None:
            return []
        return [first, *self._consumer.consume(max_records - 1, 0)] if max_records > 1 else [first]

    def _earliest(self, stream: StreamId) -> int:
        low, _ = self._consumer.get_watermark_offsets(TopicPartition(*stream), timeout=5)
        return max(0, int(low))

    def _convert(self, messages: Sequence[Message]) -> list[Item]:
        out: list[Item] = []
        for message in messages:
            error = message.error()
            if error is None:
                record = record_from_message(message, self._mapping)
                self._next[record.stream] = record.offset + 1
                out.append(record)
                continue
            code = error.code()
            topic, partition = message.topic(), message.partition()
            if code in _OUT_OF_RANGE and topic is not None and partition is not None:
                out.append(self._lost((topic, partition)))
            elif code not in _BENIGN:
                log.debug("Kafka consumer: %s", error.str())
        return out

    def _lost(self, stream: StreamId) -> RecordsLost:
        """The broker no longer has the offset this reader asked for: continue from the
        first offset it has."""
        first = self._next.get(stream, 0)
        try:
            start = self._earliest(stream)
        except KafkaException:
            start = first
        self._next[stream] = start
        self._consumer.seek(TopicPartition(stream[0], stream[1], start))
        return RecordsLost(stream, first, start)

    def close(self) -> None:
        """Release the consumer."""
        try:
            self._consumer.close()
        except Exception:
            log.debug("closing a Kafka consumer failed", exc_info=True)


class KafkaReader(_Consuming):
    """``LogReader``: a consumer assigned to chosen offsets.  One thread at a time."""

    def assign(self, positions: Mapping[StreamId, int]) -> None:
        """Read exactly these streams from these offsets (``EARLIEST``: the first the
        stream still holds)."""
        self._next = {s: o for s, o in positions.items() if o >= 0}
        self._consumer.assign(
            [
                TopicPartition(log_, part, OFFSET_BEGINNING if offset == EARLIEST else offset)
                for (log_, part), offset in positions.items()
            ]
        )

    def poll(self, max_records: int, timeout: float) -> Sequence[Item]:
        """Up to ``max_records`` records, waiting up to ``timeout`` for the first."""
        return self._convert(self._take(max_records, timeout))


class KafkaHeadReader(_Consuming):
    """``HeadReader``: follows every mapped stream (see the module docstring).  Used by
    the engine's head thread only, except ``discover_soon``."""

    def __init__(self, backend: KafkaBackend) -> None:
        super().__init__(backend, backend.settings.head_group)
        self._settings = backend.settings
        self._pending: list[Item] = []
        #: the engine's "does a cursor want this topic" (``set_interest``), None: all
        self._wanted: Callable[[Topic], bool] | None = None
        self._full = False
        self._topic_ids: dict[str, str] = {}
        self._committed: dict[StreamId, int] = {}
        #: streams whose topic disappeared, and the position they had
        self._gone: dict[StreamId, int] = {}
        #: followed topic name -> when a look last found it (monotonic)
        self._seen: dict[str, float] = {}
        streams = self._followed_streams(self._backend.topics.refresh())
        committed = self._committed_offsets(streams)
        first_start = not committed
        ends = self._ends(streams) if first_start else {}
        for stream in streams:
            if stream in committed:
                self._next[stream] = committed[stream]
            elif first_start:
                self._next[stream] = ends.get(stream, 0)
            else:
                self._next[stream] = self._earliest(stream)
        names = {s[0] for s in streams}
        self._topic_ids = self._backend.topics.topic_ids(names)
        self._seen = dict.fromkeys(names, time.monotonic())
        self._assign_all()
        self._discovery = Discovery(
            backend.topics, backend.health, self._settings, self._mapping.follows, names
        )
        self._discovery.start()

    # -- discovery --------------------------------------------------------------------------
    def _followed_streams(self, listing: Mapping[str, int]) -> list[StreamId]:
        return [
            (name, p)
            for name, count in listing.items()
            if self._mapping.follows(name)
            for p in range(count)
        ]

    def _committed_offsets(self, streams: list[StreamId]) -> dict[StreamId, int]:
        if not streams:
            return {}
        found = self._consumer.committed([TopicPartition(*s) for s in streams], timeout=10)
        return {(tp.topic, tp.partition): tp.offset for tp in found if tp.offset >= 0}

    def _ends(self, streams: list[StreamId]) -> dict[StreamId, int]:
        out: dict[StreamId, int] = {}
        for stream in streams:
            try:
                _, high = self._consumer.get_watermark_offsets(TopicPartition(*stream), timeout=5)
            except KafkaException:
                continue
            out[stream] = max(0, int(high))
        return out

    def _assign_all(self) -> None:
        self._consumer.assign([TopicPartition(s[0], s[1], o) for s, o in self._next.items()])

    def discover_soon(self) -> None:
        """Look for new topics now (the adapter created one); the head applies what was
        found at a poll a moment later."""
        self._discovery.soon()

    def _discover(self) -> None:
        """Apply the discovery thread's newest look, if there is one."""
        look = self._discovery.take()
        if look is None:
            return
        listing = look.listing
        streams = set(self._followed_streams(listing))
        changed = False
        for stream in [s for s in self._next if s not in streams]:
            # the topic is gone (deleted, or the broker restarted empty) or lost a
            # partition: stop reading it, remember where we were
            self._gone[stream] = self._next.pop(stream)
            changed = True
        ids = look.ids or {}
        recreated = {name for name, tid in ids.items() if self._topic_ids.get(name, tid) != tid}
        for stream in sorted(streams):
            if stream in self._next and stream[0] not in recreated:
                continue
            old = self._next.pop(stream, None)
            if old is None:
                old = self._gone.pop(stream, None)
                if old is not None and stream[0] not in recreated and stream[0] in ids:
                    # back after a gap in the listing, same topic id: nothing was lost
                    self._next[stream] = old
                    changed = True
                    continue
            try:
                start = self._earliest(stream)
            except KafkaException:
                start = 0
            if old is not None and old != start:
                log.warning(
                    "Kafka topic %s was created again: following partition %d from its "
                    "beginning (offset %d) instead of offset %d",
                    stream[0],
                    stream[1],
                    start,
                    old,
                )
                self._pending.append(RecordsLost(stream, old, start))
                reset = self._backend.on_reset
                if reset is not None:
                    # what was made after the old topic was last seen knows the new one
                    reset(self._seen.get(stream[0], 0.0))
            self._next[stream] = start
            self._committed.pop(stream, None)
            changed = True
        self._topic_ids.update(ids)
        self._seen.update(dict.fromkeys({s[0] for s in streams}, look.taken))
        if changed:
            self._assign_all()

    # -- the HeadReader protocol ------------------------------------------------------------
    def set_interest(self, wanted: Callable[[Topic], bool]) -> None:
        """Leave out records whose topic ``wanted`` says no to (``SelectiveHeadReader``)."""
        self._wanted = wanted

    def more_waiting(self) -> bool:
        """Whether the last poll took as many messages as it was allowed."""
        return self._full

    def poll(self, max_records: int, timeout: float) -> Sequence[Item]:
        """The next records at the end of the followed streams: with ``set_interest``,
        of each topic no cursor wants only the newest per stream (see ``_select``)."""
        self._backend.head_polled = time.monotonic()
        self._discover()
        if self._pending:
            pending, self._pending = self._pending, []
            self._full = True
            return pending
        messages = self._take(max_records, timeout)
        self._full = len(messages) >= max_records
        items = self._convert(messages) if self._wanted is None else self._select(messages)
        observe = self._backend.observe
        if observe is not None and items:
            # only the newest record per topic and stream can be a topic's current message
            newest: dict[tuple[Topic, StreamId], LogRecord] = {}
            for item in items:
                if isinstance(item, LogRecord):
                    newest[(item.topic, item.stream)] = item
            for record in newest.values():
                observe(record)
        return items

    def _select(self, messages: Sequence[Message]) -> list[Item]:
        """``_convert`` for the head, leaving out what no cursor wants: a record of a
        topic ``wanted`` says no to is built only when it is the newest of its topic and
        stream in ``messages`` (the current-message map looks at it, and dispatching it
        moves the engine's head position past the ones left out).  The gateway reads its
        own publishes back here; under 100-message Notifies with nobody subscribed,
        building and dispatching a record for each was about a quarter of the gateway's
        Python time (py-spy)."""
        wanted = self._wanted
        assert wanted is not None
        answers: dict[Topic, bool] = {}
        known: list[tuple[Topic, dict[str, str] | None] | None] = []
        keep = [True] * len(messages)
        #: (topic, stream) -> index of its newest message left out so far
        newest: dict[tuple[Topic, StreamId], int] = {}
        for index, message in enumerate(messages):
            if message.error() is not None:
                known.append(None)
                continue
            found = message_topic(message, self._mapping)
            known.append(found)
            topic = found[0]
            yes = answers.get(topic)
            if yes is None:
                yes = answers[topic] = wanted(topic)
            if not yes:
                key = (topic, (message.topic() or "", message.partition() or 0))
                before = newest.get(key)
                if before is not None:
                    keep[before] = False
                newest[key] = index
        out: list[Item] = []
        nexts = self._next
        for index, message in enumerate(messages):
            routing = known[index]
            if routing is None:
                out.extend(self._convert((message,)))
                continue
            stream = (message.topic() or "", message.partition() or 0)
            nexts[stream] = (message.offset() or 0) + 1
            if keep[index]:
                out.append(record_from_message(message, self._mapping, routing))
        return out

    def positions(self) -> dict[StreamId, int]:
        """The next offset per followed stream."""
        return dict(self._next)

    def commit(self, positions: Mapping[StreamId, int]) -> None:
        """Commit ``positions`` as the head group's offsets (asynchronously: the head
        thread never waits for the broker)."""
        offsets = [
            TopicPartition(s[0], s[1], o)
            for s, o in positions.items()
            if o >= 0 and s in self._next and self._committed.get(s) != o
        ]
        if not offsets:
            return
        self._consumer.commit(offsets=offsets, asynchronous=True)
        for tp in offsets:
            self._committed[(tp.topic, tp.partition)] = tp.offset

    def close(self) -> None:
        """Commit what was given last (waiting, when the cluster answers) and release,
        within the adapter's close time once its close began (``Closing``)."""
        closing = self._backend.closing
        self._discovery.stop(closing.remaining(15.0))

        def commit_and_release() -> None:
            if self._committed and self._backend.health.available:
                try:
                    self._consumer.commit(
                        offsets=[TopicPartition(*s, o) for s, o in self._committed.items()],
                        asynchronous=False,
                    )
                except KafkaException as exc:
                    log.warning("committing the head position at close failed: %s", exc)
            _Consuming.close(self)

        closing.run(commit_and_release, "head-close", 60.0)
