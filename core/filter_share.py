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
  *heavy*: it is evaluated on the costly filters' low-priority processes only
  (``core.filter_sandbox``), one message per turn.  A subscription not known to be cheap
  yet (no history) is evaluated that way too.  Cheap filters therefore never queue behind
  costly ones, and costly ones never hold a process for a whole batch.
* A heavy subscription above ``limit`` is *pushed back*: its evaluation is refused with
  the seconds until its usage has decayed below the limit (:class:`FilterBusy`); its
  channel waits that long, holding no thread and no process, and tries again.  No message
  is dropped; the subscription's backlog waits in the middleware.  Cheap filters are never
  pushed back, however many messages they see: what they use is the gateway's work.
* A subscription not known to be cheap yet (no history) is admitted like a heavy one:
  each costly subscription's first message would otherwise take a process as a cheap
  filter does, and twenty of them held both processes for seconds (issue 22).
* All heavy (and not yet known) subscriptions together are one group with a budget of
  their own, ``group_share`` of one process (a token bucket: that rate, a burst of one
  ``cpu_limit``, a debt of at most as much): per-subscription shares alone let twenty
  costly subscriptions keep a process busy for good, and the gateway shares its CPUs with
  that process.  A heavy subscription refused for the group's sake is pushed back the
  same way.
* A heavy subscription that stays over its own share for ``end_after`` seconds (its usage
  never decayed below half its limit meanwhile) is ended (:class:`FilterShareExceeded`):
  its backlog alone would hold it over its share for good.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

__all__ = ["HALF_LIFE", "FilterBusy", "FilterShareExceeded", "FilterShares"]

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


class FilterShareExceeded(Exception):
    """The subscription stayed over its share for ``end_after`` seconds: end it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class FilterShares:
    """Recent evaluation time per key, and the heavy keys' group budget; thread-safe."""

    def __init__(
        self,
        share: float,
        heavy_cost: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
        *,
        group_share: float | None = None,
        burst: float = 0.5,
        end_after: float = 0.0,
    ) -> None:
        #: decayed seconds a key may have used
        self.limit = share * HALF_LIFE / math.log(2)
        self.heavy_cost = heavy_cost
        #: processes' worth all heavy keys together may use (None: no group budget)
        self.group_share = group_share
        #: seconds the group may use at once beyond its rate
        self.burst = max(burst, 0.0)
        #: seconds a key may stay over its share before it is ended (0: never)
        self.end_after = end_after
        self._clock = clock
        self._usage: dict[str, tuple[float, float]] = {}
        #: recent seconds per message of each key
        self._cost: dict[str, float] = {}
        #: since when each key has been over its share (cleared below half of it)
        self._over: dict[str, float] = {}
        #: the group's token bucket: seconds it may use now, and when that was computed
        self._tokens = self.burst
        self._tokens_at = clock()
        self._lock = threading.Lock()
        self._next_sweep = clock() + _FORGET_AFTER

    def _now_usage(self, key: str, now: float) -> float:
        used, at = self._usage.get(key, (0.0, now))
        return float(used * 0.5 ** ((now - at) / HALF_LIFE))

    def _group_tokens(self, now: float) -> float:
        """Under the lock: the group's tokens now."""
        rate = self.group_share or 0.0
        self._tokens = min(self.burst, self._tokens + (now - self._tokens_at) * rate)
        self._tokens_at = now
        return self._tokens

    def check(self, key: str) -> bool:
        """Whether ``key`` is to be admitted as heavy (costly lately, or not known to be
        cheap yet; see the module docstring).  Raises :class:`FilterBusy` when it is heavy
        and over its own limit or the group's, and :class:`FilterShareExceeded` when it
        has been over its own limit for ``end_after`` seconds."""
        now = self._clock()
        with self._lock:
            used = self._now_usage(key, now)
            cost = self._cost.get(key)
            heavy = cost is None or cost > self.heavy_cost
            if not heavy:
                return False
            if cost is not None and used > self.limit:
                since = self._over.setdefault(key, now)
                delay = HALF_LIFE * math.log2(used / self.limit)
                if self.end_after:
                    if now - since >= self.end_after:
                        raise FilterShareExceeded(
                            "the MessageContent filter used more than its share of the filter "
                            f"processes (filters.cpu_share "
                            f"{self.limit * math.log(2) / HALF_LIFE:g}) for {now - since:.0f} s "
                            "(filters.over_share_end)"
                        )
                    delay = min(delay, max(0.01, since + self.end_after - now))  # ask then
                raise FilterBusy(delay)
            if used < self.limit / 2:
                self._over.pop(key, None)
            if self.group_share is not None:
                tokens = self._group_tokens(now)
                if tokens <= 0:
                    raise FilterBusy(max(0.01, -tokens / self.group_share))
        return True

    def charge(self, key: str, seconds: float, messages: int = 1, *, heavy: bool = False) -> None:
        """``key`` held an evaluation process for ``seconds`` for ``messages``; ``heavy``:
        it was admitted as heavy (the group's budget pays too)."""
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
            if heavy and self.group_share is not None:
                # the debt is bounded: a newcomer (admitted as costly until known) waits at
                # most two bursts' worth
                self._tokens = max(-self.burst, self._group_tokens(now) - seconds)
            if now >= self._next_sweep:
                self._next_sweep = now + _FORGET_AFTER
                idle = [k for k, (_, at) in self._usage.items() if now - at > _FORGET_AFTER]
                for k in idle:
                    del self._usage[k]
                    self._cost.pop(k, None)
                    self._over.pop(k, None)

    def cost(self, key: str) -> float:
        """``key``'s recent seconds per message (0 without history)."""
        with self._lock:
            return self._cost.get(key, 0.0)
