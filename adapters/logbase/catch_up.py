"""The cursor engine's catch-up readers: a detached cursor is queued, and one of
``catch_up_readers`` threads reads its streams from its positions, a slice of batches at a
time, until it reaches the head and re-attaches; skips and caps (``discard``) are applied
as it reads (see :mod:`wsnmom.adapters.logbase.engine`).  Queued cursors that start at
the same positions of the same streams are read for together: one assignment and one
fetch per batch, each record applied to each of them."""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Mapping, Sequence

from .backend import (
    EARLIEST,
    LogReader,
    LogRecord,
    RecordsLost,
    StreamId,
)
from .cursor import Cursor
from .parts import EngineParts

#: the engine's logger (one name for all its parts)
log = logging.getLogger(f"{__package__}.engine")


class CatchUp(EngineParts):
    """The catch-up side of a :class:`~wsnmom.adapters.logbase.engine.CursorEngine`."""

    def _relevant(self, cursor: Cursor, stream: StreamId) -> bool:
        return self.backend.may_carry(stream[0], cursor.patterns)

    def _at_head(self, cursor: Cursor) -> bool:
        """Whether ``cursor`` has read up to the head in every stream it reads."""
        for stream, head in self._head.items():
            if not self._relevant(cursor, stream):
                continue
            position = cursor.positions.get(stream)
            if position is None or position == EARLIEST:
                position = 0
            if position < head:
                return False
        return True

    def _try_attach(self, cursor: Cursor) -> bool:
        """Attach ``cursor`` when it has read up to the head in every stream it reads
        (hold the lock).  Skips and caps still pending then have nothing left to apply
        to (the depth was an estimate) and are dropped; a paused cursor stays detached."""
        if cursor.attached:
            return True
        if not self._at_head(cursor):
            return False
        cursor.skip_oldest = 0
        cursor.cap_budget = None
        cursor.cap_until = {}
        if not cursor.started:
            return False
        cursor.attached = True
        cursor.floor = {s: p for s, p in cursor.positions.items() if p >= 0}
        self._attached_meanwhile.add(cursor.name)
        if self.shared:
            # another instance may deliver it next: its saved positions stay, and are
            # saved again while they change
            cursor.own_positions = True
            self.may_pin(cursor.name)
        elif cursor.name in self._stored:
            self._to_delete.add(cursor.name)
        cursor.dirty = False
        return True

    def _queue_catch_up(self, cursor: Cursor, *, skipping: bool = False) -> None:
        """Give ``cursor`` to a catch-up reader (started cursors; paused ones only to
        apply a ``discard``).  A cursor a reader serves now is not queued: that reader
        looks at it again when its turn ends (``Cursor.recheck``)."""
        if cursor.serving:
            cursor.recheck = True
            return
        wanted = cursor.started or (
            skipping and (cursor.skip_oldest > 0 or cursor.cap_budget is not None)
        )
        if wanted and not cursor.queued and not cursor.deleted:
            cursor.queued = True
            self._catch_up.put(cursor)

    def _detach_at(self, cursor: Cursor, stream: StreamId, offset: int) -> None:
        """The head could not hand ``cursor`` the record at ``offset`` (window full): it
        continues from there with a catch-up reader (hold the lock)."""
        positions = dict(self._head)
        for s, floor in cursor.floor.items():
            positions[s] = max(positions.get(s, floor), floor)
        positions[stream] = offset
        cursor.positions = positions
        cursor.attached = False
        cursor.floor = {}
        cursor.dirty = True

    def _catch_up_loop(self) -> None:
        reader: LogReader | None = None
        assigned: dict[StreamId, int] | None = None
        try:
            while True:
                cursor = self._catch_up.get()
                if cursor is None:
                    return
                group = self._gather(cursor)
                if reader is None:
                    reader = self.backend.reader()
                    assigned = None
                try:
                    assigned = self._catch_up_one(reader, group, assigned)
                except Exception:
                    log.exception(
                        "catching up subscription(s) %s failed; retrying",
                        ", ".join(c.name for c in group),
                    )
                    try:
                        reader.close()
                    except Exception:
                        log.debug("closing a reader failed", exc_info=True)
                    reader, assigned = None, None
                    time.sleep(0.5)
                    with self.lock:
                        for member in group:
                            member.queued = False
                            self._queue_catch_up(member)
        finally:
            if reader is not None:
                reader.close()

    def _gather(self, leader: Cursor) -> list[Cursor]:
        """``leader`` and the cursors queued behind it that read the same streams from
        the same positions (after a failover, every subscription of a topic the dead
        instance delivered is one record behind at the same offset): one reader reads
        for all of them at once.  At most ``catch_up_group`` queued cursors are looked
        at; the others are queued again, in their order."""
        group = [leader]
        if self.catch_up_group <= 1:
            return group
        others: list[Cursor | None] = []
        with self.lock:
            start = self._assignment(leader)
            for _ in range(self.catch_up_group - 1):
                try:
                    item = self._catch_up.get_nowait()
                except queue.Empty:
                    break
                if item is None:  # closing: the sentinel goes back for a reader to take
                    others.append(item)
                    break
                if not item.serving and self._assignment(item) == start:
                    group.append(item)
                else:
                    others.append(item)
            for item in others:
                self._catch_up.put(item)
        return group

    def _catch_up_one(
        self, reader: LogReader, group: list[Cursor], assigned: dict[StreamId, int] | None
    ) -> dict[StreamId, int] | None:
        """One turn of a catch-up reader for the cursors of ``group`` (see
        ``_read_turn``); returns the reader's assignment afterwards (None: unknown,
        assign afresh next time).

        A cursor has at most one reader at a time (``Cursor.serving``): it may be stopped,
        started, rewound or reset while its reader waits for the middleware, and is then
        queued again, but a second reader taking it meanwhile would read from positions
        the first one is about to move past.  Whatever asked for another turn during
        this one gets it when this one ends (``Cursor.recheck``)."""
        served: list[Cursor] = []
        with self.lock:
            for cursor in group:
                cursor.queued = False
                if cursor.serving:  # not queued while served; kept for safety
                    cursor.recheck = True
                    continue
                cursor.serving = True
                cursor.recheck = False
                served.append(cursor)
        try:
            for cursor in served:
                self._retry_bury(cursor)
            return self._read_turn(reader, served, assigned) if served else assigned
        finally:
            with self.lock:
                for cursor in served:
                    cursor.serving = False
                    if cursor.recheck:
                        cursor.recheck = False
                        if not cursor.attached:
                            self._queue_catch_up(cursor, skipping=True)

    def _ready_to_read(self, cursor: Cursor) -> bool:
        """Whether ``cursor`` has reading to do now (hold the lock); attaches it when it
        is at the head."""
        if not self._running or cursor.attached or cursor.deleted:
            return False
        if not self._has_work(cursor) or cursor.window_full:
            return False
        return not self._try_attach(cursor)

    def _read_turn(
        self, reader: LogReader, group: list[Cursor], assigned: dict[StreamId, int] | None
    ) -> dict[StreamId, int] | None:
        """Read for the cursors of ``group`` until each attaches, its window fills or the
        slice ends; one assignment and one poll serve them all, and each record read is
        applied to each of them (``_read_for``: its patterns, skips and caps, its window).

        Before every poll the reader is pointed at the group's positions if they are
        not where it continues from (``_assignment``).  A cursor whose positions moved
        meanwhile (it was stopped: what was in flight is given back, so its position
        went back to its first unsettled record; rewound, reset or rebound; or the head
        follows a stream the reader does not) leaves the group and is queued again:
        records read before such a move are dropped for it, never handed out beyond
        records it still needs."""
        with self.lock:
            active = [c for c in group if self._ready_to_read(c)]
        if not active:
            return assigned
        for _ in range(self.catch_up_slice):
            with self.lock:
                active, wanted = self._together(active, assigned)
                if not active:
                    return None
            if assigned is None or wanted != assigned:
                reader.assign(wanted)
                assigned = dict(wanted)
            records = reader.poll(self.batch, self.poll_timeout)
            with self.lock:
                if not self._running:
                    return None
                active = [c for c in active if not c.deleted and not c.attached]
                if not active:
                    return None
                if not records:
                    active = [c for c in active if not self._done_at_end(c)]
                    if not active:
                        return assigned
                    continue
                touched, active = self._apply(active, assigned, records)
                for r in records:
                    assigned[r.stream] = r.offset + 1 if isinstance(r, LogRecord) else r.next
            for cursor in self._fair(touched):
                cursor.drain()
                self._retry_bury(cursor)  # what it skipped now, or again once it is due
            if not active:
                return None  # positions moved back: assign afresh next time
        with self.lock:
            for cursor in active:
                if not cursor.attached and not self._try_attach(cursor):
                    self._queue_catch_up(cursor, skipping=True)
        return None

    def _fair(self, touched: list[Cursor]) -> list[Cursor]:
        """The order to hand a poll's records to the subscribers of a group: it starts
        one member further at every poll.  Whoever drains first may take the delivery
        budget's room (``core.delivery_budget``) and the others park, stop and start
        again: in a fixed order the first member took it every time and the others
        never delivered."""
        if len(touched) < 2:
            return touched
        self._drains += 1
        first = self._drains % len(touched)
        return touched[first:] + touched[:first]

    def _together(
        self, active: list[Cursor], assigned: Mapping[StreamId, int] | None
    ) -> tuple[list[Cursor], dict[StreamId, int]]:
        """The members of a group that still read the same streams from the same
        positions, and those positions (hold the lock): where the reader continues
        from if any member is there, else the first member's.  The others leave the
        group and get a turn of their own (``Cursor.recheck``)."""
        starts = [self._assignment(c) for c in active]
        wanted = next((s for s in starts if s == assigned), starts[0])
        kept: list[Cursor] = []
        for cursor, start in zip(active, starts, strict=True):
            if start == wanted:
                kept.append(cursor)
            else:
                cursor.recheck = True
        return kept, wanted

    def _done_at_end(self, cursor: Cursor) -> bool:
        """An empty poll for ``cursor`` (hold the lock): True when its turn ends (it
        attached, has nothing to do, or a spent cap jumped and queued it again)."""
        if self._try_attach(cursor) or not self._has_work(cursor):
            return True
        return self._apply_cap_at_head(cursor)

    def _apply(
        self,
        active: list[Cursor],
        assigned: Mapping[StreamId, int],
        records: Sequence[LogRecord | RecordsLost],
    ) -> tuple[list[Cursor], list[Cursor]]:
        """Apply one poll's ``records`` to every member of a group (hold the lock);
        returns the members given records and those that read on.  A member whose
        positions moved since the reader was pointed (``_moved_meanwhile``) gets none of
        them (read from where it no longer is: dropped) and reads on from where it is
        now (``_together``); one that must stop (window full, a jump) leaves."""
        touched: list[Cursor] = []
        kept: list[Cursor] = []
        for cursor in active:
            if self._moved_meanwhile(cursor, assigned, records):
                kept.append(cursor)
                continue
            touched.append(cursor)
            stopped = self._read_for(cursor, records)
            if not stopped and not cursor.window_full:
                kept.append(cursor)
        return touched, kept

    @staticmethod
    def _has_work(cursor: Cursor) -> bool:
        """A started cursor reads; a paused one only while it has records to skip."""
        return cursor.started or cursor.skip_oldest > 0 or cursor.cap_budget is not None

    def _assignment(self, cursor: Cursor) -> dict[StreamId, int]:
        """The streams ``cursor`` reads and where (hold the lock)."""
        out: dict[StreamId, int] = {}
        streams = set(self._head) | set(cursor.positions)
        for stream in streams:
            if not self._relevant(cursor, stream):
                continue
            # a stream the cursor has no position in appeared after it was created (or
            # left the head): everything on it is new to the cursor
            out[stream] = cursor.positions.get(stream, 0)
        return out

    def _apply_cap_at_head(self, cursor: Cursor) -> bool:
        """A ``discard(newest=True)`` whose budget is spent: jump (hold the lock).  Not for
        a cursor that dead-letters what it drops: it reads on to ``cap_until`` (an empty
        poll only means the next records were not fetched yet), so that ``_read_for``
        hands each dropped record to the dead letters before the cap clears."""
        if cursor.dead_letters is not None and cursor.bury is not None:
            return False
        if cursor.cap_budget is not None and cursor.cap_budget <= 0:
            for stream, offset in cursor.cap_until.items():
                if cursor.positions.get(stream, 0) < offset:
                    cursor.positions[stream] = offset
            cursor.cap_budget = None
            cursor.cap_until = {}
            cursor.dirty = True
            self._queue_catch_up(cursor, skipping=True)
            return True
        return False

    @staticmethod
    def _moved_meanwhile(
        cursor: Cursor, assigned: Mapping[StreamId, int], records: Sequence[LogRecord | RecordsLost]
    ) -> bool:
        """Whether ``cursor``'s position in a stream of ``records`` is no longer where the
        reader that read them continued from (hold the lock)."""
        streams = {item.stream for item in records}
        return any(s in assigned and cursor.positions.get(s, 0) != assigned[s] for s in streams)

    def _read_for(self, cursor: Cursor, records: Sequence[LogRecord | RecordsLost]) -> bool:
        """Apply records a catch-up reader read for ``cursor`` (hold the lock); True when
        it must stop (window full, or a jump moved its positions)."""
        for item in records:
            if isinstance(item, RecordsLost) and item.next < item.first:
                # the log ends below where this reader asked: it started again
                self._stream_restarted(item.stream, item.next)
                self._queue_catch_up(cursor)
                return True
            if isinstance(item, RecordsLost):
                self._lost(cursor, item)
                continue
            stream = item.stream
            position = cursor.positions.get(stream, 0)
            if item.offset < position:
                continue
            if not cursor.wants(item.topic):
                cursor.positions[stream] = item.offset + 1
                cursor.dirty = True
                continue
            if cursor.skip_oldest:
                cursor.skip_oldest -= 1
                self._drop(cursor, item)
                continue
            buries = cursor.dead_letters is not None and cursor.bury is not None
            if cursor.cap_budget is not None and cursor.cap_budget <= 0:
                if not buries:
                    self._apply_cap_at_head(cursor)
                    return True
                if item.offset < cursor.cap_until.get(stream, 0):
                    self._drop(cursor, item)  # read, not jumped past: dead-lettered
                    self._cap_passed(cursor)
                    continue
                # past the cap in this stream (it arrived after the discard): kept
            if not cursor.started or cursor.window_full:
                return True  # paused: only skipping; full: wait for settles
            if cursor.cap_budget is not None and cursor.cap_budget > 0:
                cursor.cap_budget -= 1
                if cursor.cap_budget <= 0 and buries:
                    self._cap_passed(cursor)
            cursor.positions[stream] = item.offset + 1
            cursor.dirty = True
            cursor.hand_out(item)
        return False

    @staticmethod
    def _drop(cursor: Cursor, item: LogRecord) -> None:
        """Skip ``item`` for a ``discard`` (hold the lock): with a dead-letter topic it is
        held in flight until ``_bury`` published it."""
        cursor.positions[item.stream] = item.offset + 1
        cursor.dirty = True
        if cursor.dead_letters is not None and cursor.bury is not None:
            cursor.hold(item)  # no committed position past it until buried
            cursor.held_drops += 1
            cursor.dropping.append(item)

    def _cap_passed(self, cursor: Cursor) -> None:
        """A ``discard(newest=True)`` read to its end is done (hold the lock)."""
        if all(cursor.positions.get(s, 0) >= end for s, end in cursor.cap_until.items()):
            cursor.cap_budget = None
            cursor.cap_until = {}

    def _lost(self, cursor: Cursor, item: RecordsLost) -> None:
        """Count records deleted before ``cursor`` read them (all records of the range:
        where a stream carries other topics too, an upper bound)."""
        count = max(0, item.next - max(item.first, 0))
        cursor.lost += count
        if not cursor.attached:
            cursor.positions[item.stream] = item.next
            cursor.dirty = True
        log.warning(
            "subscription %s: %d message(s) of %s were deleted by retention before it "
            "read them (offsets %d..%d)",
            cursor.name,
            count,
            item.stream,
            item.first,
            item.next - 1,
        )
