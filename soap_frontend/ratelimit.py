"""Request-rate quotas: a token bucket per identity (per client address for anonymous
callers) and one for all clients (``quotas.rate``, ``quotas.burst``, ``quotas.total_rate``,
an identity's own ``rate``).

A request over its rate is answered HTTP 429 with ``Retry-After`` (seconds until a token
is back) and a ResourceUnavailableFault naming the quota.  Buckets of clients that went
quiet are dropped, so the table stays bounded by the clients of the last minute or so.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

from wsnmom.core.access import Principal

__all__ = ["RateLimiter"]

_IDLE_SECONDS = 60.0
_PRUNE_EVERY = 4096


class _Bucket:
    __slots__ = ("level", "stamp")

    def __init__(self, level: float, stamp: float) -> None:
        self.level = level
        self.stamp = stamp


class RateLimiter:
    """Token buckets (see the module docstring); ``enabled`` is False when no rate is set
    anywhere, and the frontend then never calls it."""

    def __init__(
        self, quotas: Any, identity_rates: bool, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate: float | None = getattr(quotas, "rate", None)
        self.burst: int | None = getattr(quotas, "burst", None)
        self.total_rate: float | None = getattr(quotas, "total_rate", None)
        self.enabled = bool(self.rate or self.total_rate or identity_rates)
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._total = _Bucket(self._capacity(self.total_rate), clock())
        self._lock = threading.Lock()
        self._calls = 0

    def _capacity(self, rate: float | None) -> float:
        if rate is None:
            return 0.0
        return float(self.burst) if self.burst else max(1.0, 2.0 * rate)

    def check(self, principal: Principal, address: str | None) -> tuple[str, float] | None:
        """None when the request may go on, else (the quota setting it breaks, seconds
        until it may be retried)."""
        rate = principal.quotas.rate if principal.quotas.rate is not None else self.rate
        key = principal.name if principal.name is not None else f"address:{address}"
        now = self._clock()
        with self._lock:
            self._calls += 1
            if self._calls % _PRUNE_EVERY == 0:
                self._prune(now)
            if self.total_rate is not None:
                wait = self._take(self._total, self.total_rate, now)
                if wait:
                    return "total_rate", wait
            if rate is None:
                return None
            bucket = self._buckets.get(key)
            if bucket is None:
                bucket = self._buckets[key] = _Bucket(self._capacity(rate), now)
            wait = self._take(bucket, rate, now)
            if wait:
                if self.total_rate is not None:
                    self._total.level += 1.0  # not spent after all
                return "rate", wait
        return None

    def _take(self, bucket: _Bucket, rate: float, now: float) -> float:
        capacity = self._capacity(rate)
        bucket.level = min(capacity, bucket.level + (now - bucket.stamp) * rate)
        bucket.stamp = now
        if bucket.level >= 1.0:
            bucket.level -= 1.0
            return 0.0
        return max(1.0, math.ceil((1.0 - bucket.level) / rate))

    def _prune(self, now: float) -> None:
        idle = [k for k, b in self._buckets.items() if now - b.stamp > _IDLE_SECONDS]
        for key in idle:
            del self._buckets[key]
