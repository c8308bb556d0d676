"""What this instance does when it gains or loses shards (``core.cluster``): open the
delivery of the gained shards' push subscriptions, close the lost ones' (what a closed
delivery held goes back to the middleware unsettled).  Subscriptions read by a pull
point's buffer (feeds) or routed at publish time have no delivery of their own and are
left alone.  A pull point core buffers (no native pull) is read by the instance holding
its shard (``core.pull_owners``): its buffer, feeds included, is started with the shard
and stopped when it goes (what it held goes back to the middleware unsettled).

Opening a delivery is a few middleware round trips (declare the durable subscription,
start its consumer).  ``gained`` therefore only queues the openings: :data:`OPEN_AT_ONCE`
opener threads do them, several at once, while the heartbeat thread (``core.cluster``)
goes on renewing the leases.  (On that thread, one after the other, the openings of a
few hundred subscriptions outlasted the lease: the instance then dropped every shard as
"not renewed in time", took them again and opened them again, for ever;
docs/scale-out.md, "Failover at scale".)  Closing a delivery is a round trip too (cancel
its consumer), so ``lost`` queues the closings to the same threads.  The fence does not
wait for them: the heartbeat forgets a lost shard before it calls ``lost``, and from then
on a delivery of that shard posts nothing (``_Pusher`` asks ``delivers`` before preparing
and before posting each batch) until it is closed or its shard is held again.

Each opening and each closing is made under the subscription's (or pull point's) lock
and looks at the shard again there: an opening only while this instance holds it, a
closing only while it does not.  A shard lost and taken again, its closing and its
opening run in either order, or at once on two threads: the delivery ends open once.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from wsnmom.core.context import BrokerContext
from wsnmom.core.coordination import shard_of
from wsnmom.core.pull_buffer import PullBuffer
from wsnmom.core.registry import LivePullPoint, LiveSubscription
from wsnmom.core.subscriptions import Subscriptions
from wsnmom.core.takeover_timing import TakeoverTiming, opening

__all__ = ["OPEN_AT_ONCE", "Ownership"]

log = logging.getLogger(__name__)

#: opener threads: deliveries of gained shards opened at once
OPEN_AT_ONCE = 8
#: seconds between two looks for held subscriptions without a delivery (``reconcile``)
RECONCILE_EVERY = 2.0


@dataclass(frozen=True, slots=True)
class _Close:
    """A delivery (or a pull point's buffer) of a lost shard, to be closed."""

    item: LiveSubscription | LivePullPoint


@dataclass(frozen=True, slots=True)
class _Taken:
    """A delivery of a gained shard, to be opened; ``taken``: when the shard was gained
    (monotonic; its first delivery is timed, ``core.takeover_timing``)."""

    item: LiveSubscription
    taken: float


_Work = LiveSubscription | LivePullPoint | _Close | _Taken


class Ownership:
    """Opens and closes deliveries as shards come and go (see the module docstring)."""

    def __init__(self, ctx: BrokerContext, subscriptions: Subscriptions) -> None:
        self._ctx = ctx
        self._subscriptions = subscriptions
        #: the instance is stopping: gained shards open nothing more
        self._closed = False
        #: openings and closings waiting for an opener thread (None: stop that thread)
        self._queue: queue.Queue[_Work | None] = queue.Queue()
        self._openers: list[threading.Thread] = []
        #: openings and closings queued or under way (``settled`` waits for none)
        self._pending = 0
        self._idle = threading.Condition()
        self._reconciled = float("-inf")

    def close(self) -> None:
        """The instance is stopping: queued openings are dropped and no further one is
        made (each is a middleware round trip, which a SIGTERM right after a rejoin
        waited for, subscription after subscription, while the middleware connection
        was being restored); the opener threads end."""
        self._closed = True
        for _ in self._openers:
            self._queue.put(None)

    def settled(self, timeout: float = 30.0) -> bool:
        """Wait until every queued opening and closing was made (or dropped); False on
        timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def _of(self, shards: set[int]) -> list[LiveSubscription]:
        """Live subscriptions of ``shards`` whose delivery is a channel of their own."""
        registry = self._ctx.registry
        count = self._ctx.settings.cluster.shards
        with registry.lock:
            return [
                s
                for s in registry.subscriptions.values()
                if s.feed is None and not s.direct and shard_of(s.record.id, count) in shards
            ]

    def _pull_points(self, shards: set[int]) -> list[LivePullPoint]:
        """Live pull points of ``shards`` read through core's pull buffer."""
        registry = self._ctx.registry
        count = self._ctx.settings.cluster.shards
        with registry.lock:
            return [
                p
                for p in registry.pull_points.values()
                if isinstance(p.reader, PullBuffer) and shard_of(p.record.id, count) in shards
            ]

    def gained(self, shards: set[int]) -> None:
        """This instance delivers ``shards`` now: their deliveries and pull point
        buffers are queued for the opener threads (see the module docstring)."""
        taken = time.monotonic()
        work: list[_Work] = [_Taken(s, taken) for s in self._of(shards)]
        work.extend(self._pull_points(shards))
        if self._closed or not work:
            return
        self._enqueue(work)

    def reconcile(self, shards: set[int]) -> None:
        """After every heartbeat, with the shards held: queue the opening of each of
        their subscriptions that has no delivery yet.  One is left without when it was
        looked at while the lease looked lapsed (``delivers`` said no), or while its
        shard was being gained: a subscription another instance made, followed (on the
        follow thread) just before the heartbeat thread's ``gained`` looked for the
        shard's subscriptions, or one made through this instance then, or an opening
        queued while the lease looked lapsed.  Nothing
        is queued while every one has its delivery (the usual case: a look-up in memory,
        at most every :data:`RECONCILE_EVERY` seconds: 60 ms at 100,000 subscriptions)."""
        now = time.monotonic()
        if self._closed or now < self._reconciled + RECONCILE_EVERY:
            return
        self._reconciled = now
        engine = self._ctx.engine
        missing = [s for s in self._of(shards) if engine.channel(s.record.id) is None]
        if missing:
            self._enqueue(missing)

    def _enqueue(self, work: Sequence[_Work]) -> None:
        with self._idle:
            self._pending += len(work)
        while len(self._openers) < min(OPEN_AT_ONCE, len(work) + len(self._openers)):
            opener = threading.Thread(target=self._run, name="wsnmom-open", daemon=True)
            self._openers.append(opener)
            opener.start()
        for item in work:
            self._queue.put(item)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            try:
                if self._closed:
                    pass  # the engine closes every delivery
                elif isinstance(item, _Close):
                    self._close(item.item)
                elif isinstance(item, LivePullPoint):
                    self._start_reading(item)
                elif isinstance(item, _Taken):
                    self._open(item.item, TakeoverTiming(item.taken))
                else:
                    self._open(item)
            except Exception:
                what = "closing" if isinstance(item, _Close) else "opening"
                record = item.item.record if isinstance(item, _Close | _Taken) else item.record
                log.exception("%s the delivery of %s failed", what, record.id)
            finally:
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()

    def _open(self, state: LiveSubscription, timing: TakeoverTiming | None = None) -> None:
        """Open one gained subscription's delivery (``attach`` opens it only while this
        instance holds its shard); ``timing``: a take-over's, handed to its channel."""
        ctx = self._ctx
        sub_id = state.record.id
        if timing is not None:
            timing.mark("opening")
        # under its lock, which a destroy holds throughout (one destroyed since the
        # look-up in ``gained`` is not opened again, its durable subscription made anew)
        # and ``lost`` too
        with state.lock:
            if ctx.registry.subscriptions.get(sub_id) is not state:
                return
            if ctx.engine.channel(sub_id) is not None or not ctx.delivers(sub_id):
                return
            with opening(timing):
                self._subscriptions.attach(state)
            if timing is not None:
                timing.mark("opened")

    def _start_reading(self, pull_point: LivePullPoint) -> None:
        """Start a gained pull point's buffer, unless its shard went meanwhile."""
        with pull_point.lock:  # not within a GetMessages
            if self._ctx.delivers(pull_point.record.id):
                pull_point.reader.start()

    def lost(self, shards: set[int]) -> None:
        """Another instance delivers ``shards`` (or may soon): their deliveries and pull
        point buffers are queued for closing (see the module docstring); they post
        nothing meanwhile."""
        work: list[_Work] = [_Close(s) for s in self._of(shards)]
        work.extend(_Close(p) for p in self._pull_points(shards))
        if self._closed or not work:
            return
        self._enqueue(work)

    def _close(self, item: LiveSubscription | LivePullPoint) -> None:
        """Close one lost delivery, unless its shard is held again (then it stays open,
        or is opened by the opening queued when the shard was gained)."""
        if isinstance(item, LivePullPoint):
            with item.lock:  # after a GetMessages under way settled its messages
                if not self._ctx.delivers(item.record.id):
                    item.reader.stop()
            return
        with item.lock:  # after an opening under way: it is closed here
            if not self._ctx.delivers(item.record.id):
                self._ctx.engine.close_channel(item.record.id)
