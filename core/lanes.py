"""Delivery lanes: one per destination (scheme, host, port) that push deliveries go to.

A lane does two things so that a consumer that never answers cannot delay deliveries to
any other consumer:

* **Concurrency.**  At most ``per_destination`` deliveries to one destination run at once;
  further ready subscriptions of that destination wait in the lane (holding no thread) and
  are released one by one as its deliveries finish.  So one destination holds at most that
  share of the delivery threads, whatever its number of subscriptions.
* **Circuit breaker.**  ``failures`` consecutive deliveries that got no answer within the
  timeout (``DeliveryFailed.timed_out``: each held a thread all that time) *open* the lane
  for ``open_for`` seconds.  A fast failure (connection refused or reset) holds nothing and
  neither counts nor resets the count.  While open, the lane's deliveries are refused at
  once, without network traffic and without a thread waiting: each refusal is a failed
  attempt of that subscription under its retry policy (backoff, give-up and
  SubscriptionEnd unchanged).  When the interval has passed one delivery goes through as a
  probe (*half-open*): an answer closes the lane, no answer (a timeout or a fast failure)
  opens it again for twice as long, up to ``max_open``.  Any answer, even an error status,
  closes it: the consumer is alive.

Deliveries into the broker's own pull points have no lane.  Lanes are created on first use
and forgotten when idle and closed (``sweep``).
"""

from __future__ import annotations

import enum
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from wsnmom.core.outbound_policy import normalise_host

__all__ = ["BreakerSettings", "Lane", "LaneState", "Lanes", "Outcome", "destination_key"]

_DEFAULT_PORTS = {"http": 80, "https": 443}


def destination_key(address: str) -> str | None:
    """``scheme://host:port`` of a consumer address (numeric hosts in canonical form), or
    None when it has none (the outbound policy refuses such an address anyway)."""
    try:
        parts = urlsplit(address.strip())
        port = parts.port
        host, ip = normalise_host(parts.hostname or "")
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    port = port or _DEFAULT_PORTS.get(scheme, 0)
    shown = f"[{host}]" if ip is not None and ip.version == 6 else host
    return f"{scheme}://{shown}:{port}"


class Outcome(enum.Enum):
    """How a delivery attempt to a lane ended, as its circuit breaker sees it."""

    #: the destination answered (success, or an error status or fault)
    ANSWERED = "answered"
    #: no answer within the timeout: the attempt held its thread all that time
    TIMED_OUT = "timed_out"
    #: failed at once without an answer (connection refused or reset, refused by policy)
    FAILED_FAST = "failed_fast"


class LaneState(enum.Enum):
    """Circuit breaker state of a lane."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True, slots=True)
class BreakerSettings:
    """When a lane opens and for how long."""

    #: consecutive timed-out deliveries that open the lane
    failures: int = 3
    #: seconds the lane stays open the first time
    open_for: float = 5.0
    #: the longest it stays open (the interval doubles after each failed probe)
    max_open: float = 300.0


@dataclass(slots=True)
class Lane:
    """The state of one destination (guarded by the ``Lanes`` lock)."""

    key: str
    #: deliveries running now
    active: int = 0
    #: ready subscriptions waiting for room: (channel, generation)
    waiting: deque[tuple[Any, int]] = field(default_factory=deque)
    state: LaneState = LaneState.CLOSED
    #: consecutive timed-out deliveries
    failures: int = 0
    #: monotonic time until which the lane is open
    open_until: float = 0.0
    #: the current open interval
    interval: float = 0.0
    #: a half-open probe is under way
    probing: bool = False


class Lanes:
    """Every destination's lane; thread-safe."""

    def __init__(
        self,
        per_destination: int,
        breaker: BreakerSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_destination = max(1, per_destination)
        self.breaker = breaker or BreakerSettings()
        self._clock = clock
        self._lanes: dict[str, Lane] = {}
        self._lock = threading.Lock()

    # -- concurrency -----------------------------------------------------------------------
    def enter(self, key: str, item: tuple[Any, int]) -> Lane | None:
        """Take a place in the lane of ``key`` (created on first use) for ``item``: the
        lane, or None when it is full (``item`` then waits in it until :meth:`leave`
        releases it)."""
        with self._lock:
            lane = self._lanes.get(key)
            if lane is None:
                lane = self._lanes[key] = Lane(key)
            if lane.active < self.per_destination:
                lane.active += 1
                return lane
            lane.waiting.append(item)
            return None

    def leave(self, lane: Lane) -> tuple[Any, int] | None:
        """Give the place back; the lane's longest-waiting item, if any, to be made ready
        again (it takes a place with :meth:`enter` like any other)."""
        with self._lock:
            lane.active -= 1
            return lane.waiting.popleft() if lane.waiting else None

    def get(self, key: str) -> Lane | None:
        """The lane of ``key`` if it exists (it does while a delivery holds a place)."""
        return self._lanes.get(key)

    # -- circuit breaker -------------------------------------------------------------------
    def admit(self, lane: Lane) -> float | None:
        """None when a delivery may go to ``lane`` now (it may be the half-open probe);
        else the seconds until the lane may be tried again."""
        if lane.state is LaneState.CLOSED:  # the common case, without the lock
            return None
        return self._admit(lane)

    def _admit(self, lane: Lane) -> float | None:
        now = self._clock()
        with self._lock:
            if lane.state is LaneState.CLOSED:
                return None
            if lane.state is LaneState.OPEN and now >= lane.open_until:
                lane.state = LaneState.HALF_OPEN
                lane.probing = True
                return None
            if lane.state is LaneState.HALF_OPEN:
                if lane.probing:
                    return lane.interval
                lane.probing = True
                return None
            return lane.open_until - now

    def report(self, lane: Lane, outcome: Outcome) -> None:
        """The outcome of a delivery attempt to ``lane``."""
        if outcome is Outcome.ANSWERED:
            if lane.state is LaneState.CLOSED and not lane.failures:
                return
            with self._lock:
                lane.state = LaneState.CLOSED
                lane.failures = 0
                lane.interval = 0.0
                lane.probing = False
            return
        if outcome is Outcome.FAILED_FAST and lane.state is LaneState.CLOSED:
            return
        b = self.breaker
        with self._lock:
            if outcome is Outcome.TIMED_OUT:
                lane.failures += 1
            if lane.state is LaneState.HALF_OPEN:
                lane.interval = min(max(lane.interval, b.open_for) * 2, b.max_open)
            elif lane.state is LaneState.CLOSED and lane.failures >= b.failures:
                lane.interval = min(b.open_for, b.max_open)
            else:
                return
            lane.state = LaneState.OPEN
            lane.probing = False
            lane.open_until = self._clock() + lane.interval

    # -- bookkeeping -----------------------------------------------------------------------
    def states(self) -> dict[LaneState, int]:
        """How many lanes are in each breaker state."""
        counts = dict.fromkeys(LaneState, 0)
        with self._lock:
            for lane in self._lanes.values():
                counts[lane.state] += 1
        return counts

    def sweep(self) -> None:
        """Forget closed lanes with nothing running or waiting."""
        with self._lock:
            idle = [
                k
                for k, lane in self._lanes.items()
                if lane.state is LaneState.CLOSED
                and not lane.active
                and not lane.waiting
                and not lane.failures
            ]
            for k in idle:
                del self._lanes[k]
