"""adapters.logbase.cursor on its own: in-flight bookkeeping, the contiguous committed
prefix (at-least-once), redelivery marks after stop or rewind, ordered hand-out through the
outbox, and the handle's delegation, with an engine that records what the cursor asks.

These tests kill the mutants of ``adapters/logbase/cursor.py`` (``make mutation``); they
need no conftest fixture and no broker.  The cursor through a real log is covered by
tests/adapters/test_logbase_engine.py and the filelog/Kafka conformance runs.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from wsnmom.adapters.logbase.backend import LogRecord
from wsnmom.adapters.logbase.cursor import Cursor, CursorHandle, CursorReceived
from wsnmom.adapters.logbase.engine import CursorEngine
from wsnmom.core.adapter import QueueLimits, Received
from wsnmom.topic_mapping.model import PathPattern, Topic

A = ("t", 0)
B = ("t", 1)
NS = "urn:test:cursor"


class Engine:
    """What a cursor calls on its engine, recorded."""

    def __init__(self) -> None:
        self.pins: list[str] = []
        self.settles: list[tuple[Any, ...]] = []
        self.calls: list[tuple[Any, ...]] = []

    def may_pin(self, name: str) -> None:
        self.pins.append(name)

    def settle(self, cursor: Cursor, stream: Any, offset: int, gen: int, requeue: bool) -> None:
        self.settles.append((stream, offset, gen, requeue))

    def start_cursor(self, cursor: Cursor, on_message: Any, prefetch: int) -> None:
        self.calls.append(("start", cursor, on_message, prefetch))

    def stop_cursor(self, cursor: Cursor) -> None:
        self.calls.append(("stop", cursor))

    def depth(self, cursor: Cursor) -> int:
        self.calls.append(("depth", cursor))
        return 42

    def discard(self, cursor: Cursor, count: int, *, newest: bool) -> int:
        self.calls.append(("discard", cursor, count, newest))
        return count + 1

    def delete_subscription(self, name: str) -> None:
        self.calls.append(("delete", name))


def record(stream: Any, offset: int, path: str = "a") -> LogRecord:
    stamp = datetime(2026, 1, 2, tzinfo=UTC)
    return LogRecord(
        stream, offset, Topic(NS, (path,)), b"<m/>", {"h": "v"}, "text/xml", timestamp=stamp
    )


def cursor(
    patterns: tuple[PathPattern, ...] | None = (PathPattern(NS, ("a",)),),
    positions: dict[Any, int] | None = None,
) -> tuple[Cursor, Engine]:
    engine = Engine()
    c = Cursor(engine, "sub", patterns, QueueLimits(), positions or {})  # type: ignore[arg-type]
    return c, engine


def outbox(c: Cursor) -> list[CursorReceived]:
    got: list[CursorReceived] = []
    c.callback = got.append  # type: ignore[assignment]
    c.drain()
    return got


def offsets(got: list[CursorReceived]) -> list[int]:
    return [m._offset for m in got]


def test_a_new_cursor_is_detached_clean_and_pins_the_head() -> None:
    c, engine = cursor(positions={A: 3})
    assert engine.pins == ["sub"]
    assert (c.attached, c.dirty, c.started, c.deleted) == (False, False, False, False)
    assert c.positions == {A: 3}
    assert (c.unsettled, c.gen, c.lost, c.skip_oldest, c.prefetch) == (0, 0, 0, 0, 64)
    assert c.inflight == {} and c.floor == {} and c.redeliver_below == {}
    assert c.cap_budget is None and c.cap_until == {}
    assert c.callback is None and not c.queued


def test_detaching_and_dirtying_pin_attaching_and_cleaning_do_not() -> None:
    c, engine = cursor()
    c.attached = True
    c.dirty = False
    assert engine.pins == ["sub"]
    assert c.attached
    c.attached = False
    c.dirty = True
    assert engine.pins == ["sub", "sub", "sub"]
    assert c.dirty and not c.attached


def test_wants_matches_its_patterns_or_every_non_internal_topic() -> None:
    c, _ = cursor()
    assert c.wants(Topic(NS, ("a",)))
    assert not c.wants(Topic(NS, ("b",)))
    every, _ = cursor(patterns=None)
    assert every.wants(Topic(NS, ("b",)))
    assert not every.wants(Topic("urn:wsnmom:internal:x", ("b",)))
    two, _ = cursor(patterns=(PathPattern(NS, ("b",)), PathPattern(NS, ("a",))))
    assert two.wants(Topic(NS, ("a",)))


def test_the_window_is_full_at_prefetch_unsettled() -> None:
    c, _ = cursor()
    c.prefetch = 2
    c.hand_out(record(A, 0))
    assert not c.window_full
    c.hand_out(record(A, 1))
    assert c.window_full
    c.settle(A, 0)
    assert not c.window_full


def test_hand_out_tracks_in_flight_and_queues_the_message() -> None:
    c, engine = cursor()
    c.hand_out(record(A, 5))
    assert engine.pins == ["sub", "sub"]  # the first in flight of a stream pins
    c.hand_out(record(A, 6))
    assert engine.pins == ["sub", "sub"]
    c.hand_out(record(B, 0))
    assert engine.pins == ["sub", "sub", "sub"]
    assert c.unsettled == 3
    assert c.inflight == {A: {5: False, 6: False}, B: {0: False}}
    got = outbox(c)
    assert offsets(got) == [5, 6, 0]
    m = got[0]
    assert (m.topic, m.body, m.headers, m.content_type) == (
        Topic(NS, ("a",)),
        b"<m/>",
        {"h": "v"},
        "text/xml",
    )
    assert m.timestamp == datetime(2026, 1, 2, tzinfo=UTC)
    assert not m.redelivered
    assert repr(m) == f"<CursorReceived {Topic(NS, ('a',))} {A}@5>"


def test_committed_is_the_first_unsettled_or_the_read_position() -> None:
    c, _ = cursor()
    assert c.committed(A, 9) == 9
    c.hand_out(record(A, 5))
    c.hand_out(record(A, 6))
    assert c.committed(A, 9) == 5
    assert c.committed(A, 4) == 4
    assert c.committed(B, 7) == 7


def test_settling_commits_only_a_contiguous_prefix() -> None:
    c, _ = cursor()
    for offset in (5, 6, 7):
        c.hand_out(record(A, offset))
    assert c.settle(A, 6) is False  # behind an unsettled one: no move
    assert c.unsettled == 2
    assert c.committed(A, 8) == 5
    assert c.settle(A, 6) is False  # twice: ignored
    assert c.unsettled == 2
    assert c.settle(A, 5) is True  # 5 and 6 leave together
    assert c.inflight[A] == {7: False}
    assert c.committed(A, 8) == 7
    assert c.settle(A, 7) is True
    assert A not in c.inflight
    assert c.unsettled == 0
    assert c.committed(A, 8) == 8


def test_settling_what_is_not_in_flight_changes_nothing() -> None:
    c, _ = cursor()
    assert c.settle(A, 1) is False
    c.hand_out(record(A, 2))
    assert c.settle(A, 1) is False
    assert c.settle(B, 2) is False
    assert c.unsettled == 1


def test_received_settles_once_through_the_engine() -> None:
    c, engine = cursor()
    c.hand_out(record(A, 5))
    c.hand_out(record(A, 6))
    c.hand_out(record(A, 7))
    a, b, d = outbox(c)
    a.ack()
    a.ack()
    a.nack()
    b.nack()
    d.nack(requeue=False)
    assert engine.settles == [(A, 5, 0, False), (A, 6, 0, True), (A, 7, 0, False)]


def test_forget_inflight_of_a_detached_cursor_rewinds_to_the_first_unsettled() -> None:
    c, engine = cursor(positions={A: 9, B: 4})
    c.hand_out(record(A, 5))
    c.hand_out(record(A, 7))
    c.settle(A, 7)
    c.hand_out(record(B, 2))
    c.settle(B, 2)  # B settled completely: its position stays
    pins = len(engine.pins)
    c.forget_inflight({A: 100, B: 100})
    assert c.positions == {A: 5, B: 4}
    assert c.redeliver_below == {A: 8}
    assert (c.inflight, c.unsettled, c.gen) == ({}, 0, 1)
    assert not c.attached and c.dirty
    assert len(engine.pins) > pins
    assert outbox(c) == []


def test_forget_inflight_of_an_attached_cursor_starts_from_the_head_or_its_floor() -> None:
    c, _ = cursor(positions={A: 1})
    c.attached = True
    c.floor = {A: 50, B: 70}
    c.hand_out(record(A, 60))
    c.forget_inflight({A: 80, B: 60})
    assert c.positions == {A: 60, B: 70}
    assert c.redeliver_below == {A: 61}
    assert c.floor == {}
    assert not c.attached


def test_forget_inflight_keeps_the_highest_redelivery_mark() -> None:
    c, _ = cursor(positions={A: 0})
    c.redeliver_below = {A: 30}
    c.hand_out(record(A, 10))
    c.forget_inflight({})
    assert c.redeliver_below == {A: 30}
    assert c.positions == {A: 0}


def test_forget_inflight_takes_the_lower_of_position_and_first_in_flight() -> None:
    c, _ = cursor(positions={A: 3})
    c.hand_out(record(A, 10))
    c.forget_inflight({})
    assert c.positions == {A: 3}


def test_records_handed_out_again_are_marked_redelivered() -> None:
    c, _ = cursor(positions={A: 0})
    c.hand_out(record(A, 4))
    c.hand_out(record(A, 5))
    c.forget_inflight({})
    c.hand_out(record(A, 4))
    c.hand_out(record(A, 5))
    c.hand_out(record(A, 6))
    got = outbox(c)
    assert [m.redelivered for m in got] == [True, True, False]
    assert [m._gen for m in got] == [1, 1, 1]


def test_settling_a_message_of_an_older_generation_carries_its_generation() -> None:
    c, engine = cursor()
    c.hand_out(record(A, 4))
    old = outbox(c)[0]
    c.forget_inflight({})
    old.ack()
    assert engine.settles == [(A, 4, 0, False)]


def test_drain_hands_out_in_order_and_skips_older_generations() -> None:
    c, _ = cursor()
    c.hand_out(record(A, 1))
    c.gen += 1  # e.g. a stop raced with the queueing
    c.hand_out(record(A, 2))
    got = outbox(c)
    assert offsets(got) == [2]
    assert not c._draining


def test_drain_without_a_callback_drops_nothing_twice() -> None:
    c, _ = cursor()
    c.hand_out(record(A, 1))
    c.drain()
    assert outbox(c) == []


def test_a_second_drainer_leaves_the_delivery_to_the_first() -> None:
    c, _ = cursor()
    got: list[int] = []
    inner_returned = threading.Event()

    def callback(m: Received) -> None:
        got.append(m._offset)  # type: ignore[attr-defined]
        if len(got) == 1:
            c.hand_out(record(A, 2))
            c.drain()  # the first drainer is running: returns at once ...
            assert got == [1]  # ... without delivering (the first one does, in order)
            inner_returned.set()

    c.callback = callback
    c.hand_out(record(A, 1))
    c.drain()
    assert inner_returned.is_set()
    assert got == [1, 2]


def test_a_failing_callback_does_not_block_later_drains() -> None:
    c, _ = cursor()
    calls: list[int] = []

    def callback(m: Received) -> None:
        calls.append(m._offset)  # type: ignore[attr-defined]
        if len(calls) == 1:
            raise RuntimeError("subscriber failed")

    c.callback = callback
    c.hand_out(record(A, 1))
    c.hand_out(record(A, 2))
    with pytest.raises(RuntimeError):
        c.drain()
    assert not c._draining
    c.drain()
    assert calls == [1, 2]


# -- the handle --------------------------------------------------------------------------
def test_the_handle_delegates_to_the_engine() -> None:
    c, engine = cursor()
    handle = CursorHandle(c)
    assert handle.name == "sub"

    def on_message(m: Received) -> None:
        pass

    handle.start(on_message, prefetch=9)
    handle.stop()
    assert handle.depth() == 42
    assert handle.discard(3) == 4
    assert handle.discard(2, newest=True) == 3
    handle.delete()
    assert engine.calls == [
        ("start", c, on_message, 9),
        ("stop", c),
        ("depth", c),
        ("discard", c, 3, False),
        ("discard", c, 2, True),
        ("delete", "sub"),
    ]
    handle.start(on_message)
    assert engine.calls[-1][3] == 64


def test_the_handle_is_push_only_and_reports_losses() -> None:
    c, _ = cursor()
    handle = CursorHandle(c)
    with pytest.raises(NotImplementedError):
        handle.pull(1)
    with pytest.raises(NotImplementedError):
        handle.take(1)
    c.lost = 3
    assert handle.lost() == 3
    assert repr(handle) == "<CursorHandle sub detached started=False unsettled=0>"
    c.attached = True
    c.started = True
    c.hand_out(record(A, 1))
    assert repr(handle) == "<CursorHandle sub attached started=True unsettled=1>"


def test_the_first_record_of_a_stream_is_not_redelivered() -> None:
    c, _ = cursor()
    c.hand_out(record(A, 0))
    (m,) = outbox(c)
    assert m.redelivered is False


def test_a_cursor_keeps_its_limits() -> None:
    engine = Engine()
    limits = QueueLimits(max_messages=5)
    c = Cursor(engine, "sub", None, limits, {})  # type: ignore[arg-type]
    assert c.limits is limits


def test_every_forget_is_a_new_generation() -> None:
    c, _ = cursor()
    c.forget_inflight({})
    c.forget_inflight({})
    assert c.gen == 2


def test_the_engines_commit_pass_reads_when_the_first_unsettled_record_was_seen() -> None:
    """``pin_seen`` is the engine's (``CursorEngine._pins_too_long``, run here on the
    cursor with the engine's state stood in): a new cursor has seen nothing, and detaching
    forgets what it saw, so the time a record pins the head's commit starts again."""
    c, _ = cursor()
    c.attached = True
    c.inflight = {A: OrderedDict({5: False})}
    engine = SimpleNamespace(_head={A: 6}, pin_seconds=10.0, pin_records=100)
    assert CursorEngine._pins_too_long(engine, c, 100.0) is False  # type: ignore[arg-type]
    assert CursorEngine._pins_too_long(engine, c, 111.0) is True  # type: ignore[arg-type]
    c.attached = False
    c.attached = True
    assert CursorEngine._pins_too_long(engine, c, 112.0) is False  # type: ignore[arg-type]
    assert CursorEngine._pins_too_long(engine, c, 121.0) is False  # type: ignore[arg-type]
    assert CursorEngine._pins_too_long(engine, c, 122.0) is True  # type: ignore[arg-type]
