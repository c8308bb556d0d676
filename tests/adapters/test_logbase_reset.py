"""The cursor engine's one reset rule (adapters/logbase/engine.py ``_stream_restarted``):
a log that starts again (re-created, or a memory-only broker restarted empty) is read
again from its first record by every cursor, whoever noticed the reset, and a catch-up
reader that went on reading from the old positions meanwhile (tansu answers a fetch
beyond the end with nothing, then with the new log's records once it grows past the old
position) has its records dropped instead of handed out beyond records never read."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from wsnmom.adapters.logbase.backend import LogRecord, RecordsLost, StreamId
from wsnmom.adapters.logbase.engine import CursorEngine

from tests.adapters.test_logbase_engine import _MemoryBackend, _MemoryLog, spec, topic
from wsnmom.testing.conformance import Collector

STREAM = ("t", 0)


def record(offset: int, body: bytes) -> LogRecord:
    return LogRecord(STREAM, offset, topic("t"), body, {}, "application/xml", None)


class _ScriptedReader:
    """A catch-up reader answering each poll from a script; a step may be a callable run
    first (what another thread does between two polls)."""

    def __init__(self, steps: list[Any]) -> None:
        self.steps = steps
        self.assigned: list[dict[StreamId, int]] = []

    def assign(self, positions: Mapping[StreamId, int]) -> None:
        self.assigned.append(dict(positions))

    def poll(self, max_records: int, timeout: float) -> Sequence[LogRecord | RecordsLost]:
        if not self.steps:
            return []
        step = self.steps.pop(0)
        if callable(step):
            step()
            step = self.steps.pop(0) if self.steps else []
        return step  # type: ignore[no-any-return]

    def close(self) -> None:
        return None


def engine_with_behind_cursor() -> tuple[CursorEngine, Any, Collector]:
    """An engine without catch-up threads and a started cursor at offset 5 of a stream
    whose head is at 10 (so it waits for a catch-up reader)."""
    engine = CursorEngine(_MemoryBackend(_MemoryLog()), catch_up_readers=0)  # type: ignore[arg-type]
    engine.start()
    handle = engine.subscription(spec("c", "t"))
    cursor = handle._cursor  # type: ignore[attr-defined]
    with engine.lock:
        engine._head[STREAM] = 10
        cursor.positions = {STREAM: 5}
    got = Collector()
    handle.start(got, prefetch=100)
    assert not cursor.attached
    return engine, cursor, got


def run(engine: CursorEngine, cursor: Any, reader: _ScriptedReader) -> None:
    engine._catch_up_one(reader, [cursor], None)  # type: ignore[arg-type]


def restarted(engine: CursorEngine) -> Callable[[], None]:
    def act() -> None:
        with engine.lock:
            engine._stream_restarted(STREAM, 0)

    return act


def test_records_read_from_old_positions_after_a_reset_are_not_handed_out() -> None:
    engine, cursor, got = engine_with_behind_cursor()

    def head_at_new_end() -> None:
        with engine.lock:  # the head reader read the new log to its end meanwhile
            engine._head[STREAM] = 9

    try:
        new_log = [record(i, b"new%d" % i) for i in range(9)]
        reader = _ScriptedReader(
            [
                [record(5, b"old5"), record(6, b"old6")],
                restarted(engine),  # the head notices the log started again
                # the reader still reads from offset 7: by now the new log got that far
                [record(7, b"new7"), record(8, b"new8")],
                head_at_new_end,
                new_log,
            ]
        )
        run(engine, cursor, reader)
        # new7 and new8 were dropped; the same reader went back to the new log's start
        # and read it whole
        assert reader.assigned[-1][STREAM] == 0
        assert got.bodies() == [b"old5", b"old6"] + [b"new%d" % i for i in range(9)]
        assert cursor.attached
    finally:
        engine.close()


def test_a_reset_noticed_by_a_catch_up_reader_rewinds_every_cursor() -> None:
    engine, cursor, got = engine_with_behind_cursor()
    try:
        other = engine.subscription(spec("other", "t"))._cursor  # type: ignore[attr-defined]
        with engine.lock:
            other.positions = {STREAM: 8}
            other.dirty = True
        # Apache Kafka answers "offset out of range" past the end of the new log; the
        # reader reports it as records lost from 5 with the log starting at 0
        reader = _ScriptedReader([[RecordsLost(STREAM, 5, 0)]])
        run(engine, cursor, reader)
        assert cursor.lost == 0  # a reset loses nothing: the new log is read whole
        assert cursor.positions[STREAM] == 0
        assert other.positions[STREAM] == 0
        with engine.lock:
            engine._head[STREAM] = 2
        run(engine, cursor, _ScriptedReader([[record(0, b"new0"), record(1, b"new1")]]))
        assert got.bodies() == [b"new0", b"new1"]
    finally:
        engine.close()


def test_records_read_before_a_rewind_are_not_handed_out_past_it() -> None:
    """The same guard for a rewind (a nack with requeue) while a catch-up reader reads:
    what it read beyond the rewound position is dropped, so the rewound records come
    again instead of being skipped."""
    engine, cursor, _ = engine_with_behind_cursor()
    got = Collector(ack=False)
    with engine.lock:
        cursor.callback = got
    try:

        def nack_first() -> None:
            got.received[0].nack(requeue=True)

        reader = _ScriptedReader(
            [
                [record(5, b"r5"), record(6, b"r6")],
                nack_first,
                [record(7, b"r7"), record(8, b"r8")],
            ]
        )
        run(engine, cursor, reader)
        assert got.bodies() == [b"r5", b"r6"]
        assert cursor.positions[STREAM] == 5  # 5 and 6 come again
    finally:
        engine.close()
