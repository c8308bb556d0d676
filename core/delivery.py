"""Push delivery engine: durable subscription -> filters -> consumer, with retries.

Each push subscription (and each subscription that feeds one of the broker's own pull
points) is a :class:`Channel`.  The adapter calls ``Channel.on_message`` on its own thread;
that only appends to the channel's in-memory queue (bounded by the adapter prefetch) and
schedules the channel.  A fixed pool of worker threads (``delivery.workers``) runs scheduled
channels; a channel is run by at most one worker at a time, which keeps per-consumer order.

A run takes up to ``batch_size`` messages from the head of the queue, passes them through
``prepare`` together (decode + residual topic / MessageContent filter, one verdict per
message: a message that does not match is acked at once and never delivered) and hands
the rest to ``send`` as one batch (one wrapped Notify).  ``prepare`` raising
:class:`EndSubscription` (a filter exceeded its evaluation budget) stops the channel and
calls ``on_give_up`` at once, as a give-up does.  Success acks the batch.  An *ordered*
channel (the adapter needs acknowledgements in arrival order: Kafka offsets, MQTT PUBACK
order) acks a filtered message only once every message before it is settled: it stays
with the batch and is acked after it, in order.  ``DeliveryFailed`` keeps the batch (unsettled at
the middleware) as the channel's *pending* batch and arms a timer: exponential backoff
``initial_delay * multiplier**(n-1)`` capped at ``max_delay``; no thread sleeps or spins
meanwhile.  Later messages wait behind the pending batch, so order holds.  After
``max_attempts`` failed attempts the give-up action applies: ``keep`` retries forever at
``max_delay`` (the middleware keeps accumulating within its QueueLimits), ``end`` calls the
channel's ``on_give_up`` with an :class:`EndSubscription` (the service ends the
subscription and publishes SubscriptionEnd).

``stop`` (PauseSubscription) stops the adapter handle; messages held in memory are left
unsettled and are redelivered by the middleware when the channel starts again, so resume
delivers everything accumulated, in order.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from wsnmom.core import metrics
from wsnmom.core.adapter import Received, SubscriptionHandle
from wsnmom.core.ports import DeliveryFailed

log = logging.getLogger(__name__)

T = TypeVar("T")


class EndSubscription(Exception):
    """The subscription cannot go on; ``cause`` says why in one word ("delivery": the
    consumer stayed unreachable, "filter": its filter exceeded its evaluation budget) and
    ``reason`` in a sentence."""

    def __init__(self, reason: str, cause: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.cause = cause


@dataclass(frozen=True, slots=True)
class Backoff:
    """Retry schedule (seconds)."""

    max_attempts: int = 8
    initial_delay: float = 1.0
    multiplier: float = 2.0
    max_delay: float = 300.0
    give_up: str = "end"

    def delay(self, failures: int) -> float:
        """Delay before the next attempt after ``failures`` consecutive failures (>= 1)."""
        if failures >= self.max_attempts:
            return self.max_delay
        return float(min(self.initial_delay * self.multiplier ** (failures - 1), self.max_delay))


def _settle(received: Received, ack: bool) -> None:
    try:
        if ack:
            received.ack()
        else:
            received.nack(requeue=True)
    except Exception:  # the handle may be gone (stopped, deleted); redelivery covers it
        log.debug("settling a message failed", exc_info=True)


class Channel(Generic[T]):
    """Delivery state of one subscription.

    ``_gen`` changes on every start/stop: scheduled runs and timers of an older generation
    are ignored, and a batch sent under an older generation is not retried (the middleware
    redelivers what a stopped handle left unsettled).

    One exists per subscription, so it is kept small: ``__slots__``, and the in-memory
    queue is created on the first message (an empty ``deque`` preallocates a 64-slot
    block, ~760 bytes; most pull-point subscriptions are idle most of the time).
    """

    __slots__ = (
        "_closed",
        "_failures",
        "_gen",
        "_lock",
        "_pending",
        "_queue",
        "_rerun",
        "_running",
        "_scheduled",
        "_stopped",
        "attempts",
        "batch_size",
        "engine",
        "handle",
        "name",
        "on_give_up",
        "ordered",
        "prepare",
        "send",
    )

    def __init__(
        self,
        engine: DeliveryEngine,
        name: str,
        handle: SubscriptionHandle,
        prepare: Callable[[Sequence[Received]], Sequence[T | None]],
        send: Callable[[Sequence[T]], None],
        on_give_up: Callable[[EndSubscription], None],
        batch_size: int,
        ordered: bool = False,
    ) -> None:
        self.engine = engine
        self.name = name
        self.handle = handle
        self.prepare = prepare
        self.send = send
        self.on_give_up = on_give_up
        self.batch_size = batch_size
        #: settle in arrival order (filtered messages wait for the ones before them)
        self.ordered = ordered
        self._lock = threading.Lock()
        #: received, not yet taken by a worker (created on the first message)
        self._queue: deque[Received] | None = None
        #: the batch being sent: (message, item to send, or None for a filtered message
        #: kept only to be settled in order)
        self._pending: list[tuple[Received, T | None]] = []
        self._failures = 0
        self._gen = 0
        self._scheduled = False
        self._running = False
        self._rerun = False
        self._stopped = True
        self._closed = False
        #: timestamps (monotonic) of every send attempt, for tests and diagnostics
        self.attempts: list[float] = []

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        """True while consuming (started and not stopped/closed)."""
        return not self._stopped and not self._closed

    @property
    def failures(self) -> int:
        """Consecutive failed attempts of the pending batch."""
        return self._failures

    def start(self) -> None:
        """Consume from the durable subscription (also after ``stop``)."""
        with self._lock:
            if self._closed or not self._stopped:
                return
            self._stopped = False
            self._failures = 0
            self._gen += 1
            self._scheduled = False
            self._queue = None
            self._pending = []
        self.handle.start(self.on_message, prefetch=self.engine.prefetch)

    def stop(self) -> None:
        """Stop consuming; the durable subscription keeps accumulating.  Messages held in
        memory stay unsettled and are redelivered by the middleware on the next start."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            self._gen += 1
            self._scheduled = False
            self._queue = None
            if not self._running:
                self._pending = []
        self.handle.stop()

    def close(self) -> None:
        """Stop for good (subscription destroyed or broker closing)."""
        with self._lock:
            self._closed = True
        self.stop()

    def held(self) -> int:
        """Messages held in memory (queued plus pending)."""
        return len(self._queue or ()) + len(self._pending)

    # -- adapter callback ------------------------------------------------------------------
    def on_message(self, received: Received) -> None:
        """Adapter thread: enqueue only."""
        schedule = False
        with self._lock:
            stale = self._stopped
            if not stale:
                q = self._queue
                if q is None:
                    q = self._queue = deque()
                q.append(received)
                if not self._scheduled:
                    self._scheduled = schedule = True
                gen = self._gen
        if stale:
            _settle(received, ack=False)
        elif schedule:
            self.engine._ready(self, gen)

    # -- worker ----------------------------------------------------------------------------
    def _run(self, gen: int) -> None:
        with self._lock:
            if gen != self._gen or self._stopped:
                return
            if self._running:
                self._rerun = True
                return
            self._running = True
            take: list[Received] = []
            q = self._queue
            if not self._pending and q:
                n = min(self.batch_size, len(q))
                take = [q.popleft() for _ in range(n)]
                if not q:
                    self._queue = None  # drained: give the block back until the next one
            pending = self._pending
        ok = True
        reason = ""
        try:
            try:
                items = self._prepare(take)
            except EndSubscription as end:
                self._end(gen, take, end)
                return
            for received, item in zip(take, items, strict=True):
                if item is None:
                    metrics.NOTIFICATIONS_FILTERED.inc()
                    if self.ordered and any(i is not None for _, i in pending):
                        pending.append((received, None))  # acked after those before it
                    else:
                        _settle(received, ack=True)
                else:
                    pending.append((received, item))
            batch = [item for _, item in pending if item is not None]
            if batch:
                self.attempts.append(time.monotonic())
                try:
                    self.send(batch)
                except DeliveryFailed as exc:
                    ok = False
                    reason = exc.reason
                except Exception as exc:  # a bug or an unexpected client error: retry too
                    log.exception("subscription %s: delivery raised", self.name)
                    ok = False
                    reason = f"{type(exc).__name__}: {exc}"
        finally:
            with self._lock:
                self._running = False
        self._after_send(gen, pending, ok, reason)

    def _prepare(self, take: list[Received]) -> Sequence[T | None]:
        """``prepare`` over ``take``; when it fails, message by message, so that only a
        message that cannot be prepared is dropped."""
        if not take:
            return []
        try:
            return self.prepare(take)
        except EndSubscription:
            raise
        except Exception:
            log.exception("subscription %s: cannot prepare a batch; one by one", self.name)
        items: list[T | None] = []
        for received in take:
            try:
                items.extend(self.prepare([received]))
            except EndSubscription:
                raise
            except Exception:
                log.exception("subscription %s: cannot prepare a message; dropped", self.name)
                items.append(None)
        return items

    def _end(self, gen: int, take: list[Received], end: EndSubscription) -> None:
        """``prepare`` said the subscription cannot go on: stop and hand over."""
        with self._lock:
            self._running = False
            current = gen == self._gen and not self._stopped
            if current:
                self._stopped = True
                self._gen += 1
                self._queue = None
                self._pending = []
        if not current:
            for received in take:
                _settle(received, ack=False)
            return
        # like a give-up: what is held stays unsettled; the subscription is being ended
        log.warning("subscription %s: %s", self.name, end.reason)
        try:
            self.handle.stop()
        except Exception:
            log.debug("stopping the handle failed", exc_info=True)
        self.engine._spawn(lambda: self.on_give_up(end))

    def _after_send(
        self, gen: int, pending: list[tuple[Received, T | None]], ok: bool, reason: str
    ) -> None:
        give_up = False
        delay: float | None = None
        reschedule = False
        with self._lock:
            current = gen == self._gen and not self._stopped
            if ok:
                self._pending = [] if current else self._pending
                self._failures = 0
            elif pending:
                metrics.DELIVERY_FAILURES.inc()
                if current:
                    self._failures += 1
                    policy = self.engine.backoff
                    if self._failures >= policy.max_attempts and policy.give_up == "end":
                        give_up = True
                        self._stopped = True
                        self._gen += 1
                        self._queue = None
                        self._pending = []
                    else:
                        delay = policy.delay(self._failures)
            if not current and not self._running and self._pending is pending:
                # stopped (or restarted) meanwhile: the handle redelivers what is unsettled
                self._pending = []
            if current and delay is None and not give_up:
                if self._queue or self._rerun:
                    reschedule = True
                else:
                    self._scheduled = False
            elif not current and not self._stopped and (self._queue or self._rerun):
                reschedule = True
            self._rerun = False
            new_gen = self._gen
            failures = self._failures
        if ok:
            for received, _ in pending:
                _settle(received, ack=True)
        if give_up:
            log.warning(
                "subscription %s: giving up after %d failed attempts: %s",
                self.name,
                failures,
                reason,
            )
            try:
                self.handle.stop()
            except Exception:
                log.debug("stopping the handle failed", exc_info=True)
            end = EndSubscription(reason, "delivery")
            self.engine._spawn(lambda: self.on_give_up(end))
        elif delay is not None:
            log.info(
                "subscription %s: delivery failed (%s); retry %d in %.3fs",
                self.name,
                reason,
                failures,
                delay,
            )
            self.engine._later(delay, self, new_gen)
        elif reschedule:
            self.engine._ready(self, new_gen)


class DeliveryEngine:
    """Worker pool and retry timers shared by all channels."""

    def __init__(
        self, *, workers: int = 8, backoff: Backoff | None = None, prefetch: int = 64
    ) -> None:
        self.backoff = backoff or Backoff()
        self.prefetch = prefetch
        self._ready_q: queue.SimpleQueue[tuple[Channel[Any], int] | None] = queue.SimpleQueue()
        self._timers: list[tuple[float, int, Channel[Any], int]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._channels: dict[str, Channel[Any]] = {}
        self._channels_lock = threading.Lock()
        self._workers = [
            threading.Thread(target=self._work, name=f"wsnmom-delivery-{i}", daemon=True)
            for i in range(workers)
        ]
        for t in self._workers:
            t.start()
        self._timer_thread = threading.Thread(
            target=self._timer_loop, name="wsnmom-delivery-timer", daemon=True
        )
        self._timer_thread.start()
        metrics.set_queued_source(self.held)

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
    ) -> Channel[T]:
        """Create (not start) the channel ``name``, replacing a closed one."""
        channel: Channel[T] = Channel(
            self, name, handle, prepare, send, on_give_up, batch_size, ordered
        )
        with self._channels_lock:
            old = self._channels.get(name)
            self._channels[name] = channel
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

    def held(self) -> float:
        """Messages held in memory over all channels."""
        with self._channels_lock:
            channels = list(self._channels.values())
        return float(sum(c.held() for c in channels))

    # -- scheduling ------------------------------------------------------------------------
    def _ready(self, channel: Channel[Any], gen: int) -> None:
        self._ready_q.put((channel, gen))

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

    def _work(self) -> None:
        while True:
            item = self._ready_q.get()
            if item is None:
                return
            channel, gen = item
            try:
                channel._run(gen)
            except Exception:
                log.exception("delivery worker error on %s", channel.name)

    def _timer_loop(self) -> None:
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                while self._timers and self._timers[0][0] <= now:
                    _, _, channel, gen = heapq.heappop(self._timers)
                    self._ready_q.put((channel, gen))
                timeout = self._timers[0][0] - now if self._timers else None
                self._cond.wait(timeout)

    def close(self) -> None:
        """Close every channel and stop the threads."""
        with self._channels_lock:
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
        for _ in self._workers:
            self._ready_q.put(None)
        for t in self._workers:
            t.join(timeout=5)
        self._timer_thread.join(timeout=5)
