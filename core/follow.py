"""Following the store: resources another instance created, changed or destroyed take
effect in this instance's registry (docs/scale-out.md).

The cluster member (``core.cluster``) hands it the changes other instances wrote
(``core.coordination``); the registry asks it for a resource it does not know when a
request names one (made through another instance a moment ago).  Each resource is read
again from the store and the live entry brought in line with it:

* gone from the store: forgotten here (delivery stopped, a feed's messages kept in its
  pull point); the instance that destroyed it removed its durable subscription;
* new: loaded as at start-up (``core.recovery``), its delivery opened where this
  instance delivers it (``BrokerContext.delivers``);
* changed: a new termination time is taken over; a pause stops delivery here, a resume
  starts it (``Subscriptions.adopt``).  Only a stored revision higher than the one held
  here is applied (``Subscription.revision``, bumped by every write): a change read from
  the store just before this instance wrote a newer one itself is not applied over it.
  At an equal revision a stored state or termination time that differs from the one held
  is applied too: the store is right when a write of this instance failed after it had
  changed its record, and when an instance of a release without revisions wrote the
  change.  A registration's record is updated in place (the demand manager may be
  holding it), its publisher subscription taken over except on the leader, which alone
  writes it (``core.demand``).

A topic another instance admitted to its topic set (``core.topic_share``) is taken into
this one's.

Nothing is written back: following is idempotent, so a change applied twice does no harm.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from wsnmom.core import errors
from wsnmom.core.context import BrokerContext
from wsnmom.core.coordination import Change
from wsnmom.core.lifetimes import is_expired
from wsnmom.core.model import PublisherRegistration
from wsnmom.core.pull_points import PullPoints
from wsnmom.core.registrations import Registrations
from wsnmom.core.registry import LivePullPoint, LiveRegistration, LiveSubscription
from wsnmom.core.store_documents import topic_from_key
from wsnmom.core.subscriptions import Subscriptions

__all__ = ["Follower"]

log = logging.getLogger(__name__)


Live = LiveSubscription | LivePullPoint | LiveRegistration


class Follower:
    """Brings live resources in line with the store (see the module docstring)."""

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
        #: one resource is followed at a time (the member's thread and request threads)
        self._lock = threading.RLock()

    def apply(self, changes: Iterable[Change]) -> list[Change]:
        """Follow each change; one that fails is logged and the others still apply.
        Returns those that failed (the caller follows them again later)."""
        failed = []
        for change in changes:
            try:
                self.load(change.kind, change.id)
            except Exception:
                log.warning("following %s %s failed", change.kind, change.id, exc_info=True)
                failed.append(change)
        return failed

    def load(self, kind: str, resource_id: str) -> Live | None:
        """Bring the resource in line with the store; the live entry (None: gone)."""
        with self._lock:
            if kind == "subscription":
                return self.subscription(resource_id)
            if kind == "pull_point":
                return self.pull_point(resource_id)
            if kind == "registration":
                return self.registration(resource_id)
            if kind == "topic":  # another instance admitted it (``core.topic_share``)
                self._ctx.topic_set.take_in([topic_from_key(resource_id)])
        return None

    # -- subscriptions ---------------------------------------------------------------------
    def subscription(self, sub_id: str) -> LiveSubscription | None:
        ctx = self._ctx
        # the registry before the store: a destroy here empties them the other way round
        # (``Subscriptions.destroy``), so a subscription being destroyed is never found
        # in the store but not in the registry (and loaded again)
        live = ctx.registry.subscriptions.get(sub_id)
        stored = ctx.store.get_subscription(sub_id)
        if stored is None or is_expired(stored.termination_time, ctx.now()):
            if live is not None and stored is None:
                self._subscriptions.forget(live)
            return None
        if live is None:
            if (
                stored.pull_point_id is not None
                and stored.pull_point_id not in ctx.registry.pull_points
                and self.pull_point(stored.pull_point_id) is None
            ):
                return None
            subs = self._subscriptions
            try:
                compiled = subs.compile_filter(
                    stored.topic, stored.message_content, stored.producer_properties
                )
                end_topic = subs.end_topic(stored.subscription_end_topic, accepted=True)
            except errors.WsnError as exc:
                log.warning("subscription %s cannot be followed: %s", sub_id, exc.description)
                return None
            state = LiveSubscription(stored, compiled, end_topic)
            # the instance that made it declares it (before it answers the Subscribe)
            subs.attach(state, origin="elsewhere")
            ctx.registry.update_gauges()
            ctx.wake_demand()
            log.debug("subscription %s made through another instance followed", sub_id)
            return state
        self._subscriptions.adopt(live, stored)
        return live

    # -- pull points -----------------------------------------------------------------------
    def pull_point(self, pp_id: str) -> LivePullPoint | None:
        ctx = self._ctx
        registry = ctx.registry
        stored = ctx.store.get_pull_point(pp_id)
        live = registry.pull_points.get(pp_id)
        if stored is None:
            if live is not None:
                with registry.lock:
                    registry.pull_points.pop(pp_id, None)
                    feeding = [
                        s
                        for s in registry.subscriptions.values()
                        if s.record.pull_point_id == pp_id
                    ]
                for sub in feeding:
                    self._subscriptions.forget(sub)
                live.stop()
                ctx.forget_native(pp_id)
                registry.update_gauges()
            return None
        if live is None:
            if is_expired(stored.termination_time, ctx.now()):
                return None
            live = self._pull_points.live(stored, self._pull_points.open_handle(pp_id))
            with registry.lock:
                registry.pull_points[pp_id] = live
            registry.update_gauges()
            return live
        live.record.termination_time = stored.termination_time
        return live

    # -- registrations ---------------------------------------------------------------------
    def registration(self, reg_id: str) -> LiveRegistration | None:
        ctx = self._ctx
        registry = ctx.registry
        stored = ctx.store.get_registration(reg_id)
        if stored is None:
            with registry.lock:
                gone = registry.registrations.pop(reg_id, None)
            if gone is not None:
                registry.update_gauges()
                ctx.wake_demand()
            return None
        live = registry.registrations.get(reg_id)
        if live is not None:
            self._take_over(live, stored)
            return live
        try:
            topics = self._registrations.compile_topics(stored.topics, accepted=True)
        except errors.WsnError as exc:
            log.warning("registration %s cannot be followed: %s", reg_id, exc.description)
            return None
        live = LiveRegistration(stored, topics)
        with registry.lock:
            registry.registrations[reg_id] = live
        registry.update_gauges()
        ctx.wake_demand()
        return live

    def _take_over(self, live: LiveRegistration, stored: PublisherRegistration) -> None:
        """Bring a known registration's record in line with the store, in place: the
        demand manager may hold it in a call to the publisher, and what it learns there
        (a new publisher subscription) must land in the record the registry holds.  The
        leader keeps its own publisher subscription: it alone writes it, and it may have
        one it has not saved yet (its Subscribe's answer in hand)."""
        ctx = self._ctx
        with ctx.registry.lock:
            live.record.termination_time = stored.termination_time
            if not ctx.leads():
                live.record.demand_subscription = stored.demand_subscription
                live.record.demand_paused = stored.demand_paused
