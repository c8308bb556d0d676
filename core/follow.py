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
  starts it.  Only a stored revision higher than the one held here is applied
  (``Subscription.revision``, bumped by every write): a change read from the store just
  before this instance wrote a newer one itself is not applied over it.  At an equal
  revision a stored state or termination time that differs from the one held is applied
  too: the store is right when a write of this instance failed after it had changed its
  record, and when an instance of a release without revisions wrote the change.

Nothing is written back: following is idempotent, so a change applied twice does no harm.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from wsnmom.core import errors
from wsnmom.core.adapter import AdapterError
from wsnmom.core.context import BrokerContext
from wsnmom.core.coordination import Change
from wsnmom.core.lifetimes import is_expired
from wsnmom.core.model import Subscription, SubscriptionState
from wsnmom.core.pull_points import PullPoints
from wsnmom.core.registrations import Registrations
from wsnmom.core.registry import LivePullPoint, LiveRegistration, LiveSubscription
from wsnmom.core.subscriptions import Subscriptions

__all__ = ["Follower"]

log = logging.getLogger(__name__)


def _newer(stored: Subscription, held: Subscription) -> bool:
    """Whether the stored record is to be applied over the one held here: a higher
    revision, or an equal one with another state or termination time (a write that failed
    after the record held here changed; a writer that does not bump revisions).  The race
    the revision settles always shows a lower stored revision."""
    if stored.revision != held.revision:
        return stored.revision > held.revision
    return (stored.state, stored.termination_time) != (held.state, held.termination_time)


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

    def apply(self, changes: Iterable[Change]) -> None:
        """Follow each change; one that fails is logged and the others still apply."""
        for change in changes:
            try:
                self.load(change.kind, change.id)
            except Exception:
                log.warning("following %s %s failed", change.kind, change.id, exc_info=True)

    def load(self, kind: str, resource_id: str) -> Live | None:
        """Bring the resource in line with the store; the live entry (None: gone)."""
        with self._lock:
            if kind == "subscription":
                return self.subscription(resource_id)
            if kind == "pull_point":
                return self.pull_point(resource_id)
            if kind == "registration":
                return self.registration(resource_id)
        return None

    # -- subscriptions ---------------------------------------------------------------------
    def subscription(self, sub_id: str) -> LiveSubscription | None:
        ctx = self._ctx
        stored = ctx.store.get_subscription(sub_id)
        live = ctx.registry.subscriptions.get(sub_id)
        if stored is None or is_expired(stored.termination_time, ctx.now()):
            if live is not None and stored is None:
                self._forget_subscription(live)
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
                end_topic = subs.end_topic(stored.subscription_end_topic)
            except errors.WsnError as exc:
                log.warning("subscription %s cannot be followed: %s", sub_id, exc.description)
                return None
            state = LiveSubscription(stored, compiled, end_topic)
            subs.attach(state)
            ctx.registry.update_gauges()
            ctx.wake_demand()
            log.debug("subscription %s made through another instance followed", sub_id)
            return state
        with ctx.registry.lock:
            # under the lock that Pause, Resume and Renew write under: a record this
            # instance wrote after ``stored`` was read (an own Resume a moment after the
            # Pause being followed) has the higher revision and is kept
            record = live.record
            if not _newer(stored, record):
                return live
            changed = stored.state is not record.state
            if changed:
                # first: when stopping or starting fails, nothing is recorded, and the
                # next change or request applies the stored record again
                self._follow_state(live, stored.state)
            record.revision = stored.revision
            record.termination_time = stored.termination_time
        if changed:
            if live.feed is not None:
                self._subscriptions.delivery.feeds.sync(live, here=False)
            ctx.wake_demand()
        return live

    def _follow_state(self, live: LiveSubscription, state: SubscriptionState) -> None:
        """Under the registry lock: another instance paused or resumed the subscription,
        stop or start here."""
        ctx = self._ctx
        record = live.record
        before = record.state
        record.state = state
        channel = ctx.engine.channel(record.id)
        try:
            if state is SubscriptionState.PAUSED:
                if channel is not None:
                    channel.stop()
            elif channel is not None:
                channel.start()
            elif live.feed is None and not live.direct:
                self._subscriptions.attach(live)
        except BaseException:
            record.state = before  # not followed: what this instance does
            raise

    def _forget_subscription(self, live: LiveSubscription) -> None:
        """Another instance destroyed it (and its durable subscription): stop here."""
        ctx = self._ctx
        sub_id = live.record.id
        with ctx.registry.lock:
            ctx.registry.subscriptions.pop(sub_id, None)
            self._subscriptions.delivery.direct.drop(live)
        ctx.engine.close_channel(sub_id)
        try:
            self._subscriptions.delivery.feeds.detach(live, here=False)
        except AdapterError:
            log.debug("detaching the feed of %s failed", sub_id, exc_info=True)
        ctx.registry.update_gauges()
        ctx.wake_demand()

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
                    self._forget_subscription(sub)
                live.stop()
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
        try:
            topics = self._registrations.compile_topics(stored.topics)
        except errors.WsnError as exc:
            log.warning("registration %s cannot be followed: %s", reg_id, exc.description)
            return None
        live = LiveRegistration(stored, topics)
        with registry.lock:
            registry.registrations[reg_id] = live
        registry.update_gauges()
        ctx.wake_demand()
        return live
