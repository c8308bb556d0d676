"""The cursor engine's backlog: how many records wait for a cursor (``depth``, ``depths``)
skipping some of them for the subscription's limits (``discard``), and an operator's
``purge``, which answers once the positions past what it dropped are saved (see
:mod:`wsnmom.adapters.logbase.engine`)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from wsnmom.core.adapter import AdapterError, AdapterUnavailable, SubscriptionHandle

from .backend import StreamId
from .cursor import Cursor, CursorHandle
from .parts import EngineParts


class Backlog(EngineParts):
    """The cursor engine's ``depth``, ``depths``, ``discard`` and ``purge``."""

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

    def purge(self, cursor: Cursor, timeout: float) -> int:
        """An operator's purge: skip every record waiting now (``discard`` of the depth)
        and return once the cursor's saved positions lie past them all, so that a crash
        right after the answer does not hand them out again (a catch-up reader applies
        the skip, the commit thread saves it: up to ``commit_interval`` and a read
        later).  Returns how many records were skipped (an estimate, as ``discard``).

        :raises AdapterError: the positions were not saved within ``timeout`` seconds (a
            position store that fails or does not answer, or, shared, a save core's
            fence refused); the records are skipped all the same, only not durably.
        """
        with self.lock:
            # where the records waiting now end, in each stream the cursor is behind in
            target = {
                stream: head
                for stream, head in self._head.items()
                if self._relevant(cursor, stream) and max(cursor.positions.get(stream, 0), 0) < head
            }
            waiting = self.depth(cursor)
            count = self.discard(cursor, waiting, newest=False) if waiting else 0
        if count and target:
            self._wait_saved(cursor, target, timeout)
        return count

    def _wait_saved(self, cursor: Cursor, target: dict[StreamId, int], timeout: float) -> None:
        """Wait until the positions saved for ``cursor`` reach ``target`` in every stream
        named (or it is deleted meanwhile)."""
        deadline = time.monotonic() + timeout
        self._wake_commit.set()
        self._wait_stored(cursor, target, timeout, deadline)

    def _wait_stored(
        self, cursor: Cursor, target: dict[StreamId, int], timeout: float, deadline: float
    ) -> None:
        with self.lock:
            while not cursor.deleted:
                saved = self._stored.get(cursor.name, {})
                if all(saved.get(stream, -1) >= end for stream, end in target.items()):
                    return
                if not self._running:
                    raise AdapterUnavailable(f"closing before the purge of {cursor.name} was saved")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AdapterError(
                        f"the purge of {cursor.name} was not saved within {timeout:g} s: "
                        "the dropped messages may come again after a restart"
                    )
                self._saved_cv.wait(min(left, self.commit_interval))
