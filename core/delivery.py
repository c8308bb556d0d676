"""Push delivery engine: durable subscription -> filters -> consumer, with retries, and
no consumer able to delay another.

Each push subscription (and each subscription that feeds one of the broker's own pull
points) is a :class:`~wsnmom.core.channel.Channel` (what a run does, retries, give-up:
see ``core.channel``), or, for a subscription that chose unordered delivery, a
:class:`~wsnmom.core.unordered.UnorderedChannel` (several deliveries at once, each retried
on its own).  The engine runs ready channels on its threads and keeps the retry timers.

Threads.  ``workers`` threads always exist.  A delivery that waits on a slow consumer holds
its thread, so when every thread has been busy for longer than ``slow_after`` seconds and
channels are waiting, the engine starts more threads (as many as are waiting), up to
``max_workers``; a thread beyond ``workers`` ends after ``idle_exit`` seconds without work.
Normal deliveries take milliseconds and never start one.

Destinations.  A push channel belongs to the lane of its consumer's scheme, host and port
(``core.lanes``): at most ``per_destination`` of a destination's channels run at once (the
others wait in the lane, holding no thread), and a destination that stops answering has
its circuit opened, so its subscriptions stop taking threads until it answers a probe.
Together: a destination holds at most ``per_destination`` threads, and while threads are
held elsewhere the others still find one.  The same holds for all the ports of one host
(``per_host``) and all the subscriptions of one owner (``per_owner``).

Memory.  The messages channels hold are charged, in bytes, to the engine's ``budget``
(``core.delivery_budget``): gateway-wide and per owner; what does not fit stays in the
middleware.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from wsnmom.core import metrics, takeover_timing
from wsnmom.core.adapter import Received, SubscriptionHandle
from wsnmom.core.backoff import Backoff
from wsnmom.core.channel import Channel
from wsnmom.core.channel_signals import EndSubscription
from wsnmom.core.channel_status import ChannelStatus
from wsnmom.core.delivery_budget import MemoryBudget
from wsnmom.core.lanes import BreakerSettings, Lane, Lanes, LaneState, Outcome
from wsnmom.core.unordered import UnorderedChannel

__all__ = ["Backoff", "Channel", "ChannelStatus", "DeliveryEngine", "EndSubscription"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_Item = tuple[Channel[Any], int]
#: seconds between sweeps of idle lanes
_LANE_SWEEP = 60.0


class DeliveryEngine:
    """Threads, lanes and retry timers shared by all channels (see the module docstring)."""

    def __init__(
        self,
        *,
        workers: int = 8,
        backoff: Backoff | None = None,
        prefetch: int = 64,
        max_workers: int | None = None,
        per_destination: int | None = None,
        slow_after: float = 0.2,
        breaker: BreakerSettings | None = None,
        idle_exit: float = 300.0,
        per_host: int | None = None,
        per_owner: int | None = None,
        budget: MemoryBudget | None = None,
    ) -> None:
        self.backoff = backoff or Backoff()
        self.prefetch = prefetch
        self.workers = max(1, workers)
        self.max_workers = max(self.workers, max_workers or self.workers * 32)
        self.slow_after = slow_after
        self.idle_exit = idle_exit
        self.lanes = Lanes(
            per_destination if per_destination else max(1, self.workers // 2),
            breaker,
            per_host=per_host,
            per_owner=per_owner,
        )
        #: bytes held by channels (unbounded unless given)
        self.budget = budget or MemoryBudget()
        self._ready_q: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._timers: list[tuple[float, int, Channel[Any], int]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        #: ``close`` began: a channel opened from now on is closed at once (never starts)
        self._closing = False
        self._channels: dict[str, Channel[Any]] = {}
        self._channels_lock = threading.Lock()
        #: thread ident -> monotonic time its current run started (absent: waiting)
        self._busy: dict[int, float] = {}
        self._threads: list[threading.Thread] = []
        self._threads_lock = threading.Lock()
        #: set while every thread is busy and work waits: the timer thread checks for
        #: threads stuck longer than ``slow_after``
        self._watch = False
        self._next_lane_sweep = time.monotonic() + _LANE_SWEEP
        for _ in range(self.workers):
            self._start_thread(extra=False)
        self._timer_thread = threading.Thread(
            target=self._timer_loop, name="wsnmom-delivery-timer", daemon=True
        )
        self._timer_thread.start()
        metrics.set_queued_source(self.held)
        metrics.set_memory_sources(self.held_bytes, lambda: float(self.budget.parked()))
        metrics.set_delivery_sources(self._breakers, lambda: float(len(self._threads)))

    # -- channels --------------------------------------------------------------------------
    def open_channel(
        self,
        name: str,
        handle: SubscriptionHandle,
        prepare: Callable[[Sequence[Received]], Sequence[T | None]],
        send: Callable[[Sequence[T]], None],
        on_give_up: Callable[[EndSubscription], None],
        *,
        batch_size: int = 10,
        ordered: bool = False,
        destination: str | None = None,
        trace: Callable[[T], str | None] | None = None,
        group: str = "",
        bounded: bool = True,
        in_flight: int | None = None,
    ) -> Channel[T]:
        """Create (not start) the channel ``name``, replacing a closed one; ``destination``
        is its lane (``core.lanes.destination_key`` of the consumer), None for none;
        ``trace`` gives the request id a prepared item was published by (for log
        records); ``group`` is the owner its threads and memory count against;
        ``bounded`` False: its messages are counted but never refused; ``in_flight``:
        unordered delivery with at most that many deliveries at once
        (``core.unordered``), None: in order, one batch at a time."""
        args = (
            self,
            name,
            handle,
            prepare,
            send,
            on_give_up,
            batch_size,
            ordered,
            destination,
            trace,
            group,
            bounded,
        )
        channel: Channel[T] = (
            Channel(*args) if in_flight is None else UnorderedChannel(*args, in_flight=in_flight)
        )
        with self._channels_lock:
            closing = self._closing
            old = None if closing else self._channels.get(name)
            if not closing:
                self._channels[name] = channel
        channel.timing = timing = takeover_timing.current()
        if timing is not None:
            timing.mark("channel")
        if closing:
            # the engine is closing (a SIGTERM while a gained shard's deliveries open):
            # the channel never consumes, so nothing delivers after the hand-back
            channel.close()
        if old is not None:
            old.close()
        return channel

    def channel(self, name: str) -> Channel[Any] | None:
        """The channel ``name``, if open."""
        with self._channels_lock:
            return self._channels.get(name)

    def close_channel(self, name: str) -> None:
        """Close and forget the channel ``name`` (no-op when unknown)."""
        with self._channels_lock:
            channel = self._channels.pop(name, None)
        if channel is not None:
            channel.close()

    def held_bytes(self) -> float:
        """Bytes held in memory over all channels (as charged to the budget)."""
        return float(self.budget.used)

    def held(self) -> float:
        """Messages held in memory over all channels."""
        with self._channels_lock:
            channels = list(self._channels.values())
        return float(sum(c.held() for c in channels))

    def thread_count(self) -> int:
        """Threads running now (``workers`` and those started for slow deliveries)."""
        return len(self._threads)

    # -- lanes (Scheduler protocol of core.channel) ----------------------------------------
    def admit(self, lane: Lane) -> float | None:
        """None when a channel may send to ``lane`` now, else seconds to wait."""
        return self.lanes.admit(lane)

    def report(self, lane: Lane, outcome: Outcome) -> None:
        """How a send to ``lane`` ended (its circuit breaker counts timeouts)."""
        before = lane.state
        self.lanes.report(lane, outcome)
        after = lane.state
        if after is not before:
            if after is LaneState.OPEN:
                log.warning(
                    "%s: no answer in time %d times in a row; deliveries to it wait %.1fs",
                    lane.key,
                    lane.failures,
                    lane.interval,
                )
            elif after is LaneState.CLOSED:
                log.info("%s answers again: deliveries to it resume", lane.key)

    def _breakers(self, state: str) -> float:
        return float(self.lanes.states()[LaneState(state)])

    # -- scheduling ------------------------------------------------------------------------
    def _ready(self, channel: Channel[Any], gen: int) -> None:
        self._ready_q.put((channel, gen))
        self._check_busy()

    def _check_busy(self) -> None:
        """Every thread busy and work waiting: have the timer thread watch for threads
        stuck on slow consumers."""
        if not self._watch and len(self._busy) >= len(self._threads) and not self._ready_q.empty():
            with self._cond:
                self._watch = True
                self._cond.notify()

    def _later(self, delay: float, channel: Channel[Any], gen: int) -> None:
        with self._cond:
            due = time.monotonic() + delay
            heapq.heappush(self._timers, (due, next(self._seq), channel, gen))
            self._cond.notify()

    def _spawn(self, fn: Callable[[], None]) -> None:
        def run() -> None:
            try:
                fn()
            except Exception:
                log.exception("give-up action failed")

        threading.Thread(target=run, name="wsnmom-give-up", daemon=True).start()

    # -- threads ---------------------------------------------------------------------------
    def _start_thread(self, *, extra: bool) -> None:
        with self._threads_lock:
            n = len(self._threads)
            if self._closed or (extra and n >= self.max_workers):
                return
            thread = threading.Thread(
                target=self._work, args=(extra,), name=f"wsnmom-delivery-{n}", daemon=True
            )
            self._threads.append(thread)
        thread.start()

    def _retire(self, thread: threading.Thread) -> bool:
        """Whether an extra thread may end now (it was idle for ``idle_exit``)."""
        with self._threads_lock:
            if len(self._threads) <= self.workers or thread not in self._threads:
                return False
            self._threads.remove(thread)
            return True

    def _work(self, extra: bool) -> None:
        me = threading.current_thread()
        ident = threading.get_ident()
        while True:
            try:
                item = self._ready_q.get(timeout=self.idle_exit if extra else None)
            except queue.Empty:
                if self._retire(me):
                    return
                continue
            if item is None:
                return
            channel, gen = item
            timing = channel.timing
            if timing is not None:
                timing.mark("lane")
            lane: Lane | None = None
            if channel.destination is not None:
                # a taken-over subscription's first delivery waits ahead (``core.lanes``)
                first = timing is not None
                lane = self.lanes.enter(channel.destination, item, channel.group, first=first)
                if lane is None:
                    continue  # the destination is busy: the item waits in its lane
            self._busy[ident] = time.monotonic()
            self._check_busy()
            try:
                channel._run(gen, lane)
            except Exception:
                log.exception("delivery worker error on %s", channel.name)
            finally:
                del self._busy[ident]
                if lane is not None:
                    for waiting in self.lanes.leave(lane, channel.group):
                        self._ready_q.put(waiting)

    def _stuck(self, now: float) -> float | None:
        """With work waiting and every thread busy: 0 when they have all been busy for
        ``slow_after`` (start more), else the seconds until they will have; None when
        some thread is free or nothing waits."""
        busy = list(self._busy.values())
        if len(busy) < len(self._threads) or self._ready_q.empty():
            return None
        longest_to_go = max(self.slow_after - (now - started) for started in busy)
        return max(longest_to_go, 0.0)

    def _grow(self) -> None:
        waiting = self._ready_q.qsize()
        room = self.max_workers - len(self._threads)
        for _ in range(min(waiting, room)):
            self._start_thread(extra=True)

    def _timer_loop(self) -> None:
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                while self._timers and self._timers[0][0] <= now:
                    _, _, channel, gen = heapq.heappop(self._timers)
                    self._ready_q.put((channel, gen))
                if now >= self._next_lane_sweep:
                    self.lanes.sweep()
                    self._next_lane_sweep = now + _LANE_SWEEP
                timeout = min(
                    self._timers[0][0] - now if self._timers else _LANE_SWEEP,
                    self._next_lane_sweep - now,
                )
                if self._watch:
                    wait = self._stuck(now)
                    if wait is None:
                        self._watch = False
                    else:
                        if wait == 0.0:
                            self._grow()
                            wait = self.slow_after
                        timeout = min(timeout, wait)
                self._cond.wait(max(timeout, 0.0))

    def close(self) -> None:
        """Close every channel (and any opened meanwhile) and stop the threads."""
        with self._channels_lock:
            self._closing = True
            channels = list(self._channels.values())
            self._channels.clear()
        for channel in channels:
            try:
                channel.close()
            except Exception:
                log.debug("closing channel %s failed", channel.name, exc_info=True)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        with self._threads_lock:
            threads = list(self._threads)
        for _ in threads:
            self._ready_q.put(None)
        for t in threads:
            t.join(timeout=5)
        self._timer_thread.join(timeout=5)
        self.budget.close()
