"""A delivery channel's state and lifecycle (:class:`ChannelState`, the base of
``core.channel.Channel``): what it holds, start, stop, close, and its memory.

``_gen`` changes on every start and stop: scheduled runs and timers of an older generation
are ignored, and a batch sent under an older generation is not retried.

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
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from wsnmom.core.adapter import Received, SubscriptionHandle
from wsnmom.core.backoff import Backoff
from wsnmom.core.channel_signals import EndSubscription
from wsnmom.core.channel_status import ATTEMPTS_KEPT, ChannelStatus, DeliveryAttempt
from wsnmom.core.delivery_budget import MemoryBudget
from wsnmom.core.lanes import Lane, Outcome
from wsnmom.core.takeover_timing import TakeoverTiming

if TYPE_CHECKING:
    from wsnmom.core.channel import Channel

__all__ = ["ChannelState", "DeadLetterSink", "Scheduler", "settle"]

log = logging.getLogger("wsnmom.core.delivery")

T = TypeVar("T")


def settle(received: Received, ack: bool) -> None:
    """Acknowledge ``received`` (``ack``) or give it back for redelivery, quietly: a handle
    that is gone (stopped, deleted) leaves it to the middleware."""
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


class ChannelState(Generic[T]):
    """What one subscription's delivery channel holds, its lifecycle and its memory (see
    the module docstring); ``core.channel.Channel`` runs it.

    One exists per subscription, so it is kept small: ``__slots__`` (declared here, the
    parts above it add none), and the in-memory queue is created on the first message (an
    empty ``deque`` preallocates a 64-slot block, ~760 bytes; most pull-point subscriptions
    are idle most of the time).
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

    if TYPE_CHECKING:

        def on_message(self, received: Received) -> None:
            """The adapter's callback (``core.channel.Channel``), which ``start`` hands to
            the handle."""

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

    @property
    def schedule(self) -> Backoff:
        """The retry schedule this channel follows (its own, else the engine's)."""
        return self.backoff or self.engine.backoff

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
        settle(received, ack)

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
