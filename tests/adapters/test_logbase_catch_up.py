"""A cursor stopped and started (what the delivery budget's parking does, as often as
several times a second) while a catch-up reader reads for it (adapters/logbase/engine.py,
``_catch_up_one``).

Stopping gives back everything in flight: the cursor's position goes back to its first
unsettled record.  A catch-up reader that read beyond that position meanwhile must not
hand out what it read there (the records in between would be skipped and, once the later
ones were acknowledged, lost: this is what kept parking off the log adapters), must
notice the move even when its next poll finds nothing, and must be the only reader of
that cursor while it serves it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from wsnmom.adapters.logbase.backend import LogRecord, RecordsLost, StreamId
from wsnmom.adapters.logbase.cursor import CursorHandle
from wsnmom.core.codec import decode

from tests.adapters.test_logbase_engine import spec
from tests.adapters.test_logbase_reset import STREAM, engine_with_behind_cursor, record
from wsnmom.testing.conformance import Collector


class _LogReader:
    """A catch-up reader over records 0..9 of ``STREAM`` that honours ``assign``, ``batch``
    records a poll; ``hooks[n]`` runs at the start of poll ``n`` (0-based), before it
    reads (what other threads do while the reader waits for the middleware)."""

    def __init__(self, batch: int, hooks: Mapping[int, Callable[[], None]] | None = None) -> None:
        self.log = [record(i, b"r%d" % i) for i in range(10)]
        self.batch = batch
        self.hooks = dict(hooks or {})
        self.position = 0
        self.polls = 0
        self.assigned: list[dict[StreamId, int]] = []

    def assign(self, positions: Mapping[StreamId, int]) -> None:
        self.assigned.append(dict(positions))
        self.position = positions.get(STREAM, 0)

    def poll(self, max_records: int, timeout: float) -> Sequence[LogRecord | RecordsLost]:
        hook = self.hooks.pop(self.polls, None)
        self.polls += 1
        if hook is not None:
            hook()
        out = self.log[self.position : self.position + min(self.batch, max_records)]
        self.position += len(out)
        return out

    def close(self) -> None:
        return None


def _behind() -> tuple[Any, Any, CursorHandle, Collector]:
    """An engine without catch-up threads and a started cursor at offset 5 of ``STREAM``
    whose head is at 10, with a subscriber that settles nothing (a channel that parks
    holds its messages unsettled)."""
    engine, cursor, _ = engine_with_behind_cursor()
    got = Collector(ack=False)
    with engine.lock:
        cursor.callback = got
    return engine, cursor, CursorHandle(cursor), got


def _restart(handle: CursorHandle, got: Collector) -> Callable[[], None]:
    """Stop and start the cursor, as parking and unparking a channel do."""

    def act() -> None:
        got.received.clear()  # what the subscriber holds is forgotten, unsettled
        handle.stop()
        handle.start(got, prefetch=100)

    return act


def _serve(engine: Any, cursor: Any, reader: _LogReader, turns: int = 3) -> None:
    """Give ``cursor`` to the catch-up reader until it rides on the head again."""
    for _ in range(turns):
        engine._catch_up_one(reader, [cursor], None)
        if cursor.attached:
            return


def test_records_read_past_a_stop_and_start_are_not_handed_out() -> None:
    """The reader handed out 5 and 6 and is reading 7 and 8 when the cursor is stopped
    and started: 5 and 6 come again before 7, nothing is skipped (on the engine before
    the rewind guard, 7..9 came and 5 and 6 never did)."""
    engine, cursor, handle, got = _behind()
    try:
        reader = _LogReader(batch=2, hooks={1: _restart(handle, got)})
        _serve(engine, cursor, reader)
        assert cursor.attached
        assert got.bodies() == [b"r%d" % i for i in range(5, 10)]
    finally:
        engine.close()


def test_a_stop_and_start_noticed_on_an_empty_poll_is_served_at_once() -> None:
    """The reader read up to the end (5..9) when the cursor is stopped and started: its
    next poll finds nothing new, yet the cursor is back at 5.  The same turn reads 5..9
    again and re-attaches, instead of idling through its slice of empty polls (20 polls
    of ``poll_timeout``: 2 s for nothing, per stop, which under parking starved the
    other cursors waiting for a catch-up reader)."""
    engine, cursor, handle, got = _behind()
    try:
        reader = _LogReader(batch=10, hooks={1: _restart(handle, got)})
        engine._catch_up_one(reader, [cursor], None)
        assert got.bodies() == [b"r%d" % i for i in range(5, 10)]
        assert cursor.attached
        assert reader.polls < engine.catch_up_slice
    finally:
        engine.close()


def test_a_cursor_is_read_by_one_catch_up_reader_at_a_time() -> None:
    """Stopped and started while a reader waits for the middleware, the cursor is queued
    again; another catch-up thread must not read it meanwhile (the two readers raced and
    each threw away what the other had moved past).  The reader serving it takes the
    new position itself."""
    engine, cursor, handle, got = _behind()
    polling, release = threading.Event(), threading.Event()

    def wait_for_release() -> None:
        polling.set()
        assert release.wait(10)

    try:
        first = _LogReader(batch=2, hooks={1: wait_for_release})
        serving = threading.Thread(target=engine._catch_up_one, args=(first, [cursor], None))
        serving.start()
        assert polling.wait(10)
        _restart(handle, got)()
        second = _LogReader(batch=10)
        while not engine._catch_up.empty():  # what another catch-up thread would take
            queued = engine._catch_up.get_nowait()
            engine._catch_up_one(second, [queued], None)
        assert second.polls == 0
        release.set()
        serving.join(10)
        if not cursor.attached:
            _serve(engine, cursor, first)
        assert cursor.attached
        assert got.bodies() == [b"r%d" % i for i in range(5, 10)]
    finally:
        release.set()
        engine.close()


def test_cursors_queued_at_the_same_positions_are_read_once_for_all() -> None:
    """After a failover every taken-over cursor of a topic is behind at the same offset:
    one reader takes them together (``_gather``), assigns and polls once for all, and
    each gets every record; a cursor queued at another position is left for its own
    turn, and a member whose window fills leaves the group while the others read on."""
    engine, cursor, _, got = _behind()  # "c" at 5 of 10, settles nothing
    try:
        members = [cursor]
        collectors = [got]
        for name, position, prefetch in (("b", 5, 100), ("small", 5, 2), ("far", 2, 100)):
            other = engine.subscription(spec(name, "t"))._cursor
            with engine.lock:
                other.positions = {STREAM: position}
            collectors.append(Collector(ack=False))
            other_handle = CursorHandle(other)
            other_handle.start(collectors[-1], prefetch=prefetch)
            members.append(other)
        small, far = members[2], members[3]
        queued = engine._catch_up.get_nowait()  # what a catch-up thread takes first
        assert queued is cursor
        group = engine._gather(queued)
        assert group == members[:3]
        reader = _LogReader(batch=10)
        engine._catch_up_one(reader, group, None)
        assert reader.assigned == [{STREAM: 5}]
        assert (
            collectors[0].bodies() == collectors[1].bodies() == [b"r%d" % i for i in range(5, 10)]
        )
        assert cursor.attached and members[1].attached
        assert collectors[2].bodies() == [b"r5", b"r6"] and not small.attached  # window full
        # the far cursor waits in the queue for a turn of its own, from its own position
        assert engine._catch_up.get_nowait() is far
        engine._catch_up_one(reader, [far], None)
        assert collectors[3].bodies() == [b"r%d" % i for i in range(2, 10)]
    finally:
        engine.close()


def test_every_cursors_copy_of_a_record_decodes_to_one_notification() -> None:
    """Parsing each subscription's copy of a record was most of the survivors' delivery
    work after a failover (docs/scale-out.md, "Failover at scale"): the copies share
    one ``SharedMessage``, so core decodes the record once; another record has its own."""
    engine, _, _, got = _behind()
    try:
        other = engine.subscription(spec("b", "t"))._cursor
        with engine.lock:
            other.positions = {STREAM: 5}
        also = Collector(ack=False)
        CursorHandle(other).start(also, prefetch=100)
        group = engine._gather(engine._catch_up.get_nowait())
        engine._catch_up_one(_LogReader(batch=10), group, None)
        mine, theirs = got.received, also.received
        assert (
            [m.body for m in mine] == [m.body for m in theirs] == [b"r%d" % i for i in range(5, 10)]
        )
        assert decode(mine[0]) is decode(theirs[0])
        assert b"r5" in decode(mine[0]).payload  # not XML: wrapped as a native message
        assert decode(mine[1]) is not decode(mine[0])
        assert mine[0] is not theirs[0]  # settled apart: one copy per cursor
    finally:
        engine.close()


def test_group_members_that_move_apart_are_read_for_apart() -> None:
    """Two cursors read together from 5 (``_gather``); after the first poll one of them
    is stopped and started (its position goes back to 5) while the other reads on from 7.
    From then on one reading cannot serve both: the moved member leaves the group
    (``_together``, ``Cursor.recheck``), gets nothing more from this turn and is queued
    for a turn of its own, which reads from where it is now; the other is read for
    without the reader being pointed anywhere else.  Kept in the group, the moved member
    would sit through the other's reads, then be read for again in the same turn."""
    engine, stayed, _, stayed_got = _behind()  # "c" at 5 of 10, settles nothing
    try:
        moved = engine.subscription(spec("b", "t"))._cursor
        with engine.lock:
            moved.positions = {STREAM: 5}
        moved_got = Collector(ack=False)
        moved_handle = CursorHandle(moved)
        moved_handle.start(moved_got, prefetch=100)
        group = engine._gather(engine._catch_up.get_nowait())
        assert group == [stayed, moved]
        reader = _LogReader(batch=2, hooks={1: _restart(moved_handle, moved_got)})
        engine._catch_up_one(reader, group, None)
        assert stayed_got.bodies() == [b"r%d" % i for i in range(5, 10)]
        assert stayed.attached
        # one assignment for the whole turn: nothing was read again for the moved one
        assert reader.assigned == [{STREAM: 5}]
        assert moved_got.bodies() == [] and not moved.attached
        assert engine._catch_up.get_nowait() is moved  # its own turn, queued
        engine._catch_up_one(reader, [moved], None)
        assert reader.assigned[1:] == [{STREAM: 5}]
        assert moved_got.bodies() == [b"r%d" % i for i in range(5, 10)]
        assert moved.attached
    finally:
        engine.close()
