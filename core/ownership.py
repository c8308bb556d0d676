"""What this instance does when it gains or loses shards (``core.cluster``): open the
delivery of the gained shards' push subscriptions, close the lost ones' (what a closed
delivery held goes back to the middleware unsettled).  Subscriptions read by a pull
point's buffer (feeds) or routed at publish time have no delivery of their own and are
left alone."""

from __future__ import annotations

import logging

from wsnmom.core.context import BrokerContext
from wsnmom.core.coordination import shard_of
from wsnmom.core.registry import LiveSubscription
from wsnmom.core.subscriptions import Subscriptions

__all__ = ["Ownership"]

log = logging.getLogger(__name__)


class Ownership:
    """Opens and closes deliveries as shards come and go (see the module docstring)."""

    def __init__(self, ctx: BrokerContext, subscriptions: Subscriptions) -> None:
        self._ctx = ctx
        self._subscriptions = subscriptions

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

    def gained(self, shards: set[int]) -> None:
        """This instance delivers ``shards`` now."""
        ctx = self._ctx
        for state in self._of(shards):
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

    def lost(self, shards: set[int]) -> None:
        """Another instance delivers ``shards`` (or may soon)."""
        for state in self._of(shards):
            self._ctx.engine.close_channel(state.record.id)
