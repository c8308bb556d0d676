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
  the next one.  A reader takes together the queued cursors that read the same streams
  from the same positions (after a failover, every subscription of a topic the dead
  instance delivered is behind at the same offset) and reads once for all of them,
  applying each record to each cursor (its patterns, skips, caps and window); one whose
  positions move leaves the group.  One reader at a time serves a cursor, and it follows
  every move of the cursor's positions (a stop, a rewind, a reset) before its next poll,
  so what it read beyond a position that moved back is never handed out (the records in
  between would be skipped);
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
never holds the head's commit back, except once when it is made: a new subscription's
starting positions are saved by the instance that makes it, and an instance that makes
the cursor of a subscription made elsewhere starts from them (``_shared_start``).  When
this engine starts it, it first takes up the positions the subscription's last
deliverer saved (``PositionStore.load_one``), unless the store holds nothing but what
this engine itself last saved or read there: nobody else delivered it since, and its own
positions are the newest (newer than the store's when core's fence refused its last save
for a moment, a heartbeat late under load: a purge was undone that way).  A started
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

Code layout: :class:`CursorEngine` (here: set-up, lifecycle, starting and stopping
cursors, settling and ``stats``) combines parts of one job each, over the state that
:class:`~wsnmom.adapters.logbase.parts.EngineParts` declares: :mod:`.subscriptions`
(making, re-binding, deleting and listing cursors), :mod:`.head` (the head thread),
:mod:`.catch_up` (the catch-up readers), :mod:`.commits` (the head's commit and saved
positions), :mod:`.burial` (dead letters), :mod:`.backlog` (``depth`` and ``discard``) and
:mod:`.peeking` (peek).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Mapping

from wsnmom.core.adapter import (
    AdapterUnavailable,
    PositionKeeper,
    Received,
)
from wsnmom.topic_mapping.index import TopicIndex

from .backend import (
    LogBackend,
    PositionStore,
    SelectiveHeadReader,
    StreamId,
)
from .backlog import Backlog
from .burial import Burial
from .catch_up import CatchUp
from .commits import Commits
from .cursor import Cursor
from .head import Head
from .kept import KeptPositions
from .peeking import Peeking
from .subscriptions import Subscriptions

__all__ = ["CursorEngine"]

log = logging.getLogger(__name__)


class CursorEngine(Subscriptions, Head, Commits, CatchUp, Burial, Backlog, Peeking):
    """Cursors over a ``LogBackend`` (see the module docstring).  Thread-safe."""

    #: seconds an operator's purge waits for the positions past what it dropped to be
    #: saved before it fails (``Backlog.purge``)
    purge_timeout = 10.0

    def __init__(
        self,
        backend: LogBackend,
        *,
        catch_up_readers: int = 4,
        batch: int = 500,
        poll_timeout: float = 0.1,
        commit_interval: float = 0.2,
        catch_up_slice: int = 20,
        catch_up_group: int = 256,
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
        #: at most this many queued cursors a catch-up thread looks at for others that
        #: start where the one it took starts (``CatchUp._gather``)
        self.catch_up_group = catch_up_group
        self._drains = 0  # polls a catch-up thread handed to a group (``CatchUp._fair``)
        #: several gateway instances deliver these subscriptions, one at a time each
        #: (see the module docstring); set before cursors are made
        self.shared = False
        #: shared: core's lease fence, asked before every position write (None: always)
        self.may_save: Callable[[str], bool] | None = None
        #: shared: core's keeper of positions fenced by shard epochs (``kept``)
        self.keeper: PositionKeeper | None = None
        self.lock = threading.RLock()
        self._cursors = {}
        self._index = TopicIndex()
        self._match_all = set()
        #: next offset the head reader returns per stream
        self._head = {}
        self._stored = {}
        self._to_delete = set()
        self._catch_up = queue.SimpleQueue()
        self._store = None
        self._head_reader = None
        self._threads = []
        self._running = self._dispatching = self._hold = False
        self._head_started = threading.Event()
        #: during a head poll: topics the selective head was told nobody wants, cursors
        #: that attached (``Head._recheck_attached``)
        self._refused, self._attached_meanwhile = set(), set()
        #: head sync: polls asked for / the last one that reached the end
        self._sync_asked = self._sync_done = 0
        self._sync_cv = threading.Condition(self.lock)
        self._wake_commit = threading.Event()
        self._last_head_commit = 0.0
        self._last_head_positions = {}
        #: records the head dispatched since its last commit
        self._since_head_commit = 0
        #: attached cursors to save positions of their own at the next commit pass
        self._own_save = set()
        #: when each cursor's own positions were last saved (monotonic)
        self._own_saved_at = {}
        #: cursors that may hold the head's commit back or have positions to save
        #: (in flight, detached and unsaved, or dirty): the commit passes look at these
        #: only, not at every cursor.  A superset: names are dropped when looked at.
        self._pinning = set()
        #: cursors whose dead letters were not published, and when to try again
        #: (monotonic): the commit thread hands them to a catch-up reader then
        self._bury_retry = {}
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
            self._store = self._position_store(self.backend.position_store())
            self._stored = self._store.load()
            self._saved_cv = threading.Condition(self.lock)  # see parts.py
            self._head_reader = self.backend.head_reader()
            if isinstance(self._head_reader, SelectiveHeadReader):
                self._head_reader.set_interest(self._topic_wanted)
            self._head = dict(self._head_reader.positions())
            self._running = True
        self._spawn(self._commit_loop, "wsnmom-log-commit")
        for i in range(self.catch_up_readers):
            self._spawn(self._catch_up_loop, f"wsnmom-log-catch-up-{i}")

    def _position_store(self, store: PositionStore) -> PositionStore:
        if self.shared and self.keeper is not None and not isinstance(store, KeptPositions):
            return KeptPositions(self.keeper, store)
        return store

    def keep_positions(self, keeper: PositionKeeper) -> None:
        """Shared: keep positions with core's fenced keeper from now on (``keeper``)."""
        with self.lock:
            self.keeper = keeper
            if self._store is not None:
                self._store = self._position_store(self._store)

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
            self._saved_cv.notify_all()
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
        own (stopped a moment ago), or positions it is saving now, are the newest there
        are, and are kept; so are positions the store holds nothing newer than (it holds
        only what this engine last saved or read there: nobody else delivered it since,
        and a save the fence refused meanwhile is not undone)."""
        store = self._store
        with self.lock:
            if (
                not cursor.foreign
                or cursor.started
                or cursor.dirty
                or cursor.saving
                or store is None
            ):
                cursor.foreign = False
                return
            saves = cursor.saves
        try:
            saved = store.load_one(cursor.name)
        except Exception as exc:
            raise AdapterUnavailable(
                f"reading the saved positions of {cursor.name} failed: {exc}"
            ) from exc
        with self.lock:
            # a save of this engine's that was on its way, or began, while the store was
            # read: what was read is older than the cursor (a purge's skip read back)
            if (
                not cursor.foreign
                or cursor.started
                or cursor.dirty
                or cursor.saving
                or cursor.saves != saves
            ):
                cursor.foreign = False
                return
            cursor.foreign = False
            if saved and self._written_elsewhere(cursor.name, saved):
                cursor.positions = {**cursor.positions, **saved}
                self._stored[cursor.name] = dict(saved)
            elif saved:
                # nobody else wrote since this engine's last save or read: its own
                # positions are at or past those (newer when the fence refused its last
                # save: a purge's skip read back brought the purged records again)
                cursor.positions = {**saved, **cursor.positions}

    def _written_elsewhere(self, name: str, saved: Mapping[StreamId, int]) -> bool:
        """Whether the positions ``saved`` (just read from the position store) hold one
        this engine neither saved nor read there last (hold the lock): another instance
        wrote them since."""
        known = self._stored.get(name)
        return known is None or any(known.get(s) != o for s, o in saved.items())

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
                elif moved and self.shared:
                    # its own positions are saved while they change (``_own_due``), also
                    # when it settles records handed out long ago and receives no more
                    # (a pull point drained after a burst)
                    self.may_pin(cursor.name)
                requeue = was_full and not cursor.window_full and not cursor.attached
            if requeue:
                self._queue_catch_up(cursor)

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
