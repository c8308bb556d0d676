"""The lifetime sweep: destroys expired subscriptions, pull points and registrations, and
ends subscriptions whose backlog is full when the configured reaction is to end them
(``limits.on_full = "end"``).  Runs on a ``core.periodic.PeriodicTask`` every
``termination.sweep_interval`` and whenever something notices an expiry.
"""

from __future__ import annotations

import logging

from wsnmom.core import errors, metrics
from wsnmom.core.adapter import AdapterError
from wsnmom.core.context import BrokerContext
from wsnmom.core.lifetimes import is_expired
from wsnmom.core.pull_points import PullPoints
from wsnmom.core.registrations import Registrations
from wsnmom.core.registry import LiveSubscription
from wsnmom.core.subscriptions import Subscriptions

__all__ = ["Sweeper"]

log = logging.getLogger(__name__)


class Sweeper:
    """One sweep over the live resources (see the module docstring)."""

    def __init__(
        self,
        ctx: BrokerContext,
        subscriptions: Subscriptions,
        pull_points: PullPoints,
        registrations: Registrations,
    ) -> None:
        self._ctx = ctx
        self._subscriptions = subscriptions
        self._pull_points = pull_points
        self._registrations = registrations

    def full_subscriptions(self) -> list[LiveSubscription]:
        """Subscriptions whose backlog reached ``limits.max_messages`` when the configured
        reaction is to end them (``limits.on_full = "end"``)."""
        lim = self._ctx.settings.limits
        if lim.on_full != "end" or lim.max_messages is None:
            return []
        registry = self._ctx.registry
        with registry.lock:
            states = list(registry.subscriptions.values())
        full: list[LiveSubscription] = []
        for state in states:
            if state.handle is None:
                continue
            try:
                depth = state.handle.depth()
            except Exception:
                continue
            if depth is not None and depth >= lim.max_messages:
                full.append(state)
        return full

    def sweep(self) -> None:
        """Destroy every expired subscription, pull point and registration."""
        ctx = self._ctx
        registry = ctx.registry
        now = ctx.now()
        with registry.lock:
            subs = [
                s
                for s in registry.subscriptions.values()
                if is_expired(s.record.termination_time, now)
            ]
            pps = [
                p
                for p in registry.pull_points.values()
                if is_expired(p.record.termination_time, now)
            ]
            regs = [
                r
                for r in registry.registrations.values()
                if is_expired(r.record.termination_time, now)
            ]
        for sub in self.full_subscriptions():
            metrics.SUBSCRIPTIONS_ENDED.labels(reason="overflow").inc()
            self._subscriptions.finish(sub, "accumulation limit reached")
        for sub in subs:
            log.info("subscription %s expired", sub.record.id)
            try:
                self._subscriptions.destroy(sub)
            except AdapterError:
                log.exception("destroying expired subscription %s failed", sub.record.id)
        for pp in pps:
            log.info("pull point %s expired", pp.record.id)
            try:
                self._pull_points.remove(pp)
            except AdapterError:
                log.exception("destroying expired pull point %s failed", pp.record.id)
        for reg in regs:
            log.info("publisher registration %s expired", reg.record.id)
            try:
                self._registrations.remove(reg)
            except errors.WsnError:
                log.exception("destroying expired registration %s failed", reg.record.id)
