"""The cursor engine's subscriptions: making a cursor (where it starts: stored positions,
the head while restoring, the current end, or, shared, what the instance that made it
saved), re-binding it to new patterns or limits, deleting and forgetting it, and listing
them (see :mod:`wsnmom.adapters.logbase.engine`)."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, cast

from wsnmom.core.adapter import (
    AdapterUnavailable,
    QueueLimits,
    SubscriptionHandle,
    SubscriptionSpec,
)

from .backend import StreamId
from .cursor import Bury, Cursor, CursorHandle
from .parts import EngineParts

if TYPE_CHECKING:
    from .engine import CursorEngine

log = logging.getLogger(f"{__package__}.engine")


class Subscriptions(EngineParts):
    """The cursor engine's ``subscription``, ``delete_subscription``,
    ``forget_subscription`` and ``names``."""

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
        made_here = False  # this instance saved where it starts (``_shared_start``)
        if stored is not None:
            positions = dict(stored)
        elif held:
            # restoring: a cursor without stored positions rode on the head, which has
            # not moved since its last commit
            with self.lock:
                positions = dict(self._head)
        else:
            positions = self._end_now()
            if self.shared:
                positions, made_here = self._shared_start(spec.name, positions, spec.origin)
        with self.lock:
            cursor = self._cursors.get(spec.name)
            if cursor is None:
                # this part exists only as a base of ``CursorEngine``
                engine = cast("CursorEngine", self)
                cursor = Cursor(engine, spec.name, spec.patterns, spec.limits, positions)
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
            if made_here:
                # its save made the position store's entry: a forget deletes it again (a
                # follower made a pull point's cursor after its DestroyPullPoint deleted
                # the entry, and left it for good)
                cursor.saved_here = True
            return CursorHandle(cursor)

    def _shared_start(
        self, name: str, ends: dict[StreamId, int], origin: str
    ) -> tuple[dict[StreamId, int], bool]:
        """Shared: where a cursor made here without known positions starts.  Made through
        another instance a moment ago (this one follows it): where that instance saved it,
        and from the start of each stream it saved nothing for (a stream that appeared
        since, such as the topic of the first notification published to it).  That
        instance saved nothing at all when it knew no stream yet: then every stream is
        read from its start (``origin`` "elsewhere"; taking it for a new one here started
        it at this instance's end and saved that, so the records published in between
        were skipped by whichever instance delivered it).  Else it is new: ``ends``,
        saved at once, so that whichever instance delivers it starts there and no record
        published after it was made is skipped.  With whether it saved.  Made here by a
        Subscribe a moment ago under a new name (``origin`` "new"), nothing of it can be
        stored yet: the store is not asked (a query of core's keeper and one of the
        backend's store saved on every Subscribe)."""
        store = self._store
        if store is None:
            return ends, False
        try:
            saved = None if origin == "new" else store.load_one(name)
            if saved is not None:
                return dict(saved), False
            if origin == "elsewhere":
                return {}, False
            start = {stream: offset for stream, offset in ends.items() if offset >= 0}
            if not start:  # no stream yet: nothing to save
                return ends, False
            # not fenced by ``may_save``: nobody delivers a subscription not made yet, and
            # the instance that makes it need not hold its shard
            store.save({name: start})
        except Exception as exc:
            raise AdapterUnavailable(f"saving where {name} starts failed: {exc}") from exc
        with self.lock:
            self._stored[name] = dict(start)
        return ends, True

    def _end_now(self) -> dict[StreamId, int]:
        """Where a new cursor starts: the current end of every stream (from the backend
        when it can tell, else once the head reader has caught up), and in any case
        after the gateway's own confirmed publishes (``_ends_at_least``): a head reader
        that did not catch up within the wait (a loaded machine) would otherwise hand
        the new cursor a record confirmed before it was made."""
        exact = self.backend.end_positions()
        ends = self._ends_at_least(exact)
        self._start_head()
        with self.lock:
            if exact is None:
                self._sync_head_locked(timeout=max(1.0, 10 * self.poll_timeout))
            out = dict(self._head)
            for stream, offset in ends.items():
                out[stream] = max(out.get(stream, 0), offset)
            return out

    def _ends_at_least(self, exact: dict[StreamId, int] | None) -> dict[StreamId, int]:
        """Where each stream ends at least now: the backend's ``exact`` ends where it
        can tell (``end_positions``), and after the gateway's own confirmed publishes
        where it keeps those (a backend's optional ``published_ends``: Kafka without
        trusted watermarks)."""
        ends = dict(exact or {})
        published = getattr(self.backend, "published_ends", None)
        if callable(published):
            for stream, end in published().items():
                ends[stream] = max(ends.get(stream, 0), end)
        return ends

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
        self._release(name, delete=True)

    def forget_subscription(self, name: str) -> None:
        """Shared: another instance deleted the subscription ``name`` (idempotent).  The
        cursor is dropped and nothing of it is saved any more; when this instance saved
        its positions before (it delivered it: a save under way may land after the other
        instance's delete and make the stored positions again; or it saved where the
        cursor starts when it made it, possibly after that delete), they are deleted once
        more, by the commit thread after any save of its already under way."""
        with self.lock:
            cursor = self._cursors.get(name)
            wrote = cursor is not None and cursor.saved_here
        self._release(name, delete=wrote)

    def _release(self, name: str, *, delete: bool) -> None:
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
            if delete:
                self._to_delete.add(name)
        if delete:
            self._wake_commit.set()

    def names(self) -> list[str]:
        """Cursors open now or stored."""
        with self.lock:
            return sorted(set(self._cursors) | set(self._stored))
