"""The cursor engine's commits: the head's commit below every unsettled record that may hold
it back, the positions of detached cursors and the cursors' own positions saved by the
commit thread (see :mod:`wsnmom.adapters.logbase.engine`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from .backend import (
    HeadReader,
    SaveCut,
    StreamId,
)
from .cursor import Cursor
from .kept import KeptPositions
from .parts import EngineParts

#: the engine's logger (one name for all its parts)
log = logging.getLogger(f"{__package__}.engine")


class Commits(EngineParts):
    """Commits and saved positions of a :class:`~wsnmom.adapters.logbase.engine.CursorEngine`."""

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
            except SaveCut:
                log.debug("a position save was cut short by the close, which saves again")
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
                        cursor.saved_here = True
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
                cursor.saved_here = True
            deletes = {n for n in self._to_delete if n not in changes}
            self._to_delete = set()
            saving = [c for n in changes if (c := self._cursors.get(n)) is not None]
            for cursor in saving:
                cursor.saving += 1
                cursor.saves += 1
        try:
            self._save(changes, own, deletes, now)
        finally:
            with self.lock:
                for cursor in saving:
                    cursor.saving -= 1
                self._saved_cv.notify_all()

    def _save(
        self,
        changes: dict[str, dict[StreamId, int]],
        own: dict[str, int],
        deletes: set[str],
        now: float,
    ) -> None:
        """Write what ``_flush_positions`` took at ``now``: ``changes`` (``own``: those of
        attached cursors, with their generation) and ``deletes``."""
        store = self._store
        assert store is not None
        self._fence(changes, own)
        if changes:
            try:
                if isinstance(store, KeptPositions):
                    self._drop_refused(store.save_fenced(changes), changes, own)
                else:
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

    def _fence(self, changes: dict[str, dict[StreamId, int]], own: dict[str, int]) -> None:
        """Shared: drop the position writes core's fence refuses (this instance no longer
        holds the subscription's shard: another one may deliver it and save positions
        ahead of these; a zombie's last write would move them back)."""
        may_save = self.may_save
        if not self.shared or may_save is None:
            return
        for name in [n for n in changes if not may_save(n)]:
            del changes[name]
            own.pop(name, None)
            log.info("position of %s not saved: this instance no longer delivers it", name)

    @staticmethod
    def _drop_refused(
        refused: Mapping[str, str], changes: dict[str, dict[StreamId, int]], own: dict[str, int]
    ) -> None:
        """Drop what core's keeper refused from what is recorded as saved: as a refusal of
        the fence (``_fence``), for a write that passed it and then found the shard gone
        (let go since, or taken over by another instance once it reached the store: a
        process stopped in between); logged with the keeper's words for which."""
        for name, why in refused.items():
            changes.pop(name, None)
            own.pop(name, None)
            log.info("position of %s not saved: %s", name, why)

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
