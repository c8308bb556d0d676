"""The lifetime sweep: destroys expired subscriptions, pull points and registrations, and
ends subscriptions whose backlog is full when the configured reaction is to end them
(``limits.on_full = "end"``).  Runs on a ``core.periodic.PeriodicTask`` every
``termination.sweep_interval`` and whenever something notices an expiry, on one instance
of a cluster only (the leader, ``core.cluster``); on every instance it first tries again
the ends of subscriptions it gave up on whose backlog the middleware did not take
(``Subscriptions.retry_ends``), and ends the full subscriptions it delivers (so that the
delivery stopped before their backlog goes to the dead letters is the one that runs).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from wsnmom.core import metrics
from wsnmom.core.adapter import AdapterError
from wsnmom.core.context import BrokerContext
from wsnmom.core.lifetimes import is_expired
from wsnmom.core.model import PublisherRegistration, PullPoint, Subscription
from wsnmom.core.pull_points import PullPoints
from wsnmom.core.registrations import Registrations
from wsnmom.core.registry import LivePullPoint, LiveRegistration, LiveSubscription
from wsnmom.core.store import Deposed
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

    def _depths(
        self, *, pull_points: bool = True
    ) -> tuple[list[LiveSubscription], list[int | None], list[LivePullPoint], list[int | None]]:
        """Every subscription with a handle and every pull point (none without
        ``pull_points``; then only the subscriptions this instance delivers), with their
        depths from one bulk ``Adapter.depths`` call."""
        ctx = self._ctx
        registry = ctx.registry
        with registry.lock:
            subs = [s for s in registry.subscriptions.values() if s.handle is not None]
            pps = list(registry.pull_points.values()) if pull_points else []
        if not pull_points:
            subs = [s for s in subs if ctx.delivers(s.record.id)]
        handles = [s.handle for s in subs if s.handle is not None] + [p.handle for p in pps]
        try:
            depths = self._ctx.adapter.depths(handles)
        except Exception:
            log.debug("reading depths failed", exc_info=True)
            depths = [None] * len(handles)
        return subs, depths[: len(subs)], pps, depths[len(subs) :]

    def _end_full(
        self, subs: list[LiveSubscription], depths: list[int | None]
    ) -> list[LiveSubscription]:
        """End the full subscriptions among ``subs`` that this instance delivers (with
        several instances on one store, each ends its own: its delivery is the one
        stopped before the backlog goes to the dead letters); those ended."""
        ending = [
            sub
            for sub in self.full_subscriptions(subs, depths)
            if self._ctx.delivers(sub.record.id)
            and self._subscriptions.end_full(sub, "accumulation limit reached")
        ]
        for _ in ending:
            metrics.SUBSCRIPTIONS_ENDED.labels(reason="overflow").inc()
        return ending

    def full_subscriptions(
        self, subs: list[LiveSubscription], depths: list[int | None]
    ) -> list[LiveSubscription]:
        """Subscriptions whose backlog reached ``limits.max_messages`` when the configured
        reaction is to end them (``limits.on_full = "end"``)."""
        lim = self._ctx.settings.limits
        if lim.on_full != "end" or lim.max_messages is None:
            return []
        bound = lim.max_messages
        return [s for s, d in zip(subs, depths, strict=True) if d is not None and d >= bound]

    def _renewed_in_store(
        self,
        live: LiveSubscription | LivePullPoint | LiveRegistration,
        read: Callable[[str], Subscription | PullPoint | PublisherRegistration | None],
    ) -> bool:
        """Whether the store has a termination time for an expired-looking subscription,
        pull point or registration that is not over (a Renew or SetTerminationTime
        through another instance this one has not followed yet, or written by an instance
        that does not bump revisions): then it is taken over here and the resource kept.
        Destroying is for what the store says."""
        ctx = self._ctx
        record = live.record
        kind = (
            "subscription"
            if isinstance(live, LiveSubscription)
            else "pull point"
            if isinstance(live, LivePullPoint)
            else "publisher registration"
        )
        try:
            stored = read(record.id)
        except Exception:
            log.warning("reading expired %s %s failed", kind, record.id, exc_info=True)
            return True  # the next sweep decides
        if stored is None or is_expired(stored.termination_time, ctx.now()):
            return False
        with ctx.registry.lock:
            record.termination_time = stored.termination_time
        log.info("%s %s was renewed in the store: kept", kind, record.id)
        return True

    def sweep(self) -> None:
        """Destroy every expired subscription, pull point and registration (with several
        instances on one store, only the leader sweeps; the others follow its deletes)."""
        ctx = self._ctx
        # on every instance: the ends of what it delivers and gave up on (core.subscriptions)
        self._subscriptions.retry_ends()
        epoch = ctx.leader_epoch() if ctx.leads() else None
        if epoch is None:
            if ctx.settings.limits.on_full == "end":
                own, depths, _, _ = self._depths(pull_points=False)
                self._end_full(own, depths)
            return
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
        try:
            self._limit(epoch)
            self._expire(subs, pps, regs, now, epoch)
        except Deposed:
            log.warning(
                "sweep: this instance no longer leads (epoch %d): the rest of this sweep is "
                "the new leader's",
                epoch,
            )

    def _limit(self, epoch: int) -> None:
        """The leader's part of the limits: end the full subscriptions it delivers, and
        (an adapter without native limits) drop each backlog's excess, each drop only
        while ``epoch`` is the leadership's (``Store.fence``).

        :raises core.store.Deposed: the epoch is not the leadership's any more"""
        ctx = self._ctx
        keeper = ctx.limit_keeper
        if ctx.settings.limits.on_full != "end" and keeper.native:
            return
        with_handles, depths, pull_points, pp_depths = self._depths()
        ending = self._end_full(with_handles, depths)
        if not keeper.native:
            ended = {s.record.id for s in ending}
            handles = [s.handle for s in with_handles if s.record.id not in ended]
            kept = [
                d for s, d in zip(with_handles, depths, strict=True) if s.record.id not in ended
            ]
            keeper.enforce_counts(
                [h for h in handles if h is not None] + [p.handle for p in pull_points],
                kept + pp_depths,
                fence=lambda: ctx.store.fence(epoch),
            )

    def _expire(
        self,
        subs: list[LiveSubscription],
        pps: list[LivePullPoint],
        regs: list[LiveRegistration],
        now: datetime,
        epoch: int,
    ) -> None:
        """Destroy the expired ones, as the leader of ``epoch``: each only while the
        store's record is still expired at ``now`` and the epoch the leadership's (in the
        delete's statement: a leader deposed while it swept, or a Renew through another
        instance since it looked, keeps it).

        :raises core.store.Deposed: the epoch is not the leadership's any more"""
        ctx = self._ctx
        for sub in subs:
            if self._renewed_in_store(sub, ctx.store.get_subscription):
                continue
            try:
                if self._subscriptions.expire(sub, now, epoch):
                    log.info("subscription %s expired", sub.record.id)
            except AdapterError:
                log.exception("destroying expired subscription %s failed", sub.record.id)
        for pp in pps:
            if self._renewed_in_store(pp, ctx.store.get_pull_point):
                continue
            try:
                if self._pull_points.expire(pp, now, epoch):
                    log.info("pull point %s expired", pp.record.id)
            except AdapterError:
                log.exception("destroying expired pull point %s failed", pp.record.id)
        for reg in regs:
            if self._renewed_in_store(reg, ctx.store.get_registration):
                continue
            try:
                if self._registrations.expire(reg, now, epoch):
                    log.info("publisher registration %s expired", reg.record.id)
            except Deposed:
                raise
            except Exception:
                log.exception("destroying expired registration %s failed", reg.record.id)
