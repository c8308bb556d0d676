"""A subscription's delivery state: :class:`Channel`, the retry schedule :class:`Backoff`,
and :class:`EndSubscription` (why a subscription cannot go on).

The adapter calls ``Channel.on_message`` on its own thread; that only appends to the
channel's in-memory queue (bounded by the adapter prefetch) and schedules the channel on
its engine (``core.delivery.DeliveryEngine``).  A channel is run by at most one thread at a
time, which keeps per-consumer order.

A run takes up to ``batch_size`` messages from the head of the queue (and, once they are
prepared, what arrived meanwhile, up to ``batch_size`` in all), passes them through
``prepare`` together (decode + residual topic / MessageContent filter, one verdict per
message: a message that does not match is acked at once and never delivered) and hands
the rest to ``send`` as one batch (one wrapped Notify).  ``prepare`` raising
:class:`EndSubscription` (a filter exceeded its evaluation budget) stops the channel and
calls ``on_give_up`` at once, as a give-up does.  Success acks the batch.  An *ordered*
channel (the adapter needs acknowledgements in arrival order: Kafka offsets, MQTT PUBACK
order) acks a filtered message only once every message before it is settled: it stays
with the batch and is acked after it, in order.  ``DeliveryFailed`` keeps the batch
(unsettled at the middleware) as the channel's *pending* batch and arms a timer:
exponential backoff ``initial_delay * multiplier**(n-1)`` capped at ``max_delay``; no
thread sleeps or spins meanwhile (a subscription's own schedule, ``Channel.backoff`` from its
``core.delivery_policy``, may be linear, and may take the consumer's ``Retry-After``
instead).  Later messages wait behind the pending batch, so order holds.  An answer with
one of the schedule's *final* HTTP statuses ends the batch's retries at once: it goes to
the dead letters (reason ``final-status``), is settled once they are confirmed, and the
channel goes on with the next messages (nothing runs meanwhile, so order holds).  After
``max_attempts`` failed attempts the give-up action applies: ``keep`` retries
forever at ``max_delay`` (the middleware keeps accumulating within its QueueLimits),
``end`` calls the channel's ``on_give_up`` with an :class:`EndSubscription` on a thread
of its own, once the batch given up on is a dead letter and acknowledged and the handle
stopped (the service sends the rest of the backlog to the dead letters, ends the
subscription and publishes SubscriptionEnd).

A push channel has a ``destination`` (``core.lanes``): while that destination's circuit is
open, a run does not send; the attempt fails at once, without network traffic, and counts
like any failed attempt: the same retry schedule, the same give-up.

``stop`` (PauseSubscription; a shard handed over) stops the adapter handle; messages held
in memory are left unsettled, and so are those the handle hands over while it is being
stopped: the middleware redelivers them when the channel starts again (or to the instance
that takes the subscription over), so resume delivers everything accumulated, in order.

Memory.  Each message's bytes are charged to the engine's ``budget``
(``core.delivery_budget``) under the channel's ``group`` (its owner) before it is queued,
and released when it is settled or forgotten.  A message that does not fit is forgotten
unsettled and the channel *parks*: the budget's thread stops the handle as ``stop`` does
(everything unsettled goes back to the middleware) and starts it again when there is room;
meanwhile the channel counts as active, and a retry count survives the park.  A channel
waiting for a retry parks as well while others wait for room (``_yield_room``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from wsnmom.core import metrics
from wsnmom.core.adapter import Received, SubscriptionHandle
from wsnmom.core.delivery_budget import MESSAGE_OVERHEAD, MemoryBudget
from wsnmom.core.lanes import Lane, Outcome
from wsnmom.core.log_context import bound_request_id
from wsnmom.core.ports import DeliveryFailed
from wsnmom.core.takeover_timing import TakeoverTiming

__all__ = ["Backoff", "Channel", "ChannelStatus", "EndSubscription", "PrepareLater", "Scheduler"]

log = logging.getLogger("wsnmom.core.delivery")

T = TypeVar("T")


class EndSubscription(Exception):
    """The subscription cannot go on; ``cause`` says why in one word ("delivery": the
    consumer stayed unreachable, "filter": its filter exceeded its evaluation budget) and
    ``reason`` in a sentence."""

    def __init__(self, reason: str, cause: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.cause = cause


class PrepareLater(Exception):
    """``prepare`` cannot run now (the subscription used its share of the filter
    processes): the messages go back to the head of the queue and the channel runs again
    after ``delay`` seconds, holding no thread meanwhile; not a failed attempt."""

    def __init__(self, delay: float) -> None:
        super().__init__(f"prepare again in {delay:.2f}s")
        self.delay = delay


@dataclass(frozen=True, slots=True)
class ChannelStatus:
    """A channel's delivery state as operators see it (``Channel.status``); times are
    POSIX seconds."""

    #: consuming (False while paused, after a give-up, or closed)
    active: bool
    #: consecutive failed attempts of the batch being retried (0: none failing)
    failures: int
    #: when that batch is tried again, None when no retry is scheduled
    retry_at: float | None
    #: why the last attempt failed, None after a success
    last_error: str | None
    #: messages delivered since the gateway started
    delivered: int
    #: when the last delivery succeeded, None before the first
    last_delivery: float | None
    #: messages held in memory (received, not yet settled)
    held: int
    #: the last :data:`ATTEMPTS_KEPT` delivery attempts, oldest first
    attempts: tuple[DeliveryAttempt, ...] = ()


#: how many delivery attempts a channel remembers for operators
ATTEMPTS_KEPT = 20


@dataclass(frozen=True, slots=True)
class DeliveryAttempt:
    """One try to hand a batch to the consumer, as operators see it (``ChannelStatus``)."""

    #: when it ended (POSIX seconds)
    at: float
    #: the consumer took it
    ok: bool
    #: messages in the batch (filtered ones not counted)
    messages: int
    #: why it failed (None after a success)
    error: str | None = None
    #: the consumer asked to wait (Retry-After, or a lane/breaker deferred it): not counted
    #: as a failure
    deferred: bool = False


@dataclass(slots=True)
class Attempted:
    """How one try to send a batch ended (``Channel._attempt``)."""

    ok: bool = True
    #: why it failed ("" after a success)
    reason: str = ""
    #: with an open circuit: the seconds it stays open (the attempt was not made)
    not_before: float | None = None
    #: the failed attempt's answer: HTTP status and Retry-After (seconds)
    answer: tuple[int | None, float | None] = (None, None)
    #: the request that published the batch's first message (for log records)
    request_id: str | None = None


@dataclass(frozen=True, slots=True)
class Backoff:
    """Retry schedule (seconds): the engine's, or a subscription's own
    (``core.delivery_policy``)."""

    max_attempts: int = 8
    initial_delay: float = 1.0
    multiplier: float = 2.0
    max_delay: float = 300.0
    give_up: str = "end"
    #: ``initial_delay * n`` after the n-th failure instead of the exponential
    linear: bool = False
    #: the longest ``Retry-After`` honoured; None: the consumer's ``Retry-After`` is ignored
    retry_after_max: float | None = None
    #: HTTP statuses after which a batch is not retried (it goes to the dead letters)
    final_statuses: frozenset[int] = frozenset()

    def delay(self, failures: int, retry_after: float | None = None) -> float:
        """Delay before the next attempt after ``failures`` consecutive failures (>= 1);
        the consumer's ``retry_after`` (seconds) instead when it is honoured."""
        if retry_after is not None and self.retry_after_max is not None:
            return float(min(max(retry_after, 0.0), self.retry_after_max))
        if failures >= self.max_attempts:
            return self.max_delay
        if self.linear:
            return float(min(self.initial_delay * failures, self.max_delay))
        return float(min(self.initial_delay * self.multiplier ** (failures - 1), self.max_delay))

    def is_final(self, status: int | None) -> bool:
        """Whether an answer with HTTP ``status`` ends the batch's retries."""
        return status is not None and status in self.final_statuses


def _settle(received: Received, ack: bool) -> None:
    try:
        if ack:
            received.ack()
        else:
            received.nack(requeue=True)
    except Exception:  # the handle may be gone (stopped, deleted); redelivery covers it
        log.debug("settling a message failed", exc_info=True)


#: ``Channel.dead_letter``: (messages, reason, attempts, last error) -> confirmed
DeadLetterSink = Callable[[Sequence[Received], str, int, str | None], bool]


class Scheduler(Protocol):
    """What a channel needs from its engine (``core.delivery.DeliveryEngine``)."""

    backoff: Backoff
    prefetch: int
    budget: MemoryBudget

    def _ready(self, channel: Channel[Any], gen: int) -> None: ...

    def _later(self, delay: float, channel: Channel[Any], gen: int) -> None: ...

    def _spawn(self, fn: Callable[[], None]) -> None: ...

    def admit(self, lane: Lane) -> float | None: ...

    def report(self, lane: Lane, outcome: Outcome) -> None: ...


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
        "_attempts",
        "_charged",
        "_closed",
        "_error",
        "_failures",
        "_gen",
        "_last_delivery",
        "_lock",
        "_parked",
        "_parking",
        "_pending",
        "_queue",
        "_rerun",
        "_retry_at",
        "_running",
        "_scheduled",
        "_start_due",
        "_stopped",
        "_stopping",
        "_switch",
        "backoff",
        "batch_size",
        "bounded",
        "dead_letter",
        "delivered",
        "destination",
        "engine",
        "group",
        "handle",
        "name",
        "on_give_up",
        "ordered",
        "prepare",
        "send",
        "timing",
        "trace",
    )

    def __init__(
        self,
        engine: Scheduler,
        name: str,
        handle: SubscriptionHandle,
        prepare: Callable[[Sequence[Received]], Sequence[T | None]],
        send: Callable[[Sequence[T]], None],
        on_give_up: Callable[[EndSubscription], None],
        batch_size: int,
        ordered: bool = False,
        destination: str | None = None,
        trace: Callable[[T], str | None] | None = None,
        group: str = "",
        bounded: bool = True,
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
        #: the lane key (``core.lanes.destination_key``) of a push channel, else None
        self.destination = destination
        #: the request id an item was published by (log records of its delivery carry it)
        self.trace = trace
        #: whose memory budget the held messages count against (the owner)
        self.group = group
        #: whether a message that does not fit parks the channel (else it is counted)
        self.bounded = bounded
        #: publishes given-up messages as dead letters (messages, reason, attempts, last
        #: error) and says whether the middleware confirmed them; None: dropped unsettled
        self.dead_letter: DeadLetterSink | None = None
        #: the subscription's own retry schedule (``core.delivery_policy``); None: the
        #: engine's
        self.backoff: Backoff | None = None
        #: id() of each held message -> the bytes charged for it
        self._charged: dict[int, int] = {}
        #: a message was refused for lack of memory: parking requested / done
        self._parking = False
        self._parked = False
        self._lock = threading.Lock()
        #: held across a start, stop or close, the handle's call included (a middleware
        #: round trip, which ``_lock`` is not held across): a close while the channel
        #: starts waits for the start and then stops the handle, so that a subscription
        #: destroyed meanwhile is not left consuming
        self._switch = threading.RLock()
        #: a start after an unconfirmed give-up is due (``_start_later``); a stop or a
        #: start meanwhile cancels it
        self._start_due = False
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
        #: ``stop`` is stopping the handle: what arrives meanwhile is left to it
        self._stopping = False
        self._closed = False
        #: operators' view (``status``): when the pending batch is retried (POSIX
        #: seconds, 0: not scheduled), the last failure, deliveries and the last one
        self._retry_at = 0.0
        self._error: str | None = None
        self.delivered = 0
        self._last_delivery = 0.0
        #: the last attempts (created on the first: most channels of pull points never try)
        self._attempts: deque[DeliveryAttempt] | None = None
        #: opened for a taken shard: the steps of its first delivery are timed (until its
        #: first attempt ends; ``core.takeover_timing``)
        self.timing: TakeoverTiming | None = None

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        """True while consuming (started and not stopped/closed; parked counts)."""
        return (not self._stopped or self._parked) and not self._closed

    @property
    def failures(self) -> int:
        """Consecutive failed attempts of the pending batch."""
        return self._failures

    def start(self) -> None:
        """Consume from the durable subscription (also after ``stop``)."""
        with self._switch:
            with self._lock:
                self._start_due = False
                if self._closed or not self._stopped:
                    return
                if not self._parked:
                    self._failures = 0
                    self._retry_at = 0.0
                self._parked = self._parking = False
                self._stopped = False
                self._gen += 1
                self._scheduled = False
                self._queue = None
                self._pending = []
                freed = self._forget_charges()
            self._release(freed)
            try:
                self.handle.start(self.on_message, prefetch=self.engine.prefetch)
            except BaseException:
                with self._lock:  # not started: a later start tries again
                    self._halt()
                raise

    def stop(self) -> None:
        """Stop consuming; the durable subscription keeps accumulating.  Messages held in
        memory stay unsettled and are redelivered by the middleware on the next start."""
        with self._switch:
            with self._lock:
                # a stopped channel stays so: no start after a give-up either (a Pause
                # of a channel that gave up and waits to try again)
                self._start_due = False
                if self._parked:  # the handle is stopped already; no longer to be unparked
                    self._parked = self._parking = False
                    return
                if not self._halt():
                    return
                freed = self._forget_charges()
                self._stopping = True
            self._release(freed)
            try:
                self.handle.stop()
            finally:
                with self._lock:
                    self._stopping = False

    def _retry_later(
        self, reason: str, failures: int, delay: float, not_before: float | None, gen: int
    ) -> None:
        """A failed attempt to be tried again after ``delay``: logged (at debug when the
        consumer set the time with Retry-After), and timed unless the channel parks to
        leave its memory to others meanwhile."""
        log.log(
            logging.INFO if not_before is None else logging.DEBUG,
            "subscription %s: delivery failed (%s); retry %d in %.3fs",
            self.name,
            reason,
            failures,
            delay,
        )
        if not self._yield_room(gen):
            self.engine._later(delay, self, gen)

    def _give_up(
        self, letters: list[Received], batch: list[Received], failures: int, reason: str
    ) -> None:
        """Retries ran out (``give_up = "end"``): ``letters`` go to the dead letters and
        ``batch`` is settled, the handle stops (what else it held goes back to the
        middleware) and the subscription ends on a thread of its own, which buries the
        rest of its backlog."""
        log.warning(
            "subscription %s: giving up after %d failed attempts: %s",
            self.name,
            failures,
            reason,
        )
        if not self._bury(letters, batch, "retries-exhausted", failures, reason):
            return
        try:
            self.handle.stop()
        except Exception:
            log.debug("stopping the handle failed", exc_info=True)
        end = EndSubscription(reason, "delivery")
        self.engine._spawn(lambda: self.on_give_up(end))

    def _halt(self) -> bool:
        """Under the lock: stop consuming (False when stopped already)."""
        if self._stopped:
            return False
        self._stopped = True
        self._gen += 1
        self._scheduled = False
        self._retry_at = 0.0
        self._queue = None
        if not self._running:
            self._pending = []
        return True

    def _remember(
        self,
        pending: list[tuple[Received, T | None]],
        ok: bool,
        reason: str,
        not_before: float | None,
    ) -> None:
        """Under the lock: keep the attempt that sent ``pending`` for operators."""
        sent = sum(1 for _, item in pending if item is not None)
        if not sent:
            return  # nothing was sent (all filtered): no attempt
        if self._attempts is None:
            self._attempts = deque(maxlen=ATTEMPTS_KEPT)
        self._attempts.append(
            DeliveryAttempt(
                at=time.time(),
                ok=ok,
                messages=sent,
                error=None if ok else reason,
                deferred=not ok and not_before is not None,
            )
        )

    # -- memory (core.delivery_budget) -----------------------------------------------------
    def _forget_charges(self) -> int:
        """Under the lock: forget every charge (what is held is being dropped)."""
        freed = sum(self._charged.values())
        self._charged.clear()
        return freed

    def _release(self, size: int) -> None:
        if size:
            self.engine.budget.release(self.group, size)

    def _settle(self, received: Received, ack: bool) -> None:
        """Settle one held message and release its bytes."""
        with self._lock:
            size = self._charged.pop(id(received), 0)
        self._release(size)
        _settle(received, ack)

    def _park(self) -> bool:
        """The budget's thread: stop the handle and forget what is held, keeping the
        retry count; False when the channel is not consuming any more."""
        with self._switch:
            with self._lock:
                if not self._parking or self._closed or not self._halt():
                    self._parking = False
                    return False
                self._parked = True
                freed = self._forget_charges()
            self._release(freed)
            self.handle.stop()
        return True

    def _yield_room(self, gen: int) -> bool:
        """Waiting for a retry while other channels wait for room: park instead (True),
        so that what this channel holds goes back to the middleware meanwhile."""
        if not self.bounded or not self.engine.budget.has_parked():
            return False
        with self._lock:
            if gen != self._gen or self._stopped or self._parking or not self._charged:
                return False
            self._parking = True
        self.engine.budget.park(self.group, self)
        return True

    def _unpark(self) -> None:
        """The budget's thread: there is room again; consume (no-op unless parked).  The
        check and the start under ``_switch``: a stop meanwhile (a Pause, which leaves a
        parked channel stopped for good) comes before or after both, never between."""
        with self._switch:
            if self._parked:
                self.start()

    def close(self) -> None:
        """Stop for good (subscription destroyed or broker closing)."""
        with self._switch:  # after a start under way: the handle it started is stopped
            with self._lock:
                self._closed = True
                self._parked = False
            self.stop()

    def held(self) -> int:
        """Messages held in memory (queued plus pending)."""
        return len(self._queue or ()) + len(self._pending)

    def held_messages(self, limit: int) -> list[Received]:
        """The first ``limit`` messages held in memory, in delivery order: the batch being
        sent (a filtered message kept only to be settled in order left out), then those
        received for the next batches.  For operators' peek; nothing is settled."""
        with self._lock:
            out = [r for r, item in self._pending if item is not None][:limit]
            for r in self._queue or ():
                if len(out) >= limit:
                    break
                out.append(r)
            return out

    def status(self) -> ChannelStatus:
        """The delivery state for operators (the admin page and API)."""
        with self._lock:
            return ChannelStatus(
                active=(not self._stopped or self._parked) and not self._closed,
                failures=self._failures,
                retry_at=self._retry_at or None,
                last_error=self._error,
                delivered=self.delivered,
                last_delivery=self._last_delivery or None,
                held=len(self._queue or ()) + len(self._pending),
                attempts=tuple(self._attempts or ()),
            )

    # -- adapter callback ------------------------------------------------------------------
    def on_message(self, received: Received) -> None:
        """Adapter thread: enqueue only (or, without room in the memory budget, forget it
        unsettled and have the channel parked)."""
        schedule = False
        park = False
        size = len(received.body) + MESSAGE_OVERHEAD
        if self.timing is not None:
            self.timing.mark("read")
        with self._lock:
            # a message for a stopped channel is requeued, unless the handle is being
            # stopped (``stop``) or parked: the handle gives it back then, in its place
            # (a requeue could skip it, or put it behind later ones: a RabbitMQ quorum
            # queue requeues at the back, and a graceful hand-over would break order)
            stale = self._stopped and not self._parking and not self._stopping
            if self._stopped:
                pass
            elif self._parking or not self.engine.budget.take(
                self.group, size, self, force=not self.bounded
            ):
                # neither settled nor queued: the handle, stopped soon, gives it back to
                # the middleware
                park = not self._parking
                self._parking = True
            else:
                self._charged[id(received)] = size
                q = self._queue
                if q is None:
                    q = self._queue = deque()
                q.append(received)
                if not self._scheduled:
                    self._scheduled = schedule = True
                gen = self._gen
        if stale:
            _settle(received, ack=False)
        elif park:
            self.engine.budget.park(self.group, self)
        elif schedule:
            self.engine._ready(self, gen)

    # -- worker ----------------------------------------------------------------------------
    def _run(self, gen: int, lane: Lane | None = None) -> None:
        """Deliver what is pending or queued (a worker thread; ``lane``: the place the
        worker holds in the channel's destination lane)."""
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
        if self.timing is not None:
            self.timing.mark("run")
        request_id: str | None = None
        try:
            try:
                items = self._prepare(take)
            except EndSubscription as end:
                self._end(gen, take, end)
                return
            except PrepareLater as later:
                self._put_back(gen, take, later.delay)
                return
            if take:
                take, items = self._join_arrivals(gen, take, items)
            for received, item in zip(take, items, strict=True):
                if item is None:
                    metrics.NOTIFICATIONS_FILTERED.inc()
                    if self.ordered and any(i is not None for _, i in pending):
                        pending.append((received, None))  # acked after those before it
                    else:
                        self._settle(received, ack=True)
                else:
                    pending.append((received, item))
            batch = [item for _, item in pending if item is not None]
            tried = self._attempt_safely(batch, lane)
            request_id = tried.request_id
        finally:
            with self._lock:
                self._running = False
        # log records about this batch (retry, give-up) name the request that published
        # its first message
        with bound_request_id(request_id):
            try:
                self._after_send(
                    gen, pending, tried.ok, tried.reason, tried.not_before, tried.answer
                )
            except Exception:
                log.exception("subscription %s: settling a batch raised", self.name)
                self.engine._later(self.schedule.delay(1), self, gen)

    def _join_arrivals(
        self, gen: int, take: list[Received], items: Sequence[T | None]
    ) -> tuple[list[Received], list[T | None]]:
        """What arrived while ``take`` was prepared joins it, up to ``batch_size`` (one
        post instead of two; nothing waits for it).  An arrival ``prepare`` cannot take
        now goes back to the head of the queue for the next run."""
        take, items = list(take), list(items)
        while len(take) < self.batch_size:
            with self._lock:
                q = self._queue
                if gen != self._gen or self._stopped or not q:
                    break
                more = [q.popleft() for _ in range(min(self.batch_size - len(take), len(q)))]
                if not q:
                    self._queue = None
            try:
                prepared = self._prepare(more)
            except (EndSubscription, PrepareLater):
                self._requeue_head(gen, more)  # the next run meets it again
                break
            take.extend(more)
            items.extend(prepared)
        return take, items

    def _requeue_head(self, gen: int, more: list[Received]) -> None:
        """Give ``more`` (taken from the head of the queue) back to it; stopped meanwhile:
        unsettled, for the middleware to redeliver."""
        with self._lock:
            current = gen == self._gen and not self._stopped
            if current:
                q = self._queue
                if q is None:
                    q = self._queue = deque()
                q.extendleft(reversed(more))
            parked = self._parking
        if not current and not parked:
            for received in more:
                self._settle(received, ack=False)

    def _attempt_safely(self, batch: list[T], lane: Lane | None) -> Attempted:
        """:meth:`_attempt`; an unexpected exception (a bug) is a failed attempt, retried
        as any other: the channel goes on."""
        try:
            return self._attempt(batch, lane)
        except Exception as exc:
            log.exception("subscription %s: an attempt raised", self.name)
            return Attempted(ok=False, reason=f"unexpected error: {exc!r}")

    def _attempt(self, batch: list[T], lane: Lane | None) -> Attempted:
        """Send ``batch`` (nothing when empty), unless the destination's circuit is open;
        the lane's breaker is told how it ended."""
        tried = Attempted()
        wait = self.engine.admit(lane) if batch and lane is not None else None
        if wait is not None:  # the destination's circuit is open: no attempt now
            tried.ok = False
            tried.not_before = wait
            tried.reason = f"{self.destination} did not answer; circuit open for {wait:.1f}s"
        if batch and self.trace is not None:
            tried.request_id = self.trace(batch[0])
        if wait is not None or not batch:
            return tried
        outcome = Outcome.ANSWERED
        timing = self.timing
        if timing is not None:
            timing.mark("post")
        with bound_request_id(tried.request_id):
            try:
                self.send(batch)
            except DeliveryFailed as exc:
                tried.ok = False
                tried.reason = exc.reason
                tried.answer = (exc.status, exc.retry_after)
                if exc.timed_out:
                    outcome = Outcome.TIMED_OUT
                elif not exc.answered:
                    outcome = Outcome.FAILED_FAST
            except Exception as exc:  # a bug or an unexpected client error: retry too
                log.exception("subscription %s: delivery raised", self.name)
                tried.ok = False
                tried.reason = f"{type(exc).__name__}: {exc}"
                outcome = Outcome.FAILED_FAST
            finally:
                if lane is not None:
                    self.engine.report(lane, outcome)
                if timing is not None:
                    self.timing = None  # the first attempt is timed, no other
                    timing.mark("answer")
        return tried

    def _prepare(self, take: list[Received]) -> Sequence[T | None]:
        """``prepare`` over ``take``; when it fails, message by message, so that only a
        message that cannot be prepared is dropped."""
        if not take:
            return []
        try:
            return self.prepare(take)
        except (EndSubscription, PrepareLater):
            raise
        except Exception:
            log.exception("subscription %s: cannot prepare a batch; one by one", self.name)
        items: list[T | None] = []
        for received in take:
            try:
                items.extend(self.prepare([received]))
            except (EndSubscription, PrepareLater):
                raise
            except Exception:
                log.exception("subscription %s: cannot prepare a message; dropped", self.name)
                items.append(None)
        return items

    def _put_back(self, gen: int, take: list[Received], delay: float) -> None:
        """``prepare`` said later: ``take`` goes back to the head of the queue and the
        channel runs again after ``delay`` (the caller's ``finally`` clears
        ``_running``)."""
        with self._lock:
            current = gen == self._gen and not self._stopped
            if current:
                q = self._queue
                if q is None:
                    q = self._queue = deque()
                q.extendleft(reversed(take))
                self._rerun = False
            parked = self._parking
        if current:
            self.engine._later(delay, self, gen)
        elif not parked:
            for received in take:
                self._settle(received, ack=False)

    def _end(self, gen: int, take: list[Received], end: EndSubscription) -> None:
        """``prepare`` said the subscription cannot go on: stop and hand over (the caller's
        ``finally`` clears ``_running``)."""
        with self._lock:
            current = gen == self._gen and not self._stopped
            if current:
                self._stopped = True
                self._gen += 1
                self._retry_at = 0.0
                self._queue = None
                self._pending = []
                self._error = end.reason
                self._release(self._forget_charges())
        if not current:
            for received in take:
                self._settle(received, ack=False)
            return
        # like a give-up: the batch goes to the dead letters, what else is held stays
        # unsettled; the subscription is being ended
        log.warning("subscription %s: %s", self.name, end.reason)
        if not self._bury(take, take, "filter-budget", 0, end.reason):
            return
        try:
            self.handle.stop()
        except Exception:
            log.debug("stopping the handle failed", exc_info=True)
        self.engine._spawn(lambda: self.on_give_up(end))

    def _bury(
        self,
        letters: Sequence[Received],
        batch: Sequence[Received],
        reason: str,
        attempts: int,
        error: str | None,
    ) -> bool:
        """After a give-up (the channel is stopped): publish ``letters`` as dead letters
        and acknowledge ``batch`` (``letters`` and the filtered messages settled in order
        with them) once the middleware confirmed them (True).  When it did not, nothing
        is settled, the handle is stopped (the middleware gives everything back) and the
        channel starts again after the longest retry delay (False): the give-up is tried
        again, and no message is lost."""
        sink = self.dead_letter
        if sink is None or not batch:
            return True
        if not letters or sink(letters, reason, attempts, error):
            for received in batch:  # in order: a log commits a contiguous prefix
                _settle(received, ack=True)
            return True
        try:
            self.handle.stop()
        except Exception:
            log.debug("stopping the handle failed", exc_info=True)
        self._start_later()
        return False

    def _start_later(self) -> None:
        """Start again after the longest retry delay (a dead letter was not confirmed),
        unless stopped or started meanwhile."""
        with self._lock:
            self._start_due = True
        retry = threading.Timer(self.schedule.max_delay, self._start_if_due)
        retry.daemon = True
        retry.start()

    def _start_if_due(self) -> None:
        """The timer of ``_start_later``."""
        with self._switch:
            with self._lock:
                due = self._start_due
            if due:
                self.start()

    @property
    def schedule(self) -> Backoff:
        """The retry schedule this channel follows (its own, else the engine's)."""
        return self.backoff or self.engine.backoff

    def _bury_final(
        self,
        pending: list[tuple[Received, T | None]],
        attempts: int,
        error: str,
        gen: int,
    ) -> bool:
        """The consumer answered a final status: the batch goes to the dead letters and is
        settled once they are confirmed, and delivery goes on with the next messages;
        whether the channel is to run again now.  Not confirmed: the channel stops (the
        middleware gives everything back) and starts again after the longest retry delay,
        so that nothing is lost."""
        letters = [r for r, item in pending if item is not None]
        sink = self.dead_letter
        if sink is None or sink(letters, "final-status", attempts, error):
            for received, _ in pending:  # in order: a log commits a contiguous prefix
                self._settle(received, ack=True)
            with self._lock:
                if gen != self._gen or self._stopped:
                    return False
                if self._queue:
                    return True
                self._scheduled = False
                return False
        self.stop()
        self._start_later()
        return False

    def _after_send(
        self,
        gen: int,
        pending: list[tuple[Received, T | None]],
        ok: bool,
        reason: str,
        not_before: float | None = None,
        answer: tuple[int | None, float | None] = (None, None),
    ) -> None:
        give_up = False
        #: the consumer answered a final status: the batch goes to the dead letters
        final = False
        delay: float | None = None
        reschedule = False
        status, retry_after = answer
        with self._lock:
            current = gen == self._gen and not self._stopped
            self._retry_at = 0.0
            self._remember(pending, ok, reason, not_before)
            if ok:
                self._pending = [] if current else self._pending
                self._failures = 0
                sent = sum(1 for _, item in pending if item is not None)
                if sent:
                    self.delivered += sent
                    self._last_delivery = time.time()
                    self._error = None
            elif pending:
                if not_before is None:
                    metrics.DELIVERY_FAILURES.inc()
                else:
                    metrics.DELIVERY_DEFERRED.inc()
                self._error = reason
                if current:
                    self._failures += 1
                    policy = self.schedule
                    if not_before is None and policy.is_final(status):
                        final = True
                        self._pending = []
                    elif self._failures >= policy.max_attempts and policy.give_up == "end":
                        give_up = True
                        self._stopped = True
                        self._gen += 1
                        self._queue = None
                        self._pending = []
                        self._release(self._forget_charges())
                    else:
                        delay = policy.delay(self._failures, retry_after)
                        self._retry_at = time.time() + delay
            if not current and not self._running and self._pending is pending:
                # stopped (or restarted) meanwhile: the handle redelivers what is unsettled
                self._pending = []
            if current and delay is None and not give_up:
                if self._queue or self._rerun:
                    reschedule = True
                elif not final:  # else: once the batch is buried (nothing runs meanwhile)
                    self._scheduled = False
            elif not current and not self._stopped and (self._queue or self._rerun):
                reschedule = True
            self._rerun = False
            new_gen = self._gen
            failures = self._failures
            if final:
                self._failures = 0
        if ok:
            for received, _ in pending:
                self._settle(received, ack=True)
        if give_up:
            letters = [r for r, item in pending if item is not None]
            self._give_up(letters, [r for r, _ in pending], failures, reason)
        elif final:
            log.warning("subscription %s: HTTP %s is final: %s", self.name, status, reason)
            if self._bury_final(pending, failures, reason, new_gen) or reschedule:
                self.engine._ready(self, new_gen)
        elif delay is not None:
            self._retry_later(reason, failures, delay, not_before, new_gen)
        elif reschedule:
            self.engine._ready(self, new_gen)
