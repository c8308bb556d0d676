"""One subscription as a cursor over shared logs: positions, messages in flight, in-order
settling, and the handle and message objects the adapter contract hands to core.

A cursor is either *attached* (it rides on the engine's head reader, which hands it every
matching record as it arrives) or *detached* (it has positions of its own, per stream,
and a catch-up reader brings it forward until it reaches the head again).  Messages in
flight are kept per stream in offset order; settling one (``ack``, or ``nack`` without
requeue) marks it, and the cursor's committed position in that stream advances past
every settled message at the front.  What the cursor commits is therefore always a
contiguous prefix: an acked message behind an unsettled one is delivered again after a
crash (at-least-once).

All state changes happen under the engine's lock (``CursorEngine.lock``); deliveries are
queued in the cursor's outbox under that lock and handed to the subscriber outside it, in
order, by whichever thread queued them (``Cursor.drain``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from wsnmom.core.adapter import (
    DROPPED_OVERFLOW,
    OutboundMessage,
    QueueLimits,
    Received,
    StoredMessage,
    SubscriptionHandle,
    is_internal_namespace,
)
from wsnmom.topic_mapping.model import PathPattern, Topic

from .backend import LogRecord, StreamId

if TYPE_CHECKING:
    from .engine import CursorEngine

__all__ = ["Bury", "Cursor", "CursorHandle", "CursorReceived"]

#: publishes dead letters, confirmed on return (the adapter's ``publish_many``)
Bury = Callable[[Sequence[OutboundMessage]], Any]


class CursorReceived(Received):
    """A record handed to a subscriber; settles through its cursor."""

    __slots__ = ("_cursor", "_gen", "_offset", "_settled", "_stream", "shared")

    def __init__(self, cursor: Cursor, record: LogRecord, gen: int, redelivered: bool) -> None:
        self._cursor = cursor
        self._stream = record.stream
        self._offset = record.offset
        self._gen = gen
        self._settled = False
        self.topic = record.topic
        self.body = record.body
        self.headers = record.headers
        self.content_type = record.content_type
        self.redelivered = redelivered
        self.timestamp: datetime | None = record.timestamp
        self.shared = record.shared

    def ack(self) -> None:
        """Done: the cursor may commit past this record once everything before it is."""
        self._settle(requeue=False)

    def nack(self, requeue: bool = True) -> None:
        """``requeue``: rewind the cursor to this record (later ones come again too);
        otherwise drop it (settled like an ack)."""
        self._settle(requeue=requeue)

    def _settle(self, requeue: bool) -> None:
        if self._settled:
            return
        self._settled = True
        self._cursor.engine.settle(self._cursor, self._stream, self._offset, self._gen, requeue)

    def __repr__(self) -> str:
        return f"<CursorReceived {self.topic} {self._stream}@{self._offset}>"


class Cursor:
    """The state of one subscription (see the module docstring).  Guarded by the engine's
    lock, except the outbox, which has its own."""

    def __init__(
        self,
        engine: CursorEngine,
        name: str,
        patterns: tuple[PathPattern, ...] | None,
        limits: QueueLimits,
        positions: dict[StreamId, int],
    ) -> None:
        self.engine = engine
        self.name = name
        self.patterns = patterns
        self.limits = limits
        #: detached: next offset to read per stream; attached: ignored
        self.positions = positions
        #: attached: records below these offsets were already read by a catch-up reader
        self.floor: dict[StreamId, int] = {}
        self._attached = False
        self._dirty = False
        # a new cursor is detached: it may hold the head's commit back
        engine.may_pin(name)
        self.started = False
        self.deleted = False
        self.callback: Callable[[Received], None] | None = None
        self.prefetch = 64
        #: handed out and unsettled (False) or settled behind an unsettled one (True),
        #: per stream, in offset order
        self.inflight: dict[StreamId, OrderedDict[int, bool]] = {}
        self.unsettled = 0
        #: bumped by stop/rewind: settles of older hand-outs are ignored
        self.gen = 0
        #: records below these offsets were handed out before: they come as redelivered
        self.redeliver_below: dict[StreamId, int] = {}
        #: queued for a catch-up reader
        self.queued = False
        #: a catch-up reader serves it now (it is not queued meanwhile) / asked for
        #: another turn meanwhile, which it gets when that reader's turn ends
        self.serving = False
        self.recheck = False
        #: messages the log deleted before this cursor read them (retention)
        self.lost = 0
        #: matching records still to skip (``discard`` of the oldest)
        self.skip_oldest = 0
        #: where the records ``discard`` skips go (``SubscriptionSpec.dead_letters``) and
        #: how (``Bury``); either None: they are skipped unread
        self.dead_letters: Topic | None = None
        self.bury: Bury | None = None
        #: records skipped for ``discard`` and held in flight until ``bury`` confirmed them
        self.dropping: list[LogRecord] = []
        #: how many of the records in flight are such (they do not count in the window)
        self.held_drops = 0
        #: failed ``bury`` attempts in a row, and when (monotonic) the next one is due
        self.bury_failures = 0
        self.bury_due = 0.0
        #: the ``HEADER_DROPPED_REASON`` of what it buries, more headers for them, and how
        #: many it buried (``CursorEngine.delete_into_dead_letters``)
        self.drop_reason = DROPPED_OVERFLOW
        self.drop_context: dict[str, str] = {}
        self.buried = 0
        #: ``discard(newest=True)``: deliver this many more, then jump to ``cap_until``
        self.cap_budget: int | None = None
        self.cap_until: dict[StreamId, int] = {}
        #: attached with positions of its own in the position store, at or below its
        #: current ones: it does not hold the head's commit back (see the engine)
        self.own_positions = False
        #: shared engine: not started here since it was made or stopped; its positions
        #: are taken up from the position store when it starts (see the engine)
        self.foreign = False
        #: the commit thread took its positions for saving at least once (see
        #: ``CursorEngine.forget_subscription``)
        self.saved_here = False
        #: saves of its positions the commit thread took (``saves``) and has not finished
        #: (``saving``): while one is on its way the position store holds older positions
        #: than this cursor (see ``CursorEngine._take_up``)
        self.saves = 0
        self.saving = 0
        #: per stream, the first unsettled offset the commit pass saw and since when
        self.pin_seen: dict[StreamId, tuple[int, float]] = {}
        self._outbox: deque[CursorReceived] = deque()
        self._outbox_lock = threading.Lock()
        self._draining = False

    # -- state the engine's commit bookkeeping follows -----------------------------------------
    @property
    def attached(self) -> bool:
        """Riding on the head reader (else detached, with positions of its own)."""
        return self._attached

    @attached.setter
    def attached(self, value: bool) -> None:
        self._attached = value
        if not value:
            self.own_positions = False
            self.pin_seen = {}
            self.engine.may_pin(self.name)

    @property
    def dirty(self) -> bool:
        """Positions changed since the position store last saved them."""
        return self._dirty

    @dirty.setter
    def dirty(self, value: bool) -> None:
        self._dirty = value
        if value:
            self.engine.may_pin(self.name)

    # -- matching --------------------------------------------------------------------------
    def wants(self, topic: Topic) -> bool:
        """Whether a record on ``topic`` is for this cursor."""
        if self.patterns is None:
            return not is_internal_namespace(topic.namespace)
        return any(p.matches(topic) for p in self.patterns)

    @property
    def window_full(self) -> bool:
        """No more hand-outs until something is settled (records held for the dead
        letters do not count: a dead-letter publish that keeps failing must not stop
        delivery; see the engine)."""
        return self.unsettled - self.held_drops >= self.prefetch

    # -- hand-out (engine lock held) -------------------------------------------------------
    def hand_out(self, record: LogRecord) -> None:
        """Queue ``record`` for the subscriber and track it in flight."""
        self.hold(record)
        redelivered = record.offset < self.redeliver_below.get(record.stream, -1)
        self._outbox.append(CursorReceived(self, record, self.gen, redelivered))

    def hold(self, record: LogRecord) -> None:
        """Track ``record`` in flight (unsettled): the cursor commits no position past it
        until it is settled."""
        stream = record.stream
        queue = self.inflight.get(stream)
        if queue is None:
            queue = self.inflight[stream] = OrderedDict()
        if not queue:
            self.engine.may_pin(self.name)
        queue[record.offset] = False
        self.unsettled += 1

    def committed(self, stream: StreamId, read_position: int) -> int:
        """The offset this cursor may commit in ``stream``: its first unsettled record, or
        ``read_position`` (the next record it would read) when nothing is in flight."""
        queue = self.inflight.get(stream)
        if queue:
            return min(next(iter(queue)), read_position)
        return read_position

    def settle(self, stream: StreamId, offset: int) -> bool:
        """Mark one record settled; True when the committed position moved."""
        queue = self.inflight.get(stream)
        if queue is None or offset not in queue or queue[offset]:
            return False
        queue[offset] = True
        self.unsettled -= 1
        moved = False
        while queue:
            first = next(iter(queue))
            if not queue[first]:
                break
            del queue[first]
            moved = True
        if not queue:
            del self.inflight[stream]
        return moved

    def forget_inflight(self, head_positions: Mapping[StreamId, int]) -> None:
        """Stop or rewind: give back everything in flight.  The cursor detaches with each
        stream's position at its first unsettled record (or where it was), and records
        handed out before are marked for redelivery."""
        base = dict(self.positions) if not self.attached else dict(head_positions)
        if self.attached:
            for stream, floor in self.floor.items():
                base[stream] = max(base.get(stream, floor), floor)
        for stream, queue in self.inflight.items():
            if queue:
                first = next(iter(queue))
                last = next(reversed(queue))
                base[stream] = min(base.get(stream, first), first)
                self.redeliver_below[stream] = max(self.redeliver_below.get(stream, -1), last + 1)
        self.inflight = {}
        self.unsettled = 0
        self.held_drops = 0
        # held for the dead letters: read, skipped and buried again from the position
        # it goes back to (the oldest waiting then)
        self.skip_oldest += len(self.dropping)
        self.dropping = []
        self.gen += 1
        self.positions = base
        self.attached = False
        self.floor = {}
        self.dirty = True
        with self._outbox_lock:
            self._outbox.clear()

    # -- delivery (no engine lock) ---------------------------------------------------------
    def drain(self) -> None:
        """Hand queued records to the subscriber, in order, on this thread; another
        thread already draining this cursor delivers them instead."""
        with self._outbox_lock:
            if self._draining:
                return
            self._draining = True
        try:
            while True:
                with self._outbox_lock:
                    if not self._outbox:
                        self._draining = False
                        return
                    received = self._outbox.popleft()
                    callback = self.callback
                if callback is not None and received._gen == self.gen:
                    callback(received)
        except BaseException:
            with self._outbox_lock:
                self._draining = False
            raise


class CursorHandle(SubscriptionHandle):
    """The adapter contract's handle on one cursor (push only: log adapters declare
    ``native_pull=False`` and core keeps a pull buffer)."""

    __slots__ = ("__weakref__", "_cursor", "name")

    def __init__(self, cursor: Cursor) -> None:
        self._cursor = cursor
        self.name = cursor.name

    def start(self, on_message: Callable[[Received], None], prefetch: int = 64) -> None:
        """Push mode; resumes from the cursor's position after ``stop``."""
        self._cursor.engine.start_cursor(self._cursor, on_message, prefetch)

    def stop(self) -> None:
        """Pause: unsettled messages come again (redelivered) after the next start."""
        self._cursor.engine.stop_cursor(self._cursor)

    def pull(self, max_messages: int, timeout: float = 0.0) -> list[Received]:
        """Not served: log adapters declare ``native_pull=False``."""
        raise NotImplementedError("log cursors are push only (native_pull=False)")

    def take(self, max_messages: int) -> list[Received]:
        """Not served: log adapters declare ``native_pull=False``."""
        raise NotImplementedError("log cursors are push only (native_pull=False)")

    def depth(self) -> int | None:
        """Records between the cursor and the head of its streams (see the engine)."""
        return self._cursor.engine.depth(self._cursor)

    def peek(self, max_messages: int) -> list[StoredMessage]:
        """The first waiting records, read by a reader of its own and committed nowhere
        (see ``CursorEngine.peek``)."""
        return [
            StoredMessage(
                topic=r.topic,
                body=r.body,
                headers=r.headers,
                content_type=r.content_type,
                timestamp=r.timestamp,
            )
            for r in self._cursor.engine.peek(self._cursor, max_messages)
        ]

    def discard(self, count: int, *, newest: bool = False) -> int:
        """Skip the oldest (or newest) ``count`` waiting records (see the engine)."""
        return self._cursor.engine.discard(self._cursor, count, newest=newest)

    def purge(self) -> int | None:
        """Skip every waiting record; answers once the position past them is saved (see
        ``CursorEngine.purge``)."""
        engine = self._cursor.engine
        return engine.purge(self._cursor, engine.purge_timeout)

    def lost(self) -> int:
        """Records retention deleted before this cursor read them."""
        return self._cursor.lost

    def delete(self) -> None:
        """Forget the cursor and its stored positions."""
        self._cursor.engine.delete_subscription(self.name)

    def delete_into_dead_letters(
        self, reason: str, context: Mapping[str, str], timeout: float = 30.0
    ) -> int:
        """Bury every waiting record up to the head, then forget the cursor (see the
        engine)."""
        return self._cursor.engine.delete_into_dead_letters(self._cursor, reason, context, timeout)

    def __repr__(self) -> str:
        c = self._cursor
        state = "attached" if c.attached else "detached"
        return f"<CursorHandle {self.name} {state} started={c.started} unsettled={c.unsettled}>"
