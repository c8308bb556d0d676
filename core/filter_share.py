"""How much of the shared filter processes each subscription used lately, and whether it
may use more now: the MessageContent budget over time (``filters.cpu_share``).

``filters.cpu_limit`` bounds one message.  A filter that stays just under it on every
message (0.3 s of a 0.5 s limit) is never ended, yet twenty of them kept both evaluation
processes busy and a cheap filter waited seconds for one (issue 22).  So each subscription
(a *key*) is charged the seconds it held an evaluation process, decayed with a half-life
of :data:`HALF_LIFE` seconds: its recent usage.  The steady usage of a subscription that
takes a fraction ``s`` of one process is ``s * HALF_LIFE / ln 2`` seconds; ``limit`` is
that for ``s = filters.cpu_share``.

* A subscription above ``limit`` is *pushed back*: its evaluation is refused with the
  seconds until its usage has decayed below the limit (:class:`FilterBusy`); its channel
  waits that long, holding no thread and no process, and tries again.  No message is
  dropped; the subscription's backlog waits in the middleware.
* A subscription above half of ``limit`` is *heavy*: it may take an evaluation process
  only while another one stays idle (with one process: only while no other subscription
  waits).  Cheap filters therefore always find a process without queueing behind costly
  ones.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

__all__ = ["HALF_LIFE", "FilterBusy", "FilterShares"]

#: seconds after which a subscription's past usage counts half
HALF_LIFE = 10.0
#: keys not used for this long are forgotten
_FORGET_AFTER = 20 * HALF_LIFE


class FilterBusy(Exception):
    """The subscription used its share of the filter processes: try again after
    ``delay`` seconds."""

    def __init__(self, delay: float) -> None:
        super().__init__(f"filter share used up; again in {delay:.2f}s")
        self.delay = delay


class FilterShares:
    """Recent evaluation time per key; thread-safe."""

    def __init__(self, share: float, clock: Callable[[], float] = time.monotonic) -> None:
        #: decayed seconds a key may have used
        self.limit = share * HALF_LIFE / math.log(2)
        self._clock = clock
        self._usage: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()
        self._next_sweep = clock() + _FORGET_AFTER

    def _now_usage(self, key: str, now: float) -> float:
        used, at = self._usage.get(key, (0.0, now))
        return used * 0.5 ** ((now - at) / HALF_LIFE)

    def check(self, key: str) -> bool:
        """Whether ``key`` is heavy (see the module docstring); raises
        :class:`FilterBusy` when it is over its limit."""
        now = self._clock()
        with self._lock:
            used = self._now_usage(key, now)
        if used > self.limit:
            raise FilterBusy(HALF_LIFE * math.log2(used / self.limit))
        return used > self.limit / 2

    def charge(self, key: str, seconds: float) -> None:
        """``key`` held an evaluation process for ``seconds``."""
        now = self._clock()
        with self._lock:
            self._usage[key] = (self._now_usage(key, now) + seconds, now)
            if now >= self._next_sweep:
                self._next_sweep = now + _FORGET_AFTER
                old = [k for k, (_, at) in self._usage.items() if now - at > _FORGET_AFTER]
                for k in old:
                    del self._usage[k]

    def usage(self, key: str) -> float:
        """``key``'s decayed usage now, seconds."""
        with self._lock:
            return self._now_usage(key, self._clock())
