"""Calls made after a delay on a few shared threads (``later``), instead of a thread that
sleeps for each one (``threading.Timer``).

Retries that wait for the middleware come in numbers during an outage: a stalled pull
feed's dead letter (``core.pull_stall``), a resumed feed's start, a delivery channel's
start after a give-up.  With a ``threading.Timer`` each waited on a thread of its own:
thousands of stalled feeds were thousands of threads.  Here one thread keeps the due
times in a heap and hands what is due to at most :data:`WORKERS` threads, started as
needed; a call that blocks (a publish waiting for its confirmation) holds one worker,
and the next due calls wait for a free one.  The threads are daemons: a call still
waiting when the process exits is not made (every caller's call is a retry whose
work the next start does again).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable

__all__ = ["WORKERS", "Later", "later", "shared"]

log = logging.getLogger(__name__)

#: threads that make the due calls, at most
WORKERS = 4


class Later:
    """A heap of (due time, call) served by one timing thread and up to ``workers``
    calling threads, all started at the first call.  Thread-safe."""

    def __init__(self, workers: int = WORKERS, name: str = "wsnmom-later") -> None:
        self._name = name
        self._workers = workers
        self._cv = threading.Condition()
        self._due: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        #: due calls for the workers; None ends a worker (``close``)
        self._ready: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._started = 0
        self._idle = 0
        self._timing: threading.Thread | None = None
        self._threads: list[threading.Thread] = []
        self._closed = False

    def call(self, delay: float, fn: Callable[[], None]) -> None:
        """Call ``fn`` (no arguments) in ``delay`` seconds on one of the shared threads;
        what it raises is logged."""
        with self._cv:
            if self._closed:
                raise RuntimeError(f"{self._name} is closed")
            heapq.heappush(self._due, (time.monotonic() + delay, next(self._seq), fn))
            if self._timing is None:
                self._timing = self._thread(self._time, "timer")
            self._cv.notify()

    def threads(self) -> int:
        """How many threads serve the calls now (the timing thread included)."""
        with self._cv:
            return self._started + (self._timing is not None)

    def close(self, timeout: float = 5.0) -> None:
        """Drop the calls not yet due and end the threads once the calls being made
        return (waiting up to ``timeout`` for them).  For instances of a lifetime shorter
        than the process's (tests); the shared one is never closed."""
        with self._cv:
            self._closed = True
            self._due.clear()
            threads = list(self._threads)
            for _ in range(self._started):
                self._ready.put(None)
            self._cv.notify_all()
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _thread(self, target: Callable[[], None], role: str) -> threading.Thread:
        thread = threading.Thread(target=target, name=f"{self._name}-{role}", daemon=True)
        thread.start()
        self._threads.append(thread)
        return thread

    def _time(self) -> None:
        while True:
            with self._cv:
                while True:
                    if self._closed:
                        return
                    wait = self._due[0][0] - time.monotonic() if self._due else None
                    if wait is not None and wait <= 0:
                        break
                    self._cv.wait(wait)
                _, _, fn = heapq.heappop(self._due)
                if self._idle == 0 and self._started < self._workers:
                    self._started += 1
                    self._idle += 1
                    self._thread(self._work, f"worker-{self._started}")
                self._idle -= 1  # taken by the call below (counted back when it is done)
            self._ready.put(fn)

    def _work(self) -> None:
        while True:
            fn = self._ready.get()
            if fn is None:
                return
            try:
                fn()
            except Exception:
                log.exception("a call made later failed")
            finally:
                with self._cv:
                    self._idle += 1


#: the process's shared instance (``later``)
_SHARED = Later()


def later(delay: float, fn: Callable[[], None]) -> None:
    """Call ``fn`` in ``delay`` seconds on the process's shared threads (``Later.call``)."""
    _SHARED.call(delay, fn)


def shared() -> Later:
    """The process's shared instance (tests and the admin's thread counts read it)."""
    return _SHARED
