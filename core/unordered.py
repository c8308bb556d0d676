"""Unordered delivery (issue 25, item 2): :class:`UnorderedChannel`, a channel that keeps up
to ``in_flight`` deliveries of one subscription going at once, each retried on its own.

A *delivery* is one batch (up to ``batch_size`` messages, one Notify) taken from the head of
the channel's queue.  It is in flight from when it is taken until its messages are settled:
while it is being sent and while it waits for its next attempt.  Up to ``in_flight`` of
them exist per subscription; a run of the channel (``core.delivery`` runs a channel on
several threads at once here, each holding its own place in the destination's lane) picks
a delivery whose retry is due, else takes a new one from the queue when a place is free,
and makes one attempt.  A failed delivery waits for its own backoff (the subscription's
retry schedule, ``Retry-After``, the open circuit of its destination) without holding the
others back; a final status buries it alone; exhausting ``max_attempts`` with
``give_up = "end"`` ends the subscription as on an ordered channel.

Settling.  Each message is acknowledged to the middleware only after its delivery
succeeded, or after it was confirmed as a dead letter; messages a filter drops are
acknowledged at once.  Acknowledgements therefore reach the adapter out of arrival order,
which every adapter shape takes (``core.adapter``): a queue settles each message on its
own (RabbitMQ delivery tags, embedded and MQTT rows), and a log cursor commits only up to
its lowest unsettled offset (``adapters.logbase.cursor``), so a crash redelivers
everything from there, at-least-once.  Nothing is ever nacked for requeue while the channel
runs (on a log a requeue rewinds the cursor): a stopped or parked handle gives back what is
unsettled, as on an ordered channel.

Everything else is the ordered channel's (``core.channel``): the in-memory queue and its
byte budget (parking gives back every delivery in flight; a redelivered message takes up
the failed attempts it had, found by its ``wsnmom-message-id``: a delivery counts on from
the most its messages had, and each message carries its own count into a later park),
Pause, the filters' share
(``PrepareLater``), the dead letters and the attempts operators see (``status`` shows the
delivery that failed most).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, TypeVar

from wsnmom.core import metrics
from wsnmom.core.adapter import HEADER_MESSAGE_ID, Received
from wsnmom.core.channel import Channel
from wsnmom.core.channel_signals import EndSubscription, PrepareLater
from wsnmom.core.channel_status import ChannelStatus
from wsnmom.core.lanes import Lane
from wsnmom.core.log_context import bound_request_id

__all__ = ["UnorderedChannel"]

log = logging.getLogger("wsnmom.core.delivery")

T = TypeVar("T")

#: the clock retries are due by (the engine's timers use the same)
_monotonic = time.monotonic


@dataclass(eq=False, slots=True)
class _Delivery:
    """One batch in flight: its messages and items, its failures and its next attempt."""

    pending: list[tuple[Received, Any]] = field(default_factory=list)
    failures: int = 0
    #: ``time.monotonic()`` of its next attempt (0: none scheduled)
    due: float = 0.0
    #: the same as POSIX seconds, for operators
    retry_at: float = 0.0
    #: a run is attempting it now
    running: bool = False
    #: the failed attempts its messages brought from before a park (by message id; None:
    #: none), and the most of them, which ``failures`` started at
    prior: dict[str, int] | None = None
    base: int = 0


class UnorderedChannel(Channel[T]):
    """A channel with up to ``in_flight`` deliveries at once (see the module docstring)."""

    __slots__ = ("_carried", "_deliveries", "in_flight")

    def __init__(self, *args: Any, in_flight: int = 1, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: most deliveries in flight at once
        self.in_flight = max(1, in_flight)
        self._deliveries: list[_Delivery] = []
        #: parked: the failed attempts of the messages given back (by message id), taken up
        #: again when the middleware redelivers them (None: none)
        self._carried: dict[str, int] | None = None

    # -- state -----------------------------------------------------------------------------
    def start(self) -> None:
        with self._switch:
            with self._lock:
                if not self._parked:  # a start after Pause or a give-up: counts start afresh
                    self._carried = None
            super().start()

    def _halt(self) -> bool:
        parking = self._parking
        if not super()._halt():
            return False
        if parking:  # a retry count survives the park, as on an ordered channel
            carried = self._carried or {}
            for delivery in self._deliveries:
                # each message's own count: what it brought plus what this delivery
                # failed since (not the delivery's, which started at the most any of its
                # messages brought: a message batched with one that had failed before
                # would take that count up, and carry it, grown, into the next park)
                made = delivery.failures - delivery.base
                prior = delivery.prior or {}
                for received, _ in delivery.pending:
                    key = received.headers.get(HEADER_MESSAGE_ID)
                    count = prior.get(key, 0) + made if key else 0
                    if key and count:
                        carried[key] = count
            self._carried = carried or None
        self._deliveries = []  # their runs see the new generation and settle nothing more
        return True

    def _carry(self, gen: int, delivery: _Delivery, take: list[Received]) -> None:
        """Under the lock: a delivery of redelivered messages takes up the failed attempts
        they had before the channel parked (the most of them); every message taken,
        filtered ones included, is forgotten from what is carried.  Nothing for a run of
        an earlier generation (the channel parked while it prepared): its messages come
        again, and their redelivery takes the counts up."""
        carried = self._carried
        if not carried or gen != self._gen or delivery not in self._deliveries:
            return
        pending = {id(received) for received, _ in delivery.pending}
        prior: dict[str, int] = {}
        for received in take:
            key = received.headers.get(HEADER_MESSAGE_ID)
            if not key:
                continue
            count = carried.pop(key, 0)
            if count and id(received) in pending:
                prior[key] = count
        if prior:
            delivery.prior = prior
            delivery.base = max(prior.values())
            delivery.failures = max(delivery.failures, delivery.base)
        if not carried:
            self._carried = None

    @property
    def failures(self) -> int:
        """Consecutive failed attempts of the delivery that failed most."""
        with self._lock:
            return max((d.failures for d in self._deliveries), default=0)

    def held(self) -> int:
        return len(self._queue or ()) + sum(len(d.pending) for d in self._deliveries)

    def held_messages(self, limit: int) -> list[Received]:
        with self._lock:
            out = [r for d in self._deliveries for r, _ in d.pending][:limit]
            for r in self._queue or ():
                if len(out) >= limit:
                    break
                out.append(r)
            return out

    def status(self) -> ChannelStatus:
        with self._lock:
            retries = [d.retry_at for d in self._deliveries if d.retry_at]
            return ChannelStatus(
                active=(not self._stopped or self._parked) and not self._closed,
                failures=max((d.failures for d in self._deliveries), default=0),
                retry_at=min(retries) if retries else None,
                last_error=self._error,
                delivered=self.delivered,
                last_delivery=self._last_delivery or None,
                held=len(self._queue or ()) + sum(len(d.pending) for d in self._deliveries),
                attempts=tuple(self._attempts or ()),
            )

    # -- worker ----------------------------------------------------------------------------
    def _pick(self) -> tuple[_Delivery | None, list[Received], bool]:
        """Under the lock: a delivery whose retry is due, else a new one from the queue
        when a place is free; the messages newly taken; whether another run is to start
        (more is queued and places are free)."""
        now = _monotonic()
        for delivery in self._deliveries:
            if not delivery.running and delivery.due and delivery.due <= now:
                delivery.running = True
                delivery.due = 0.0
                return delivery, [], self._more()
        q = self._queue
        if not q or len(self._deliveries) >= self.in_flight:
            # nothing to take, or every place is taken: a delivery that ends looks again
            self._scheduled = bool(q)
            return None, [], False
        n = min(self.batch_size, len(q))
        take = [q.popleft() for _ in range(n)]
        if not q:
            self._queue = None
        delivery = _Delivery(running=True)
        self._deliveries.append(delivery)
        more = self._more()
        return delivery, take, more

    def _more(self) -> bool:
        """Under the lock: whether one more run is to start now (else, with nothing left
        queued, the next message schedules the channel)."""
        if not self._queue:
            self._scheduled = False
            return False
        return len(self._deliveries) < self.in_flight

    def _run(self, gen: int, lane: Lane | None = None) -> None:
        """One attempt of one delivery (a worker thread; ``lane``: its place in the
        destination's lane).  Several runs of one channel may be under way at once."""
        with self._lock:
            if gen != self._gen or self._stopped:
                return
            delivery, take, more = self._pick()
        if more:
            self.engine._ready(self, gen)
        if delivery is None:
            return
        if take:
            try:
                items = self._prepare(take)
            except EndSubscription as end:
                self._drop(delivery)
                self._end(gen, take, end)
                with self._lock:
                    if self._stopped:
                        self._deliveries = []
                return
            except PrepareLater as later:
                self._drop(delivery)
                with self._lock:
                    self._scheduled = True  # the timer's run takes them again
                self._put_back(gen, take, later.delay)
                return
            for received, item in zip(take, items, strict=True):
                if item is None:
                    metrics.NOTIFICATIONS_FILTERED.inc()
                    self._settle(received, ack=True)
                else:
                    delivery.pending.append((received, item))
            if self._carried:
                with self._lock:
                    self._carry(gen, delivery, take)
            if not delivery.pending:  # all filtered
                self._drop(delivery)
                self._look_again(gen)
                return
        tried = self._attempt_safely([item for _, item in delivery.pending], lane)
        with bound_request_id(tried.request_id):
            try:
                self._finish(gen, delivery, tried.ok, tried.reason, tried.not_before, tried.answer)
            except Exception:
                # a bug: the delivery, if still held, is tried again later (never left
                # running, its place lost); a free place looks at the queue
                log.exception("subscription %s: settling a batch raised", self.name)
                self._rescue(gen, delivery)

    def _rescue(self, gen: int, delivery: _Delivery) -> None:
        """After ``_finish`` raised: retry a delivery still held, look at the queue."""
        delay = self.schedule.delay(1)
        with self._lock:
            held = delivery in self._deliveries and (delivery.running or not delivery.due)
            if held:
                delivery.running = False
                delivery.due = _monotonic() + delay
        if held:
            self.engine._later(delay, self, gen)
        self._look_again(gen)

    def _drop(self, delivery: _Delivery) -> None:
        with self._lock:
            if delivery in self._deliveries:
                self._deliveries.remove(delivery)

    def _look_again(self, gen: int) -> None:
        """A place became free: run again when messages are queued."""
        with self._lock:
            if gen != self._gen or self._stopped:
                return
            if not self._queue:
                self._scheduled = False
                return
            self._scheduled = True
        self.engine._ready(self, gen)

    def _finish(
        self,
        gen: int,
        delivery: _Delivery,
        ok: bool,
        reason: str,
        not_before: float | None,
        answer: tuple[int | None, float | None],
    ) -> None:
        """After an attempt: settle, schedule the retry, bury or give up."""
        pending = delivery.pending
        status, retry_after = answer
        give_up = final = False
        delay: float | None = None
        with self._lock:
            current = gen == self._gen and not self._stopped and delivery in self._deliveries
            self._remember(pending, ok, reason, not_before)
            delivery.running = False
            if ok:
                self.delivered += len(pending)
                self._last_delivery = time.time()
                self._error = None
            else:
                if not_before is None:
                    metrics.DELIVERY_FAILURES.inc()
                else:
                    metrics.DELIVERY_DEFERRED.inc()
                self._error = reason
            if ok or not current:
                # done, or stopped meanwhile (the handle redelivers what is unsettled)
                if delivery in self._deliveries:
                    self._deliveries.remove(delivery)
            else:
                delivery.failures += 1
                policy = self.schedule
                if not_before is None and policy.is_final(status):
                    final = True
                    self._deliveries.remove(delivery)
                elif delivery.failures >= policy.max_attempts and policy.give_up == "end":
                    give_up = True
                    self._stopped = True
                    self._gen += 1
                    self._queue = None
                    self._deliveries = []
                    self._release(self._forget_charges())
                else:
                    delay = policy.delay(delivery.failures, retry_after)
                    delivery.due = _monotonic() + delay
                    delivery.retry_at = time.time() + delay
            failures = delivery.failures
            new_gen = self._gen
        if ok:
            for received, _ in pending:
                self._settle(received, ack=True)
            self._look_again(gen)
        elif give_up:
            batch = [r for r, _ in pending]
            self._give_up(batch, batch, failures, reason)
        elif final:
            log.warning("subscription %s: HTTP %s is final: %s", self.name, status, reason)
            if self._bury_final(pending, failures, reason, new_gen):
                with self._lock:
                    self._scheduled = True
                self.engine._ready(self, new_gen)
        elif delay is not None:
            self._retry_later(reason, failures, delay, not_before, new_gen)
        elif not current:
            self._look_again(gen)
