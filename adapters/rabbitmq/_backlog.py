"""How much work waits on one connection, to tell an overloaded RabbitMQ from a lost one.

Every operation a thread hands to a connection's I/O thread (``Link.submit``, the direct
``basic.get`` chains) is counted here while it waits.  When one runs out of time while the
connection is still up, the broker (or the gateway's own I/O thread) is slow, not gone: the
adapter then raises ``MiddlewareBusy`` with ``retry_after`` estimated from this backlog, the
operations waiting divided by the rate at which the connection finished operations over
the last few seconds.  A lost connection stays ``AdapterUnavailable``.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

__all__ = ["Backlog"]

#: seconds of completions the rate is measured over
WINDOW = 5.0
#: bounds of the estimate, seconds
MIN_RETRY = 1.0
MAX_RETRY = 60.0


class Backlog:
    """Operations waiting on one connection, and how fast it finishes them.  Thread-safe."""

    __slots__ = ("_clock", "_done", "_lock", "waiting")

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        #: operations begun and not ended
        self.waiting = 0
        #: when recent operations ended (within WINDOW)
        self._done: deque[float] = deque()

    def begin(self) -> None:
        """An operation starts waiting for the connection."""
        with self._lock:
            self.waiting += 1

    def end(self, *, completed: bool = True) -> None:
        """It is over (``completed``: answered, so it counts towards the rate)."""
        now = self._clock()
        with self._lock:
            self.waiting = max(0, self.waiting - 1)
            if completed:
                self._done.append(now)
            self._trim(now)

    def _trim(self, now: float) -> None:
        done = self._done
        while done and now - done[0] > WINDOW:
            done.popleft()

    def retry_after(self, timeout: float) -> float:
        """Seconds until the operations waiting now should be through: waiting / recent
        rate; ``timeout`` when nothing finished recently (between ``MIN_RETRY`` and
        ``MAX_RETRY``)."""
        now = self._clock()
        with self._lock:
            self._trim(now)
            waiting = max(1, self.waiting)
            finished = len(self._done)
        estimate = waiting / (finished / WINDOW) if finished else timeout
        return min(MAX_RETRY, max(MIN_RETRY, estimate))
