"""``CursorEngine``: durable subscriptions of a log-based middleware as cursors over shared
logs, served by a bounded number of readers and threads whatever the number of
subscriptions.

Threads and readers (all fixed in number):

* one **head** thread with the backend's ``HeadReader``: it follows the end of every
  stream and hands each record to every *attached* cursor whose patterns match (a
  ``TopicIndex`` lookup, so the cost grows with the matching cursors, not with all);
* ``catch_up_readers`` **catch-up** threads, each with a ``LogReader``: a *detached*
  cursor (paused and resumed, its window was full, it was rewound, or it was restored at
  start-up) is queued, and a catch-up thread reads its streams from its positions until it
  reaches the head, where it re-attaches; a cursor whose window fills yields its reader to
  the next one.  One reader at a time serves a cursor, and it follows every move of the
  cursor's positions (a stop, a rewind, a reset) before its next poll, so what it read
  beyond a position that moved back is never handed out (the records in between would
  be skipped);
* one **commit** thread: every ``commit_interval`` it saves the positions of detached
  cursors that changed (``PositionStore``) and removes stored positions of cursors that
  re-attached, and the head thread commits the head (``HeadReader.commit``) below every
  unsettled record of the attached cursors and of detached cursors not yet saved, every
  ``commit_interval`` or after ``pin_records`` records, whichever comes first.

After a crash an attached cursor resumes from the head's commit, a detached one from its
stored positions: nothing settled-out-of-order or unsettled is skipped (at-least-once).

What comes again after a crash is bounded in time and count: an attached cursor whose
first unsettled record stayed the same for ``pin_seconds`` (a pull point nobody reads, a
consumer that is down) or lies ``pin_records`` records behind the head saves positions of
its own (``own_positions``, refreshed at most every ``save_interval`` while they change)
and stops holding the head's commit back.  So a cursor that settles promptly gets again
only what it settled in the last ``pin_seconds + commit_interval`` (plus the time the
commit takes), and a slow one what it settled in the last ``save_interval +
commit_interval``: without this, one pull point with 1,000 unread messages held the
head's commit for minutes and every other subscription got those 1,000 again.
A cursor that was attached has no stored positions, so the head must not hand out records
before core re-attached every subscription: ``restoring()`` holds the head back until
``restored()`` (core calls both at start-up; without them the head starts with the first
started cursor).

**Shared by several gateway instances** (``shared``, cluster mode: docs/scale-out.md),
a durable subscription is delivered by one instance at a time, and which one changes.
A cursor this engine has not started (made for a subscription another instance delivers)
is *foreign*: its positions are not this instance's to save, so it is never saved and
never holds the head's commit back.  When this engine starts it, it first takes up the
positions the subscription's last deliverer saved (``PositionStore.load_one``).  A started
cursor always keeps positions of its own: attached, they are saved at most every
``save_interval`` while they change (and the position store keeps them: they are never
deleted on re-attaching); stopped (a pause, a shard handed over or lost) it saves them
at the next commit pass and is foreign again.  So a new deliverer continues from the
last deliverer's saved position, and what it delivers again is what the last one
settled in its last ``save_interval + commit_interval`` (plus what it had in flight).

Limits the middleware cannot enforce are applied on request (``discard``): skipping the
oldest matching records, or delivering only a budget and then jumping to the head.  A
cursor with a dead-letter topic (``SubscriptionSpec.dead_letters``) and a ``Bury`` reads
the oldest records it skips and publishes them there (``HEADER_DROPPED_REASON``
"overflow", ``HEADER_DROPPED_FROM`` its name) before it lets its committed position pass
them: they are held in flight like records handed out until the publish is confirmed, so
a crash meanwhile reads them again (a dead letter may come twice, never none).  A publish
that fails ("dead letters not published", logged, and counted in ``stats``) leaves them
held and the cursor where it is: what it handed out meanwhile is not handed out again,
its committed position stays below them, and the publish is tried again later, after
``bury_retry_first`` seconds doubled with each failure in a row up to
``bury_retry_max`` (the commit thread hands the cursor to a catch-up reader when it is
due; no reader thread waits for it).  A refusal that lasts (an ACL, a record too large)
thus costs one publish per ``bury_retry_max``.  It does not stall delivery: held records
do not count in the cursor's window (``Cursor.held_drops``), and at the first failure
what was still to be skipped is delivered instead and ``discard`` skips nothing more
until a publish succeeds, so what stays held is what was skipped before the failure (at
most one read, ``batch`` records, per ``discard``): the limit is not enforced while the
dead letters cannot be published, rather than messages lost or delivery stopped.  A stop
or rewind meanwhile gives them back with what was in flight and as many records are
skipped, and buried, again from where the cursor goes back to (the oldest waiting then,
which may include records handed out before: delivered and dead-lettered both, never
lost).  For ``discard(newest=True)`` such a cursor does not jump: once its budget is
delivered it reads the rest up to where the head was, and buries it the same way.  The
depth of a detached cursor counts the records between its positions and the head in the
streams it reads, which includes records of other topics when a stream is shared
(``may_carry`` True for a namespace-wide log): an estimate, said so in ``depth``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from wsnmom.core.adapter import (
    DROPPED_OVERFLOW,
    HEADER_DROPPED_AT,
    HEADER_DROPPED_ATTEMPTS,
    HEADER_DROPPED_FROM,
    HEADER_DROPPED_REASON,
    HEADER_MESSAGE_ID,
    HEADER_TOPIC_NAMESPACE,
    HEADER_TOPIC_PATH,
    AdapterUnavailable,
    OutboundMessage,
    QueueLimits,
    Received,
    SubscriptionHandle,
    SubscriptionSpec,
)
from wsnmom.topic_mapping.index import TopicIndex
from wsnmom.topic_mapping.model import Topic

from .backend import (
    EARLIEST,
    HeadReader,
    LogBackend,
    LogReader,
    LogRecord,
    PositionStore,
    RecordsLost,
    SelectiveHeadReader,
    StreamId,
)
from .cursor import Bury, Cursor, CursorHandle

__all__ = ["CursorEngine"]

log = logging.getLogger(__name__)


class CursorEngine:
    """Cursors over a ``LogBackend`` (see the module docstring).  Thread-safe."""

    def __init__(
        self,
        backend: LogBackend,
        *,
        catch_up_readers: int = 4,
        batch: int = 500,
        poll_timeout: float = 0.1,
        commit_interval: float = 0.2,
        catch_up_slice: int = 20,
        pin_seconds: float = 1.0,
        pin_records: int = 1000,
        save_interval: float = 1.0,
    ) -> None:
        self.backend = backend
        self.catch_up_readers = catch_up_readers
        self.batch = batch
        self.poll_timeout = poll_timeout
        self.commit_interval = commit_interval
        #: how long, and how far behind the head, an attached cursor may hold the head's
        #: commit back before it saves positions of its own (see the module docstring)
        self.pin_seconds = pin_seconds
        self.pin_records = pin_records
        #: at most this often a cursor's own positions are saved again while they change
        self.save_interval = save_interval
        #: a dead-letter publish that failed is tried again after this long, doubled
        #: after each failure in a row up to ``bury_retry_max`` (seconds)
        self.bury_retry_first = 0.5
        self.bury_retry_max = 30.0
        #: batches a catch-up thread reads for one cursor before serving the next one
        self.catch_up_slice = catch_up_slice
        #: several gateway instances deliver these subscriptions, one at a time each
        #: (see the module docstring); set before cursors are made
        self.shared = False
        self.lock = threading.RLock()
        self._cursors: dict[str, Cursor] = {}
        self._index: TopicIndex[str] = TopicIndex()
        self._match_all: set[str] = set()
        #: next offset the head reader returns per stream
        self._head: dict[StreamId, int] = {}
        self._stored: dict[str, dict[StreamId, int]] = {}
        self._to_delete: set[str] = set()
        self._catch_up: queue.SimpleQueue[Cursor | None] = queue.SimpleQueue()
        self._store: PositionStore | None = None
        self._head_reader: HeadReader | None = None
        self._threads: list[threading.Thread] = []
        self._running = False
        self._dispatching = False
        self._hold = False
        self._head_started = threading.Event()
        #: head sync: polls asked for / the last one that reached the end
        self._sync_asked = 0
        self._sync_done = 0
        self._sync_cv = threading.Condition(self.lock)
        self._wake_commit = threading.Event()
        self._last_head_commit = 0.0
        self._last_head_positions: dict[StreamId, int] = {}
        #: records the head dispatched since its last commit
        self._since_head_commit = 0
        #: attached cursors to save positions of their own at the next commit pass
        self._own_save: set[str] = set()
        #: when each cursor's own positions were last saved (monotonic)
        self._own_saved_at: dict[str, float] = {}
        #: cursors that may hold the head's commit back or have positions to save
        #: (in flight, detached and unsaved, or dirty): the commit passes look at these
        #: only, not at every cursor.  A superset: names are dropped when looked at.
        self._pinning: set[str] = set()
        #: cursors whose dead letters were not published, and when to try again
        #: (monotonic): the commit thread hands them to a catch-up reader then
        self._bury_retry: dict[str, float] = {}
        #: dead-letter publishes that failed, since start (``stats``)
        self._bury_failed = 0

    def may_pin(self, name: str) -> None:
        """``name`` may now hold the head's commit back or need saving (hold the lock;
        called by ``Cursor`` whenever it detaches, gets dirty or hands a record out)."""
        self._pinning.add(name)

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Open the head reader and the position store and load stored positions."""
        with self.lock:
            if self._running:
                return
            self._store = self.backend.position_store()
            self._stored = self._store.load()
            self._head_reader = self.backend.head_reader()
            if isinstance(self._head_reader, SelectiveHeadReader):
                self._head_reader.set_interest(self._topic_wanted)
            self._head = dict(self._head_reader.positions())
            self._running = True
        self._spawn(self._commit_loop, "wsnmom-log-commit")
        for i in range(self.catch_up_readers):
            self._spawn(self._catch_up_loop, f"wsnmom-log-catch-up-{i}")

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def restoring(self) -> None:
        """Hold the head back until ``restored`` (see the module docstring)."""
        with self.lock:
            self._hold = True

    def restored(self) -> None:
        """Every cursor is re-attached: start following the head."""
        with self.lock:
            self._hold = False
        self._start_head()

    def _start_head(self) -> None:
        with self.lock:
            if self._dispatching or self._hold or not self._running:
                return
            self._dispatching = True
        self._spawn(self._head_loop, "wsnmom-log-head")
        self._head_started.wait(5.0)

    def close(self) -> None:
        """Stop every thread, save every cursor's positions, release the readers."""
        with self.lock:
            if not self._running:
                return
            self._running = False
            self._sync_cv.notify_all()
            for cursor in self._cursors.values():
                if cursor.started or cursor.attached or cursor.inflight:
                    cursor.forget_inflight(self._head)
                    cursor.started = False
                    cursor.callback = None
        for _ in range(self.catch_up_readers):
            self._catch_up.put(None)
        self._wake_commit.set()
        for thread in self._threads:
            thread.join(timeout=10)
        self._threads = []
        try:
            self._flush_positions(final=True)
        except Exception:
            # the head's commit below still stays behind every cursor not saved
            log.warning("saving subscription positions at close failed", exc_info=True)
        head = self._head_reader
        if head is not None:
            try:
                head.commit(self._head_commit_positions())
            except Exception:
                log.warning("committing the head position at close failed", exc_info=True)
            head.close()
        self._head_reader = None
        self._dispatching = False

    # -- subscriptions ---------------------------------------------------------------------
    def subscription(self, spec: SubscriptionSpec, bury: Bury | None = None) -> SubscriptionHandle:
        """Create, or re-attach to, the cursor ``spec.name``; ``bury`` publishes what
        ``discard`` skips to ``spec.dead_letters`` (see the module docstring)."""
        with self.lock:
            if not self._running:
                raise AdapterUnavailable("the log adapter is not open")
            cursor = self._cursors.get(spec.name)
            if cursor is not None:
                if cursor.patterns != spec.patterns or cursor.limits != spec.limits:
                    self._rebind(cursor, spec.patterns, spec.limits)
                cursor.dead_letters, cursor.bury = spec.dead_letters, bury
                return CursorHandle(cursor)
            stored = self._stored.get(spec.name)
            held = self._hold
        if stored is not None:
            positions = dict(stored)
        elif held:
            # restoring: a cursor without stored positions rode on the head, which has
            # not moved since its last commit
            with self.lock:
                positions = dict(self._head)
        else:
            positions = self._end_now()
        with self.lock:
            cursor = self._cursors.get(spec.name)
            if cursor is None:
                cursor = Cursor(self, spec.name, spec.patterns, spec.limits, positions)
                cursor.dead_letters, cursor.bury = spec.dead_letters, bury
                if self.shared:
                    # another instance may deliver it: its positions are taken up from
                    # the position store when this engine starts it
                    cursor.foreign = True
                else:
                    # saved unless it attaches first, so it never pins the head's commit
                    cursor.dirty = stored is None
                self._cursors[spec.name] = cursor
                self._index_cursor(cursor)
            return CursorHandle(cursor)

    def _end_now(self) -> dict[StreamId, int]:
        """Where a new cursor starts: the current end of every stream (from the backend
        when it can tell, else once the head reader has caught up)."""
        ends = self.backend.end_positions()
        self._start_head()
        with self.lock:
            if ends is None:
                self._sync_head_locked(timeout=max(1.0, 10 * self.poll_timeout))
                return dict(self._head)
            out = dict(self._head)
            for stream, offset in ends.items():
                out[stream] = max(out.get(stream, 0), offset)
            return out

    def _sync_head_locked(self, timeout: float) -> None:
        """Wait until a head poll that began after this call found the end (hold the
        lock; it is released while waiting)."""
        if not self._dispatching:
            return
        self._sync_asked += 1
        target = self._sync_asked
        deadline = time.monotonic() + timeout
        while self._sync_done < target and self._running:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                log.warning("the head reader did not reach the end within %.1fs", timeout)
                return
            self._sync_cv.wait(remaining)

    def _index_cursor(self, cursor: Cursor) -> None:
        if cursor.patterns is None:
            self._match_all.add(cursor.name)
            self._index.remove(cursor.name)
        else:
            self._match_all.discard(cursor.name)
            self._index.add(cursor.name, cursor.patterns)

    def _rebind(
        self, cursor: Cursor, patterns: tuple[Any, ...] | None, limits: QueueLimits
    ) -> None:
        cursor.patterns = patterns
        cursor.limits = limits
        self._index_cursor(cursor)
        if not cursor.attached:
            # streams the new patterns add are read from the head on (a new subscription
            # to those topics), not from their beginning
            for stream, offset in self._head.items():
                if stream not in cursor.positions and self._relevant(cursor, stream):
                    cursor.positions[stream] = offset
            cursor.dirty = True

    def delete_subscription(self, name: str) -> None:
        """Forget the cursor ``name`` and its stored positions (idempotent)."""
        with self.lock:
            cursor = self._cursors.pop(name, None)
            self._stored.pop(name, None)
            self._index.remove(name)
            self._match_all.discard(name)
            self._own_save.discard(name)
            self._own_saved_at.pop(name, None)
            if cursor is not None:
                cursor.deleted = True
                cursor.started = False
                cursor.callback = None
                cursor.inflight = {}
                cursor.unsettled = 0
            self._to_delete.add(name)
        self._wake_commit.set()

    def delete_into_dead_letters(
        self, cursor: Cursor, reason: str, context: Mapping[str, str], timeout: float
    ) -> int:
        """Bury what ``cursor`` has waiting up to where the head is now, then forget it
        (``SubscriptionHandle.delete_into_dead_letters``): it is stopped (what was in
        flight is given back), and a catch-up reader reads it on to the head as for
        ``discard(newest=True)`` with no budget, holding each record until ``_bury``
        published it (``HEADER_DROPPED_REASON`` = ``reason``, ``context`` added).  This
        thread waits for that; a failed publish or ``timeout`` raises
        ``AdapterUnavailable`` (the cursor keeps what was not buried, and buries what it
        holds later; core starts it again)."""
        if cursor.dead_letters is None or cursor.bury is None:
            raise NotImplementedError(f"subscription {cursor.name} has no dead-letter topic")
        self.stop_cursor(cursor)
        with self.lock:
            if cursor.deleted:
                return 0
            cursor.drop_reason, cursor.drop_context = reason, dict(context)
            cursor.buried, cursor.bury_failures, cursor.bury_due = 0, 0, 0.0
            cursor.cap_budget = 0
            cursor.cap_until = {s: h for s, h in self._head.items() if self._relevant(cursor, s)}
            until = dict(cursor.cap_until)
            cursor.dirty = True
        deadline = time.monotonic() + timeout
        error = f"not done within {timeout:g}s"
        while time.monotonic() < deadline:
            with self.lock:
                if cursor.bury_failures:
                    error = "the dead letters were not published"
                    break
                read = cursor.cap_budget is None or all(
                    cursor.positions.get(s, 0) >= end for s, end in until.items()
                )
                if read and not cursor.dropping and not cursor.unsettled:
                    buried = cursor.buried
                    self.delete_subscription(cursor.name)  # the lock held: nothing moved
                    return buried
                self._queue_catch_up(cursor, skipping=True)  # (no-op while queued)
            time.sleep(0.02)
        with self.lock:
            cursor.cap_budget, cursor.cap_until = None, {}
            cursor.drop_reason, cursor.drop_context = DROPPED_OVERFLOW, {}
            buried = cursor.buried
        raise AdapterUnavailable(
            f"subscription {cursor.name}: {buried} record(s) sent to the dead letters, "
            f"the rest not: {error}"
        )

    def names(self) -> list[str]:
        """Cursors open now or stored."""
        with self.lock:
            return sorted(set(self._cursors) | set(self._stored))

    # -- start / stop ----------------------------------------------------------------------
    def start_cursor(
        self, cursor: Cursor, on_message: Callable[[Received], None], prefetch: int
    ) -> None:
        """Push mode for ``cursor`` (idempotent); a foreign cursor first takes up its
        stored positions."""
        if cursor.foreign:
            self._take_up(cursor)
        with self.lock:
            if cursor.deleted:
                raise AdapterUnavailable(f"subscription {cursor.name} was deleted")
            cursor.callback = on_message
            cursor.prefetch = max(1, prefetch)
            if cursor.started:
                return
            cursor.started = True
            if not self._try_attach(cursor):
                self._queue_catch_up(cursor)
        self._start_head()

    def stop_cursor(self, cursor: Cursor) -> None:
        """Pause ``cursor``: it detaches; what was in flight comes again (redelivered).
        Shared: its positions are saved at the next commit pass, and it is foreign
        again (another instance may deliver it next)."""
        with self.lock:
            if not cursor.started:
                return
            cursor.started = False
            cursor.forget_inflight(self._head)
            cursor.callback = None
            if self.shared:
                cursor.foreign = True
        self._wake_commit.set()

    def _take_up(self, cursor: Cursor) -> None:
        """Give foreign ``cursor`` the positions its last deliverer saved (streams it
        saved nothing for keep the cursor's own).  Unsaved positions of this instance's
        own (stopped a moment ago) are the newest there are, and are kept."""
        store = self._store
        with self.lock:
            if not cursor.foreign or cursor.started or cursor.dirty or store is None:
                cursor.foreign = False
                return
        try:
            saved = store.load_one(cursor.name)
        except Exception as exc:
            raise AdapterUnavailable(
                f"reading the saved positions of {cursor.name} failed: {exc}"
            ) from exc
        with self.lock:
            if not cursor.foreign or cursor.started or cursor.dirty:
                cursor.foreign = False
                return
            cursor.foreign = False
            if saved:
                cursor.positions = {**cursor.positions, **saved}
                self._stored[cursor.name] = dict(saved)

    # -- settling --------------------------------------------------------------------------
    def settle(self, cursor: Cursor, stream: StreamId, offset: int, gen: int, rewind: bool) -> None:
        """A subscriber settled one record (see ``CursorReceived``)."""
        requeue = False
        with self.lock:
            if gen != cursor.gen or cursor.deleted:
                return  # handed out before a stop or rewind: it comes again anyway
            if rewind:
                cursor.forget_inflight(self._head)
                cursor.positions[stream] = min(cursor.positions.get(stream, offset), offset)
                requeue = cursor.started
            else:
                was_full = cursor.window_full
                moved = cursor.settle(stream, offset)
                if moved and not cursor.attached:
                    cursor.dirty = True
                requeue = was_full and not cursor.window_full and not cursor.attached
            if requeue:
                self._queue_catch_up(cursor)

    # -- queries ---------------------------------------------------------------------------
    def depth(self, cursor: Cursor) -> int:
        """Records waiting for ``cursor``: 0 while it rides on the head; detached, the
        records between its positions and the head in the streams it reads (an estimate
        where a stream carries other topics too), less what ``discard`` will skip."""
        with self.lock:
            if cursor.attached:
                return 0
            total = 0
            for stream, head in self._head.items():
                if not self._relevant(cursor, stream):
                    continue
                position = max(cursor.positions.get(stream, 0), 0)
                if cursor.cap_budget is not None:
                    position = max(position, cursor.cap_until.get(stream, 0))
                total += max(0, head - position)
            if cursor.cap_budget is not None:
                total += cursor.cap_budget
            return max(0, total - cursor.skip_oldest)

    def peek(self, cursor: Cursor, count: int, timeout: float = 5.0) -> list[LogRecord]:
        """Up to ``count`` of the records waiting for ``cursor``, read by a reader of its
        own from the cursor's positions up to the head and committed nowhere: the
        cursor, the head and the stored positions stay as they are.  In read order,
        which is offset order within each stream.  A cursor riding on the head has
        nothing waiting (its records are handed out as they arrive): empty.  The
        ``count`` oldest records ``discard`` will skip are left out.  Stops after
        ``timeout`` seconds with what it read."""
        if count <= 0:
            return []
        with self.lock:
            if not self._running:
                raise AdapterUnavailable("the log adapter is not open")
            if cursor.attached or cursor.deleted:
                return []
            start = self._assignment(cursor)
            ends = {s: self._head.get(s, 0) for s in start}
            skip = cursor.skip_oldest
        todo = {s: o for s, o in start.items() if max(o, 0) < ends[s]}
        if not todo:
            return []
        reader = self.backend.reader()
        out: list[LogRecord] = []
        deadline = time.monotonic() + timeout
        try:
            reader.assign(todo)
            while todo and len(out) < count and time.monotonic() < deadline:
                finished = False
                for item in reader.poll(self.batch, self.poll_timeout):
                    stream = item.stream
                    if stream not in todo:
                        continue
                    if isinstance(item, RecordsLost):
                        # retention deleted some (or the log started again): go on after
                        todo[stream] = item.next if item.next >= item.first else ends[stream]
                    else:
                        todo[stream] = item.offset + 1
                        if item.offset < ends[stream] and cursor.wants(item.topic):
                            if skip:
                                skip -= 1
                            elif len(out) < count:
                                out.append(item)
                    if todo[stream] >= ends[stream]:
                        del todo[stream]
                        finished = True
                if finished and todo and len(out) < count:
                    reader.assign(todo)  # stop reading the streams read to their end
        finally:
            reader.close()
        return out

    def depths(self, handles: Sequence[SubscriptionHandle]) -> list[int | None]:
        """``depth`` of each handle under one lock acquisition."""
        with self.lock:
            return [
                self.depth(h._cursor) if isinstance(h, CursorHandle) else h.depth() for h in handles
            ]

    def discard(self, cursor: Cursor, count: int, *, newest: bool) -> int:
        """Skip ``count`` of the records waiting now: the oldest matching ones as the
        cursor reads them, or (``newest``) keep the oldest ``depth - count`` and jump
        past the rest.  Paused cursors are brought forward by a catch-up reader too
        (skipping only).  Returns how many records will be skipped (an estimate where the
        depth is one)."""
        if count <= 0:
            return 0
        with self.lock:
            if cursor.bury_failures and cursor.dead_letters is not None and cursor.bury is not None:
                return 0  # its dead letters are refused: nothing more is dropped meanwhile
            waiting = self.depth(cursor)
            count = min(count, waiting)
            if not count:
                return 0
            if newest:
                cursor.cap_budget = waiting - count
                cursor.cap_until = dict(self._head)
            else:
                cursor.skip_oldest += count
            cursor.dirty = True
            if not cursor.attached:
                self._queue_catch_up(cursor, skipping=True)
            return count

    # -- internals: attach / catch-up ------------------------------------------------------
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
                if reader is None:
                    reader = self.backend.reader()
                    assigned = None
                try:
                    assigned = self._catch_up_one(reader, cursor, assigned)
                except Exception:
                    log.exception("catching up subscription %s failed; retrying", cursor.name)
                    try:
                        reader.close()
                    except Exception:
                        log.debug("closing a reader failed", exc_info=True)
                    reader, assigned = None, None
                    time.sleep(0.5)
                    with self.lock:
                        cursor.queued = False
                        self._queue_catch_up(cursor)
        finally:
            if reader is not None:
                reader.close()

    def _catch_up_one(
        self, reader: LogReader, cursor: Cursor, assigned: dict[StreamId, int] | None
    ) -> dict[StreamId, int] | None:
        """One turn of a catch-up reader for ``cursor`` (see ``_read_turn``); returns the
        reader's assignment afterwards (None: unknown, assign afresh next time).

        A cursor has at most one reader at a time (``Cursor.serving``): it may be stopped,
        started, rewound or reset while its reader waits for the middleware, and is then
        queued again, but a second reader taking it meanwhile would read from positions
        the first one is about to move past.  Whatever asked for another turn during
        this one gets it when this one ends (``Cursor.recheck``)."""
        with self.lock:
            cursor.queued = False
            if cursor.serving:  # not queued while served; kept for safety
                cursor.recheck = True
                return assigned
            cursor.serving = True
            cursor.recheck = False
        try:
            self._retry_bury(cursor)
            return self._read_turn(reader, cursor, assigned)
        finally:
            with self.lock:
                cursor.serving = False
                if cursor.recheck:
                    cursor.recheck = False
                    if not cursor.attached:
                        self._queue_catch_up(cursor, skipping=True)

    def _read_turn(
        self, reader: LogReader, cursor: Cursor, assigned: dict[StreamId, int] | None
    ) -> dict[StreamId, int] | None:
        """Read for ``cursor`` until it attaches, its window fills or its slice ends.

        Before every poll the reader is pointed at the cursor's positions if they are
        not where it continues from (``_assignment``): the cursor was stopped (what was
        in flight is given back, so its position went back to its first unsettled
        record), rewound, reset or rebound, or the head follows a stream the reader does
        not.  Records read before such a move are dropped, never handed out beyond
        records the cursor still needs."""
        with self.lock:
            if not self._running or cursor.attached or cursor.deleted:
                return assigned
            if not cursor.started and not (cursor.skip_oldest or cursor.cap_budget is not None):
                return assigned
            if cursor.window_full:
                return assigned
            if self._try_attach(cursor) or not self._has_work(cursor):
                return assigned
        for _ in range(self.catch_up_slice):
            with self.lock:
                wanted = self._assignment(cursor)
            if assigned is None or wanted != assigned:
                reader.assign(wanted)
                assigned = dict(wanted)
            records = reader.poll(self.batch, self.poll_timeout)
            with self.lock:
                if not self._running or cursor.deleted or cursor.attached:
                    return None
                if not records:
                    if self._try_attach(cursor) or not self._has_work(cursor):
                        return assigned
                    if self._apply_cap_at_head(cursor):
                        return None
                    continue
                if self._moved_meanwhile(cursor, assigned, records):
                    continue  # read from where the cursor no longer is: dropped
                stopped = self._read_for(cursor, records)
                for r in records:
                    assigned[r.stream] = r.offset + 1 if isinstance(r, LogRecord) else r.next
            cursor.drain()
            self._retry_bury(cursor)  # what it skipped now, or again once it is due
            with self.lock:
                if stopped or cursor.window_full:
                    return None  # positions moved back: assign afresh next time
        with self.lock:
            if not cursor.attached and not self._try_attach(cursor):
                self._queue_catch_up(cursor, skipping=True)
        return None

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

    def _retry_bury(self, cursor: Cursor) -> None:
        """Bury what ``cursor`` skipped if it has records waiting for that and no failed
        publish asks it to wait (served by this thread, no lock held); when it must wait,
        the commit thread hands it to a reader once it is due."""
        with self.lock:
            if not cursor.dropping:
                return
            due = cursor.bury_due <= time.monotonic()
            if not due:  # e.g. skipped again after a stop: tried when the last wait ends
                self._bury_retry.setdefault(cursor.name, cursor.bury_due)
        if due:
            self._bury(cursor)

    def _queue_due_buries(self) -> None:
        """Hand each cursor whose dead-letter publish is due again to a catch-up reader
        (commit thread), whether it is attached, paused or its window is full."""
        now = time.monotonic()
        with self.lock:
            for name, due in list(self._bury_retry.items()):
                cursor = self._cursors.get(name)
                if cursor is None or cursor.deleted or not cursor.dropping:
                    del self._bury_retry[name]
                elif due <= now and not cursor.serving:  # served: looked at next pass
                    del self._bury_retry[name]
                    if not cursor.queued:
                        cursor.queued = True
                        self._catch_up.put(cursor)

    def _bury(self, cursor: Cursor) -> bool:
        """Publish the records ``cursor`` skipped to its dead-letter topic and settle them
        (served by this thread, no lock held).  False when the publish failed: they stay
        held in flight at the front of ``dropping`` (no committed position passes them)
        and are tried again after a delay that doubles with each failure in a row
        (``bury_retry_first`` .. ``bury_retry_max``), on a later turn; the cursor does not
        go back, so what it handed out meanwhile is not handed out again."""
        with self.lock:
            dropped, cursor.dropping = cursor.dropping, []
            gen, topic, bury = cursor.gen, cursor.dead_letters, cursor.bury
        if not dropped or topic is None or bury is None:
            return True
        out: list[OutboundMessage] = []
        now = datetime.now(UTC).isoformat()
        for record in dropped:
            headers = dict(record.headers)
            headers.setdefault(HEADER_TOPIC_NAMESPACE, record.topic.namespace)
            headers.setdefault(HEADER_TOPIC_PATH, "/".join(record.topic.path))
            headers.update(cursor.drop_context)
            headers[HEADER_DROPPED_REASON] = cursor.drop_reason
            headers[HEADER_DROPPED_FROM] = cursor.name
            headers[HEADER_DROPPED_AT] = now
            if record.offset < cursor.redeliver_below.get(record.stream, -1):
                headers[HEADER_DROPPED_ATTEMPTS] = "1"  # handed out before (at least once)
            out.append(
                OutboundMessage(
                    topic=topic,
                    body=bytes(record.body),
                    message_id=headers.get(HEADER_MESSAGE_ID)
                    or f"{cursor.name}:{record.stream}:{record.offset}",
                    headers=headers,
                    content_type=record.content_type or "application/xml",
                )
            )
        try:
            bury(out)
        except Exception as exc:
            with self.lock:
                self._bury_failed += 1
                if cursor.deleted:
                    return False
                if gen != cursor.gen:
                    # stopped or rewound meanwhile: it went back to them (they were in
                    # flight), so they are read, skipped and buried again from there
                    cursor.skip_oldest += len(dropped)
                    return False
                cursor.dropping[:0] = dropped  # still held: the commit stays below them
                # what was still to be skipped is delivered instead, and ``discard``
                # skips nothing more until they are published: only these stay held
                cursor.skip_oldest, cursor.cap_budget, cursor.cap_until = 0, None, {}
                cursor.bury_failures += 1
                delay = min(
                    self.bury_retry_first * 2 ** min(cursor.bury_failures - 1, 30),
                    self.bury_retry_max,
                )
                cursor.bury_due = time.monotonic() + delay
                self._bury_retry[cursor.name] = cursor.bury_due
                failures = cursor.bury_failures
            log.log(
                logging.ERROR if failures == 1 else logging.WARNING,
                "subscription %s: dead letters not published: %d dropped message(s) "
                "(%s); they stay held, tried again in %.1fs (failure %d in a row)",
                cursor.name,
                len(out),
                exc,
                delay,
                failures,
            )
            return False
        with self.lock:
            cursor.buried += len(dropped)
            if gen == cursor.gen:
                cursor.bury_failures = 0
                cursor.bury_due = 0.0
                cursor.held_drops = max(0, cursor.held_drops - len(dropped))
        for record in dropped:
            self.settle(cursor, record.stream, record.offset, gen, rewind=False)
        return True

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

    # -- internals: head -------------------------------------------------------------------
    def _topic_wanted(self, topic: Topic) -> bool:
        """Whether a cursor may want records of ``topic`` (the selective head reader's
        question, from the head thread; under the lock, so a cursor being re-indexed is
        never missed)."""
        with self.lock:
            return bool(self._match_all) or bool(self._index.match(topic))

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
                if cursor.attached and cursor.inflight:
                    cursor.own_positions = False
                    self._own_save.add(cursor.name)
                    self._pinning.add(cursor.name)
                elif cursor.attached:
                    self._to_delete.add(cursor.name)  # the head's commit covers it
                else:
                    cursor.dirty = True

    def _head_commit_positions(self, now: float | None = None) -> dict[StreamId, int]:
        """Where the head may resume after a crash: below every unsettled record of the
        attached cursors (except those with positions of their own) and of detached ones
        whose positions are not saved yet (hold the lock, or call when the threads are
        stopped).  Attached cursors that held it back too long are marked for saving."""
        positions = dict(self._head)
        done: list[str] = []
        now = time.monotonic() if now is None else now
        for name in self._pinning:
            cursor = self._cursors.get(name)
            if cursor is None or (cursor.foreign and not cursor.dirty):
                done.append(name)  # a foreign cursor's positions are not this engine's
            elif cursor.attached and self.shared:
                # its own positions are saved while they change (``_own_due``); the
                # head's commit does not cover it
                if self._stored.get(name) == self._own_positions(cursor):
                    done.append(name)
            elif cursor.attached:
                if not cursor.inflight:
                    if name not in self._own_save:
                        done.append(name)
                    cursor.pin_seen = {}
                    if cursor.own_positions:
                        # everything settled: the head's commit covers it again, and its
                        # saved positions would only bring old records back
                        cursor.own_positions = False
                        self._own_save.discard(name)
                        self._to_delete.add(name)
                    continue
                if self._pins_too_long(cursor, now) and not cursor.own_positions:
                    self._own_save.add(name)
                if cursor.own_positions:
                    continue  # its saved positions are at or below where it is
                for stream in list(cursor.inflight):
                    if stream in positions:
                        positions[stream] = cursor.committed(stream, positions[stream])
            elif cursor.dirty or cursor.name not in self._stored:
                for stream, offset in cursor.positions.items():
                    if stream in positions and offset >= 0:
                        positions[stream] = min(positions[stream], cursor.committed(stream, offset))
            else:
                done.append(name)  # detached, saved and unchanged: its group holds it
        self._pinning.difference_update(done)
        return positions

    def _pins_too_long(self, cursor: Cursor, now: float) -> bool:
        """Whether attached ``cursor``'s first unsettled record in some stream stayed
        the same for ``pin_seconds`` or lies ``pin_records`` behind the head (hold the
        lock; sampled by the commit pass, so off the delivery path)."""
        seen = cursor.pin_seen
        too_long = False
        for stream, flight in cursor.inflight.items():
            if not flight:
                continue
            front = next(iter(flight))
            first = seen.get(stream)
            if first is None or first[0] != front:
                seen[stream] = first = (front, now)
            behind = self._head.get(stream, front) - front
            if now - first[1] >= self.pin_seconds or behind >= self.pin_records:
                too_long = True
        for stream in [s for s in seen if s not in cursor.inflight]:
            del seen[stream]
        return too_long

    def _own_positions(self, cursor: Cursor) -> dict[StreamId, int]:
        """Where attached ``cursor`` would resume after a crash, in every stream it reads
        (hold the lock)."""
        out: dict[StreamId, int] = {}
        for stream, head in self._head.items():
            if stream in cursor.inflight or self._relevant(cursor, stream):
                read = max(head, cursor.floor.get(stream, head))
                out[stream] = cursor.committed(stream, read)
        return out

    def _maybe_commit_head(self, head: HeadReader) -> None:
        now = time.monotonic()
        if (
            now - self._last_head_commit < self.commit_interval
            and self._since_head_commit < self.pin_records
        ):
            return
        self._last_head_commit = now
        self._since_head_commit = 0
        with self.lock:
            positions = self._head_commit_positions(now)
        if positions != self._last_head_positions:
            try:
                head.commit(positions)
                self._last_head_positions = positions
            except Exception:
                log.warning("committing the head position failed", exc_info=True)

    # -- internals: stored positions -------------------------------------------------------
    def _commit_loop(self) -> None:
        while True:
            self._wake_commit.wait(self.commit_interval)
            self._wake_commit.clear()
            with self.lock:
                running = self._running
            if not running:
                return
            self._queue_due_buries()
            try:
                self._flush_positions()
            except Exception:
                log.warning("saving subscription positions failed; retrying", exc_info=True)

    def _flush_positions(self, *, final: bool = False) -> None:
        """Save changed positions of detached cursors, drop those of re-attached ones."""
        store = self._store
        if store is None:
            return
        with self.lock:
            changes: dict[str, dict[StreamId, int]] = {}
            if final:
                candidates = list(self._cursors.values())
            else:  # every dirty cursor is among the pinning ones
                candidates = [c for n in self._pinning if (c := self._cursors.get(n)) is not None]
            now = time.monotonic()
            own: dict[str, int] = {}  # attached cursors saved, with their generation
            for cursor in candidates:
                if cursor.attached:
                    positions = self._own_due(cursor, now)
                    if positions is not None:
                        changes[cursor.name] = positions
                        own[cursor.name] = cursor.gen
                    continue
                self._own_save.discard(cursor.name)
                if not (cursor.dirty or final) or (cursor.foreign and not cursor.dirty):
                    continue
                if not cursor.dirty and cursor.name in self._stored:
                    continue
                committed = {
                    stream: cursor.committed(stream, offset)
                    for stream, offset in cursor.positions.items()
                    if offset >= 0
                }
                changes[cursor.name] = committed
                cursor.dirty = False
            deletes = {n for n in self._to_delete if n not in changes}
            self._to_delete = set()
        if changes:
            try:
                store.save(changes)
            except Exception:
                with self.lock:
                    self._own_save |= set(own)
                    # saved again next time, and meanwhile they pin the head's commit
                    for name in changes:
                        live = self._cursors.get(name)
                        if live is not None and not live.attached:
                            live.dirty = True
                    self._to_delete |= deletes
                raise
            with self.lock:
                for name, positions in changes.items():
                    self._stored[name] = positions
                    live = self._cursors.get(name)
                    if name in own and live is not None:
                        self._own_saved_at[name] = now
                        if live.attached and live.gen == own[name] and not self.shared:
                            if live.inflight:
                                live.own_positions = True
                            else:  # settled meanwhile: the head covers it
                                self._to_delete.add(name)
        if deletes:
            try:
                store.delete(deletes)
            except Exception:
                with self.lock:
                    self._to_delete |= deletes  # tried again next time
                raise
            with self.lock:
                for name in deletes:
                    live = self._cursors.get(name)
                    if live is None or live.attached:
                        self._stored.pop(name, None)

    def _own_due(self, cursor: Cursor, now: float) -> dict[StreamId, int] | None:
        """The positions to save for attached ``cursor`` now, if it is due: marked by the
        head's commit pass, or saved before and changed since, ``save_interval`` after
        its last save (hold the lock)."""
        name = cursor.name
        if name in self._own_save:
            self._own_save.discard(name)
            return self._own_positions(cursor)
        if not cursor.own_positions:
            return None
        if now - self._own_saved_at.get(name, 0.0) < self.save_interval:
            return None
        positions = self._own_positions(cursor)
        return positions if positions != self._stored.get(name) else None

    # -- diagnostics -----------------------------------------------------------------------
    def stats(self) -> Mapping[str, int]:
        """Counts for tests and ``/metrics``: cursors, attached, started while detached,
        threads, the cursors the commit passes look at, dead letters held because their
        publish failed (not published yet) and failed dead-letter publishes."""
        with self.lock:
            cursors = list(self._cursors.values())
            return {
                "cursors": len(cursors),
                "attached": sum(1 for c in cursors if c.attached),
                "detached_started": sum(1 for c in cursors if c.started and not c.attached),
                "threads": len(self._threads),
                # what the commit passes look at (not every cursor)
                "pinning": len(self._pinning),
                # dead letters held because their publish failed, and failed publishes
                "dead_letters_unpublished": sum(len(c.dropping) for c in cursors),
                "dead_letter_publish_failures": self._bury_failed,
            }
