"""The cursor engine's backlog: how many records wait for a cursor (``depth``, ``depths``)
and skipping some of them for the subscription's limits (``discard``), see
:mod:`wsnmom.adapters.logbase.engine`."""

from __future__ import annotations

from collections.abc import Sequence

from wsnmom.core.adapter import SubscriptionHandle

from .cursor import Cursor, CursorHandle
from .parts import EngineParts


class Backlog(EngineParts):
    """The cursor engine's ``depth``, ``depths`` and ``discard``."""

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
