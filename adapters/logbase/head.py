"""The cursor engine's head thread: it follows the end of every stream and hands each record
to the attached cursors whose patterns match; a stream that restarted (its offsets went
back) resets the cursors that read it; a cursor that attached during a poll in which a
selective head left out a topic it wants reads that poll's records with a catch-up
reader (see :mod:`wsnmom.adapters.logbase.engine`)."""

from __future__ import annotations

import logging
import time

from wsnmom.topic_mapping.model import Topic

from .backend import (
    LogRecord,
    RecordsLost,
    SelectiveHeadReader,
    StreamId,
)
from .cursor import Cursor
from .parts import EngineParts

#: the engine's logger (one name for all its parts)
log = logging.getLogger(f"{__package__}.engine")


class Head(EngineParts):
    """The head reader's thread of a :class:`~wsnmom.adapters.logbase.engine.CursorEngine`."""

    def _topic_wanted(self, topic: Topic) -> bool:
        """Whether a cursor may want records of ``topic`` (the selective head reader's
        question, from the head thread; under the lock, so a cursor being re-indexed is
        never missed)."""
        with self.lock:
            if self._match_all or self._index.match(topic):
                return True
            self._refused.add(topic)
            return False

    def _head_loop(self) -> None:
        head = self._head_reader
        assert head is not None
        selective = head if isinstance(head, SelectiveHeadReader) else None
        self._head_started.set()
        while True:
            with self.lock:
                if not self._running:
                    return
                asked = self._sync_asked
                self._refused.clear()
                self._attached_meanwhile.clear()
            try:
                records = head.poll(self.batch, self.poll_timeout)
            except Exception:
                log.exception("the head reader failed; retrying")
                time.sleep(0.5)
                continue
            touched: dict[str, Cursor] = {}
            with self.lock:
                if not self._running:
                    return
                if self._refused and self._attached_meanwhile:
                    self._recheck_attached()
                for stream, offset in head.positions().items():
                    self._head.setdefault(stream, offset)
                matched: dict[Topic, set[str]] = {}  # a batch's records share few topics
                for item in records:
                    self._dispatch(item, touched, matched)
                self._since_head_commit += len(records)
                full = selective.more_waiting() if selective else len(records) >= self.batch
                if not full and asked > self._sync_done:
                    self._sync_done = asked
                    self._sync_cv.notify_all()
            for cursor in touched.values():
                cursor.drain()
            self._maybe_commit_head(head)

    def _recheck_attached(self) -> None:
        """Before a poll's records are dispatched (hold the lock): a cursor that attached
        while the poll was under way, and wants a topic the selective head was told
        nobody wanted, may miss what the head left out of that topic (it attached at the
        head's positions before the poll, and from the start of a stream the head did not
        follow yet).  It goes back to those positions and a catch-up reader reads them;
        it is in the index now, so a later poll leaves nothing of it out."""
        for name in self._attached_meanwhile:
            cursor = self._cursors.get(name)
            if cursor is None or not cursor.attached:
                continue
            if not any(cursor.wants(topic) for topic in self._refused):
                continue
            positions = dict(self._head)
            for stream, floor in cursor.floor.items():
                positions[stream] = max(positions.get(stream, floor), floor)
            cursor.positions = positions
            cursor.attached = False
            cursor.floor = {}
            cursor.dirty = True
            self._queue_catch_up(cursor)
        self._attached_meanwhile.clear()

    def _dispatch(
        self,
        item: LogRecord | RecordsLost,
        touched: dict[str, Cursor],
        matched: dict[Topic, set[str]],
    ) -> None:
        """Hand one head record to every attached cursor that wants it (hold the lock;
        ``matched`` remembers the cursors matching each topic while the lock is held)."""
        if isinstance(item, RecordsLost) and item.next < item.first:
            self._stream_restarted(item.stream, item.next)
            return
        if isinstance(item, RecordsLost):
            # retention deleted records before even the head read them: every cursor
            # riding on the head that reads this stream lost them
            log.warning(
                "the head reader found %s offsets %d..%d deleted",
                item.stream,
                item.first,
                item.next - 1,
            )
            self._head[item.stream] = item.next
            for rider in self._cursors.values():
                if rider.attached and self._relevant(rider, item.stream):
                    self._lost(rider, item)
            return
        stream = item.stream
        offset = item.offset
        self._head[stream] = max(self._head.get(stream, 0), offset + 1)
        topic = item.topic
        names = matched.get(topic)
        if names is None:
            names = self._index.match(topic)
            if self._match_all:
                names = names | {n for n in self._match_all if self._cursors[n].wants(topic)}
            matched[topic] = names
        for name in names:
            cursor = self._cursors.get(name)
            if cursor is None or not cursor.attached:
                continue
            if offset < cursor.floor.get(stream, -1):
                continue
            if cursor.window_full:
                self._detach_at(cursor, stream, offset)
                continue
            cursor.hand_out(item)
            touched[name] = cursor

    def _stream_restarted(self, stream: StreamId, start: int) -> None:
        """The one reset rule, whoever noticed (the head, or a catch-up reader asking
        beyond the end): the stream now ends below where it was read (the log was
        deleted and created again, or a memory-only broker restarted empty), and every
        cursor reads it again from ``start``, the new log's first record, attached or
        detached, whatever it holds in flight or has stored.  Messages of the old log
        still in flight are given back (settling them does nothing), so no offset of the
        new log is mistaken for one of the old; readers that read from the old positions
        meanwhile have their records dropped (``_moved_meanwhile``); stored positions
        beyond ``start`` are saved again.  Records of the new log may come twice, none
        is skipped."""
        log.warning("%s starts again at offset %d (the log was re-created)", stream, start)
        self._head[stream] = start
        for cursor in self._cursors.values():
            if stream in cursor.inflight or (cursor.attached and stream in cursor.floor):
                cursor.forget_inflight(self._head)
                if cursor.started:
                    self._queue_catch_up(cursor)
            cursor.redeliver_below.pop(stream, None)
            if cursor.attached:
                cursor.floor[stream] = min(cursor.floor.get(stream, start), start)
            elif cursor.positions.get(stream, start) > start:
                cursor.positions[stream] = start
                cursor.dirty = True
            if self._stored.get(cursor.name, {}).get(stream, start) > start:
                # its saved position lies in the old log: saved again before a crash
                # could resume from it
                if cursor.attached and self.shared:
                    # the head's commit never covers it: it keeps positions of its own,
                    # saved while they change (``_own_due``), never deleted
                    self._own_save.add(cursor.name)
                    self._pinning.add(cursor.name)
                elif cursor.attached and cursor.inflight:
                    # the head's commit covers it again until they are saved (a crash
                    # meanwhile must not resume from them)
                    cursor.own_positions = False
                    self._own_save.add(cursor.name)
                    self._pinning.add(cursor.name)
                elif cursor.attached:
                    self._to_delete.add(cursor.name)  # the head's commit covers it
                else:
                    cursor.dirty = True
