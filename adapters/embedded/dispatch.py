"""Push delivery and pull wake-ups of the embedded engine: one dispatcher thread per engine
serves started handles round-robin (never holding the database lock while it calls
``on_message``) and flushes group-committed acknowledgements; pull waiters wait for
arrivals (see :mod:`wsnmom.adapters.embedded.store`).

While core restores its subscriptions at start-up (``restoring`` .. ``restored``) a started
handle gets no round of its own: ``restored`` schedules, in one query, only the handles
whose queues hold ready messages.  A round of an empty queue is a transaction that finds
nothing, and 10,000 of them competed with the restore for the engine's lock and the GIL
(docs/performance/findings.md, F30)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

from wsnmom.core.adapter import (
    AdapterError,
    AdapterUnavailable,
)

from .parts import EngineParts

if TYPE_CHECKING:
    from wsnmom.adapters.embedded.adapter import EmbeddedHandle

#: the engine's logger (one name for all its parts)
log = logging.getLogger(f"{__package__}.store")

#: largest batch the dispatcher fetches for one handle in one transaction
_FETCH_BATCH = 256
#: seconds acks may wait for others to share their commit
_ACK_DELAY = 0.002


class Dispatch(EngineParts):
    """The dispatcher and arrival signal of an engine."""

    def _kick(self) -> None:
        """Make sure the dispatcher thread runs (it flushes pending acks)."""
        with self._cv:
            self._ensure_dispatcher()
            self._cv.notify()

    def wait_arrival(self, since: int, timeout: float) -> int:
        """Block until a publish after ``since`` (an ``arrivals`` value) or timeout."""
        with self._arrival:
            if self._arrivals == since and not self._closed:
                self._arrival.wait(timeout)
            return self._arrivals

    @property
    def arrivals(self) -> int:
        return self._arrivals

    def _wake(self, sids: Iterable[int]) -> None:
        sids = set(sids)
        if not sids:
            return
        with self._arrival:
            self._arrivals += 1
            self._arrival.notify_all()
        handles = [h for sid in sids for h in tuple(self.started.get(sid, ()))]
        if handles:
            self.schedule(handles)

    def restoring(self) -> None:
        """Hold back the first rounds of handles started from now until ``restored``."""
        with self._cv:
            self._holding += 1

    def restored(self) -> None:
        """End a ``restoring``: schedule the started handles whose queues hold ready
        messages (the others are scheduled by the next publish that reaches them)."""
        # under ``lock`` (then ``_cv``, the order of a commit that wakes handles): an
        # attach, which holds ``lock``, sees ``_holding`` and the shared transaction agree
        failed: BaseException | None = None
        with self.lock:
            with self._cv:
                self._holding = max(0, self._holding - 1)
                if self._holding:
                    return
            try:
                self.end_batch()
            except Exception as exc:
                failed = exc
            failed, self._batch_error = self._batch_error or failed, None
        # a handle that skipped its round joined ``started`` before it looked at
        # ``_holding``, so this query, made after ``_holding`` fell to 0, sees its queue
        self.schedule(h for sid in self.waiting() for h in tuple(self.started.get(sid, ())))
        if failed is not None:
            raise AdapterError(
                f"the restore's new durable subscriptions were not committed: {failed}"
            ) from failed

    def schedule_start(self, handle: EmbeddedHandle) -> None:
        """The first round of a handle just started (held back while restoring)."""
        with self._cv:
            if self._holding:
                return
        self.schedule([handle])

    def schedule(self, handles: Iterable[EmbeddedHandle]) -> None:
        """Queue started handles for a dispatcher round."""
        with self._cv:
            for h in handles:
                if h not in self._queued:
                    self._queued.add(h)
                    self._ready.append(h)
            self._ensure_dispatcher()
            self._cv.notify()

    def _ensure_dispatcher(self) -> None:
        # call with self._cv held
        if self._dispatcher is None and not self._closed:
            self._dispatcher = threading.Thread(
                target=self._dispatch_loop, name=f"wsnmom-embedded-{self.path}", daemon=True
            )
            self._dispatcher.start()

    def _dispatch_loop(self) -> None:
        while True:
            h: EmbeddedHandle | None = None
            with self._cv:
                while not self._ready and not self._closed:
                    if self._pending_acks:
                        self._cv.wait(_ACK_DELAY)  # let acks coalesce, then flush them
                        break
                    self._cv.wait()
                if self._closed:
                    return
                if self._ready:
                    h = self._ready.popleft()
                    self._queued.discard(h)
            if h is None:
                try:
                    self.flush_acks()
                except Exception:  # pragma: no cover - e.g. closed meanwhile
                    log.exception("embedded store: flushing acks failed")
                continue
            try:
                more = h.dispatch_round(_FETCH_BATCH)
            except AdapterUnavailable:  # closed while dispatching
                more = False
            except Exception:  # pragma: no cover - defensive: keep the dispatcher alive
                log.exception("embedded dispatcher failed for %s", h.name)
                more = False
            if more:
                self.schedule([h])
