"""How much of the shared filter processes each subscription used lately, and whether it
may use more now: the MessageContent budget over time (``filters.cpu_share``).

``filters.cpu_limit`` bounds one message.  A filter that stays just under it on every
message (0.3 s of a 0.5 s limit) is never ended, yet twenty of them kept both evaluation
processes busy and a cheap filter waited seconds for one (issue 22).  So each subscription
(a *key*) is charged the seconds it held an evaluation process, decayed with a half-life
of :data:`HALF_LIFE` seconds: its recent usage.  The steady usage of a subscription that
takes a fraction ``s`` of one process is ``s * HALF_LIFE / ln 2`` seconds; ``limit`` is
that for ``s = filters.cpu_share``.

* A subscription whose messages took more than ``heavy_cost`` seconds each lately is
  *heavy*: it may take an evaluation process only while another one stays idle (with one
  process: only while no other subscription waits), and it evaluates one message per
  turn.  A subscription not known to be cheap yet (no history) evaluates one message per
  turn too.  Cheap filters therefore always find a process without queueing behind costly
  ones, and costly ones never hold a process for a whole batch.
* A heavy subscription above ``limit`` is *pushed back*: its evaluation is refused with
  the seconds until its usage has decayed below the limit (:class:`FilterBusy`); its
  channel waits that long, holding no thread and no process, and tries again.  No message
  is dropped; the subscription's backlog waits in the middleware.  Cheap filters are never
  pushed back, however many messages they see: what they use is the gateway's work.
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

    def __init__(
        self, share: float, heavy_cost: float = 0.05, clock: Callable[[], float] = time.monotonic
    ) -> None:
        #: decayed seconds a key may have used
        self.limit = share * HALF_LIFE / math.log(2)
        self.heavy_cost = heavy_cost
        self._clock = clock
        self._usage: dict[str, tuple[float, float]] = {}
        #: recent seconds per message of each key
        self._cost: dict[str, float] = {}
        self._lock = threading.Lock()
        self._next_sweep = clock() + _FORGET_AFTER

    def _now_usage(self, key: str, now: float) -> float:
        used, at = self._usage.get(key, (0.0, now))
        return float(used * 0.5 ** ((now - at) / HALF_LIFE))

    def check(self, key: str) -> bool:
        """Whether ``key`` is heavy (see the module docstring); raises
        :class:`FilterBusy` when it is heavy and over its limit."""
        now = self._clock()
        with self._lock:
            used = self._now_usage(key, now)
            cost = self._cost.get(key, 0.0)
        heavy = cost > self.heavy_cost
        if heavy and used > self.limit:
            raise FilterBusy(HALF_LIFE * math.log2(used / self.limit))
        return heavy

    def known_cheap(self, key: str) -> bool:
        """Whether ``key``'s messages were cheap lately (it may evaluate a whole batch)."""
        with self._lock:
            cost = self._cost.get(key)
        return cost is not None and cost <= self.heavy_cost

    def charge(self, key: str, seconds: float, messages: int = 1) -> None:
        """``key`` held an evaluation process for ``seconds`` for ``messages``."""
        now = self._clock()
        per_message = seconds / max(1, messages)
        with self._lock:
            self._usage[key] = (self._now_usage(key, now) + seconds, now)
            old = self._cost.get(key)
            # a slow round trip on a loaded machine must not make a cheap filter heavy: a
            # cheaper measurement counts at once, a costlier one half
            self._cost[key] = (
                per_message if old is None else min(per_message, (old + per_message) / 2)
            )
            if now >= self._next_sweep:
                self._next_sweep = now + _FORGET_AFTER
                idle = [k for k, (_, at) in self._usage.items() if now - at > _FORGET_AFTER]
                for k in idle:
                    del self._usage[k]
                    self._cost.pop(k, None)

    def cost(self, key: str) -> float:
        """``key``'s recent seconds per message (0 without history)."""
        with self._lock:
            return self._cost.get(key, 0.0)

    def usage(self, key: str) -> float:
        """``key``'s decayed usage now, seconds."""
        with self._lock:
            return self._now_usage(key, self._clock())
