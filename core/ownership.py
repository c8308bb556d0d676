"""What this instance does when it gains or loses shards (``core.cluster``): open the
delivery of the gained shards' push subscriptions, close the lost ones' (what a closed
delivery held goes back to the middleware unsettled).  Subscriptions read by a pull
point's buffer (feeds) or routed at publish time have no delivery of their own and are
left alone.  A pull point core buffers (no native pull) is read by the instance holding
its shard (``core.pull_owners``): its buffer, feeds included, is started with the shard
and stopped when it goes (what it held goes back to the middleware unsettled)."""

from __future__ import annotations

import logging

from wsnmom.core.context import BrokerContext
from wsnmom.core.coordination import shard_of
from wsnmom.core.pull_buffer import PullBuffer
from wsnmom.core.registry import LivePullPoint, LiveSubscription
from wsnmom.core.subscriptions import Subscriptions

__all__ = ["Ownership"]

log = logging.getLogger(__name__)


class Ownership:
    """Opens and closes deliveries as shards come and go (see the module docstring)."""

    def __init__(self, ctx: BrokerContext, subscriptions: Subscriptions) -> None:
        self._ctx = ctx
        self._subscriptions = subscriptions
        #: the instance is stopping: gained shards open nothing more
        self._closed = False

    def close(self) -> None:
        """The instance is stopping: a ``gained`` under way opens no further delivery
        (each open is a middleware round trip, which a SIGTERM right after a rejoin
        waited for, subscription after subscription, while the middleware connection
        was being restored) and pull point buffers are not started."""
        self._closed = True

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
        """This instance delivers ``shards`` now."""
        ctx = self._ctx
        for state in self._of(shards):
            if self._closed:
                return
            sub_id = state.record.id
            # under its lock, which a destroy holds throughout: one destroyed since the
            # look-up above is not opened again (its durable subscription made anew)
            with state.lock:
                if ctx.registry.subscriptions.get(sub_id) is not state:
                    continue
                if ctx.engine.channel(sub_id) is not None:
                    continue
                try:
                    self._subscriptions.attach(state)
                except Exception:
                    log.exception("opening the delivery of %s failed", sub_id)
        for pull_point in self._pull_points(shards):
            if self._closed:
                return
            try:
                with pull_point.lock:  # not within a GetMessages
                    pull_point.reader.start()
            except Exception:
                log.exception("starting to read pull point %s failed", pull_point.record.id)

    def lost(self, shards: set[int]) -> None:
        """Another instance delivers ``shards`` (or may soon)."""
        for state in self._of(shards):
            self._ctx.engine.close_channel(state.record.id)
        for pull_point in self._pull_points(shards):
            try:
                with pull_point.lock:  # after a GetMessages under way settled its messages
                    pull_point.reader.stop()
            except Exception:
                log.exception("stopping pull point %s failed", pull_point.record.id)
