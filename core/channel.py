"""A subscription's delivery: :class:`Channel`, what runs it (the adapter's callback, a
delivery run, an attempt and what follows it).

The adapter calls ``Channel.on_message`` on its own thread; that only appends to the
channel's in-memory queue (bounded by the adapter prefetch) and schedules the channel on
its engine (``core.delivery.DeliveryEngine``).  A channel is run by at most one thread at a
time, which keeps per-consumer order.

A run takes up to ``batch_size`` messages from the head of the queue (and, once they are
prepared, what arrived meanwhile, up to ``batch_size`` in all), passes them through
``prepare`` together (decode + residual topic / MessageContent filter, one verdict per
message: a message that does not match is acked at once and never delivered) and hands
the rest to ``send`` as one batch (one wrapped Notify).  ``prepare`` raising
``EndSubscription`` (a filter exceeded its evaluation budget) stops the channel and
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
``end`` calls the channel's ``on_give_up`` with an ``EndSubscription`` on a thread
of its own, once the batch given up on is a dead letter and acknowledged and the handle
stopped (the service sends the rest of the backlog to the dead letters, ends the
subscription and publishes SubscriptionEnd).

A push channel has a ``destination`` (``core.lanes``): while that destination's circuit is
open, a run does not send; the attempt fails at once, without network traffic, and counts
like any failed attempt: the same retry schedule, the same give-up.

Its parts: ``core.channel_state`` (what it holds, start and stop, its memory: the base
class), ``core.channel_give_up`` (give-ups and dead letters), ``core.backoff`` (the retry
schedule), ``core.channel_signals`` (``EndSubscription``, ``PrepareLater``) and
``core.channel_status`` (what operators see).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from wsnmom.core import metrics
from wsnmom.core.adapter import Received
from wsnmom.core.channel_give_up import ChannelGiveUp
from wsnmom.core.channel_signals import EndSubscription, PrepareLater
from wsnmom.core.channel_state import settle
from wsnmom.core.delivery_budget import MESSAGE_OVERHEAD
from wsnmom.core.lanes import Lane, Outcome
from wsnmom.core.log_context import bound_request_id
from wsnmom.core.ports import DeliveryFailed

__all__ = ["Channel"]

log = logging.getLogger("wsnmom.core.delivery")

T = TypeVar("T")


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


class Channel(ChannelGiveUp[T]):
    """Delivery of one subscription: the adapter's callback queues, a worker's run sends
    (see the module docstring; its state and lifecycle: ``ChannelState``)."""

    __slots__ = ()

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
            settle(received, ack=False)
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

    def _requeue_head(self, gen: int, more: list[Received], *, rerun: bool = True) -> bool:
        """Give ``more`` (taken from the head of the queue) back to it, and whether it went
        back: stopped meanwhile (``gen`` is no longer current), unsettled, for the
        middleware to redeliver (kept while parking).  Without ``rerun`` a run asked for
        meanwhile is dropped with the requeue (the caller schedules the next)."""
        with self._lock:
            current = gen == self._gen and not self._stopped
            if current:
                q = self._queue
                if q is None:
                    q = self._queue = deque()
                q.extendleft(reversed(more))
                if not rerun:
                    self._rerun = False
            parked = self._parking
        if not current and not parked:
            for received in more:
                self._settle(received, ack=False)
        return current

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
        if self._requeue_head(gen, take, rerun=False):
            self.engine._later(delay, self, gen)

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
