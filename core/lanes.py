"""Delivery lanes: one per destination (scheme, host, port) that push deliveries go to,
one per host, and one per owner (the identity that owns the subscriptions).

A lane does two things so that a consumer that never answers cannot delay deliveries to
any other consumer:

* **Concurrency.**  At most ``per_destination`` deliveries to one destination run at once,
  at most ``per_host`` to all the ports of one host and at most ``per_owner`` for one
  owner's subscriptions (anonymous ones have no owner lane: nothing tells their clients
  apart); a ready subscription that finds one of the three full waits in it
  (holding no thread) and is released as that lane's deliveries finish.  So one
  destination, one host (however many ports it opens) and one identity (however many
  hosts it names) each hold at most that share of the delivery threads.
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

* **Host breaker.**  A host with ``failures`` destinations whose circuits are open at once,
  or ``failures`` different destinations that timed out with no answer from any of its
  ports since, has its own circuit opened, with the same intervals and probe: many ports
  of one host (each a destination with its own breaker, each timing out once) cannot keep
  holding the host's share of the threads.  Counting open destinations alone, 100 ports
  each had to time out three times (300 timeouts of 10 s) before the host opened.  One
  dead port among live ones is left to its own breaker (its timeouts count once).  An
  answer from any of its ports closes it.

A subscription's first delivery after this instance took it over from a dead one waits
at the head of a full lane (``first``), ahead of subscriptions served a moment ago: in a
failover at 2,000 subscriptions on Kafka, the taken-over ones waited in the host's lane
behind the survivors' own deliveries of the next message (docs/scale-out.md, "Failover
at scale").

Deliveries into the broker's own pull points have no lane.  Lanes are created on first use
and forgotten when idle and closed (``sweep``).
"""

from __future__ import annotations

import enum
import functools
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
        return _host_key(parts.scheme.lower(), parts.hostname or "", parts.port)
    except ValueError:
        return None


@functools.lru_cache(maxsize=4096)
def _host_key(scheme: str, hostname: str, port: int | None) -> str:
    """The key of one scheme, host and port; cached because many subscriptions share a
    few consumer hosts (a start restoring 10,000 spent a quarter of its time normalising
    the same host: docs/performance/findings.md, F30)."""
    host, ip = normalise_host(hostname)
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
    #: a destination's host lane (None for host and owner lanes)
    host: Lane | None = None
    #: a host lane: its destinations whose circuits are open now
    open_destinations: int = 0
    #: a host lane: its destinations that timed out since it last answered (at most
    #: ``failures`` of them are remembered)
    timed_out: set[str] = field(default_factory=set)


class Lanes:
    """Every destination's lane; thread-safe."""

    def __init__(
        self,
        per_destination: int,
        breaker: BreakerSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        per_host: int | None = None,
        per_owner: int | None = None,
    ) -> None:
        self.per_destination = max(1, per_destination)
        #: by default one and a half destinations' share: a host's other ports still get
        #: through while one of its destinations is full
        self.per_host = (
            max(1, per_host) if per_host else self.per_destination + (self.per_destination + 1) // 2
        )
        #: None: owners are not limited
        self.per_owner = max(1, per_owner) if per_owner else None
        self.breaker = breaker or BreakerSettings()
        self._clock = clock
        self._lanes: dict[str, Lane] = {}
        self._hosts: dict[str, Lane] = {}
        self._owners: dict[str, Lane] = {}
        self._lock = threading.Lock()

    # -- concurrency -----------------------------------------------------------------------
    def enter(
        self, key: str, item: tuple[Any, int], owner: str = "", *, first: bool = False
    ) -> Lane | None:
        """Take a place in the lane of ``key`` (created on first use), in its host's and
        in ``owner``'s for ``item``: the destination's lane, or None when one of the three
        is full (``item`` then waits in that one until :meth:`leave` releases it).
        ``first``: ``item`` waits at the head of that lane, not at its tail (the first
        delivery of a subscription this instance just took over: it has waited since its
        deliverer died, a lease and more, while the others waiting were served a moment
        ago)."""
        with self._lock:
            lane = self._lanes.get(key)
            if lane is None:
                host_key = _host_of(key)
                host = self._hosts.get(host_key)
                if host is None:
                    host = self._hosts[host_key] = Lane(host_key)
                lane = self._lanes[key] = Lane(key, host=host)
            host = lane.host
            assert host is not None
            group = self._owner(owner)
            for place, limit in (
                (lane, self.per_destination),
                (host, self.per_host),
                (group, self.per_owner),
            ):
                if place is not None and limit is not None and place.active >= limit:
                    if first:
                        place.waiting.appendleft(item)
                    else:
                        place.waiting.append(item)
                    return None
            lane.active += 1
            host.active += 1
            if group is not None:
                group.active += 1
            return lane

    def _owner(self, owner: str) -> Lane | None:
        if self.per_owner is None or not owner:
            return None  # anonymous subscriptions: no identity to hold to a share
        group = self._owners.get(owner)
        if group is None:
            group = self._owners[owner] = Lane(owner)
        return group

    def leave(self, lane: Lane, owner: str = "") -> list[tuple[Any, int]]:
        """Give the places back; the longest-waiting item of each of the three lanes, to
        be made ready again (each takes its places with :meth:`enter` like any other)."""
        with self._lock:
            ready: list[tuple[Any, int]] = []
            for place in (lane, lane.host, self._owners.get(owner)):
                if place is None:
                    continue
                place.active -= 1
                if place.waiting:
                    ready.append(place.waiting.popleft())
            return ready

    def get(self, key: str) -> Lane | None:
        """The lane of ``key`` if it exists (it does while a delivery holds a place)."""
        return self._lanes.get(key)

    def host(self, key: str) -> Lane | None:
        """The host lane of the destination ``key``, if it exists."""
        return self._hosts.get(_host_of(key))

    # -- circuit breaker -------------------------------------------------------------------
    def admit(self, lane: Lane) -> float | None:
        """None when a delivery may go to ``lane`` now (it may be the half-open probe of
        the lane or of its host); else the seconds until it may be tried again."""
        host = lane.host
        if host is not None and host.state is not LaneState.CLOSED:
            wait = self._admit(host)
            if wait is not None:
                return wait
            wait = None if lane.state is LaneState.CLOSED else self._admit(lane)
            if wait is not None:  # not this one: another destination may probe the host
                with self._lock:
                    host.probing = False
            return wait
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
        """The outcome of a delivery attempt to ``lane`` (and to its host)."""
        host = lane.host
        before = lane.state
        self._report(lane, outcome)
        if host is None:
            return
        changed = (before is LaneState.CLOSED) is not (lane.state is LaneState.CLOSED)
        counted = outcome is Outcome.TIMED_OUT or (
            outcome is Outcome.ANSWERED and bool(host.timed_out)
        )
        if not changed and not counted and host.state is LaneState.CLOSED:
            return
        after = lane.state
        b = self.breaker
        with self._lock:
            if before is LaneState.CLOSED and after is not LaneState.CLOSED:
                host.open_destinations += 1
            elif before is not LaneState.CLOSED and after is LaneState.CLOSED:
                host.open_destinations = max(0, host.open_destinations - 1)
            if outcome is Outcome.ANSWERED:
                host.state = LaneState.CLOSED
                host.timed_out.clear()
                host.interval = 0.0
                host.probing = False
                return
            if outcome is Outcome.TIMED_OUT and len(host.timed_out) < b.failures:
                host.timed_out.add(lane.key)
            if host.state is LaneState.HALF_OPEN:
                host.interval = min(max(host.interval, b.open_for) * 2, b.max_open)
            elif host.state is LaneState.CLOSED and (
                host.open_destinations >= b.failures or len(host.timed_out) >= b.failures
            ):
                host.interval = min(b.open_for, b.max_open)
            else:
                return
            host.state = LaneState.OPEN
            host.probing = False
            host.open_until = self._clock() + host.interval

    def _report(self, lane: Lane, outcome: Outcome) -> None:
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
        """How many destination lanes are in each breaker state."""
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
            used = {lane.host.key for lane in self._lanes.values() if lane.host is not None}
            for k in [k for k, h in self._hosts.items() if k not in used and not h.waiting]:
                del self._hosts[k]
            for k in [k for k, g in self._owners.items() if not g.active and not g.waiting]:
                del self._owners[k]


def _host_of(key: str) -> str:
    """The host of a destination key (``scheme://host:port``), whatever the scheme."""
    rest = key.partition("://")[2]
    return rest.rpartition(":")[0] or rest
