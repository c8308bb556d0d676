"""The live resources of one broker and the lock that guards them.

Subscriptions, pull points and publisher registrations are loaded from the store at start
(``core.recovery``) and kept here while they live; the store stays the source of truth.
With a store other instances share, ``core.follow`` keeps them in line with it and
loads, on a lookup, what another instance made a moment ago (``loader``).
Each entry couples the stored record with what only a running broker has: compiled
filters, the adapter handle, the delivery mode.  Lookups that clients drive
(``live_subscription`` ...) treat an expired resource as unknown, since the lifetime sweep
may not have destroyed it yet.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

from wsnmom.core import errors, metrics
from wsnmom.core.adapter import SubscriptionHandle
from wsnmom.core.filters import CompiledFilter
from wsnmom.core.lifetimes import is_expired
from wsnmom.core.model import PublisherRegistration, PullPoint, Subscription
from wsnmom.core.pull_buffer import PullBuffer
from wsnmom.core.pull_reader import PullReader
from wsnmom.topic_mapping.model import Topic, TopicExpression

__all__ = ["LivePullPoint", "LiveRegistration", "LiveSubscription", "Registry"]


@dataclass(slots=True)
class LiveSubscription:
    """A subscription as the running broker holds it."""

    record: Subscription
    filter: CompiledFilter
    #: the SubscriptionEnd topic and dialect the subscriber asked for
    end_topic: tuple[Topic, str] | None = None
    #: the durable native subscription (None while routed at publish time)
    handle: SubscriptionHandle | None = None
    #: routed into its pull point when published (no durable subscription of its own)
    direct: bool = False
    #: its pull point's reader, which reads its durable subscription directly
    #: (``core.pull_feeds``)
    feed: PullBuffer | PullReader | None = None
    #: serialises the changes of this subscription (Pause, Resume, Renew, following the
    #: store, starting its delivery): held across their middleware calls and store
    #: writes, which the registry lock is not (taken after it, never before)
    lock: threading.RLock = field(default_factory=threading.RLock)


@dataclass(slots=True)
class LivePullPoint:
    """A pull point as the running broker holds it."""

    record: PullPoint
    handle: SubscriptionHandle
    #: what GetMessages takes from: ``handle`` (the inbox) and the feeds, through the
    #: middleware's pull (``PullReader``) or core's pull buffer when it has none
    reader: PullBuffer | PullReader
    #: serialises GetMessages on this pull point
    lock: threading.Lock = field(default_factory=threading.Lock)

    def stop(self) -> None:
        """Stop consuming (broker closing): buffered messages stay in the middleware."""
        self.reader.stop()


@dataclass(slots=True)
class LiveRegistration:
    """A publisher registration with its compiled topic expressions."""

    record: PublisherRegistration
    topics: tuple[TopicExpression, ...]


_V = TypeVar("_V", bound=LiveSubscription | LivePullPoint | LiveRegistration)


class OwnedMap(dict[str, _V], Generic[_V]):
    """A map of live resources that counts them per owner (``record.owner``) as entries
    come and go, for the per-identity quotas.  Reads are plain ``dict`` reads."""

    def __init__(self) -> None:
        super().__init__()
        self.owners: Counter[str | None] = Counter()

    def __setitem__(self, key: str, value: _V) -> None:
        old = super().get(key)
        if old is not None:
            self.owners[old.record.owner] -= 1
        super().__setitem__(key, value)
        self.owners[value.record.owner] += 1

    def __delitem__(self, key: str) -> None:
        old = super().__getitem__(key)
        super().__delitem__(key)
        self.owners[old.record.owner] -= 1

    def pop(self, key: str, *default: Any) -> Any:
        if key in self:
            old = super().pop(key)
            self.owners[old.record.owner] -= 1
            return old
        return super().pop(key, *default)

    def clear(self) -> None:
        super().clear()
        self.owners.clear()

    def owned_by(self, owner: str | None) -> int:
        """How many entries ``owner`` owns."""
        return self.owners.get(owner, 0)


class Registry:
    """Live subscriptions, pull points and registrations by id.

    ``lock`` (reentrant) guards the three maps and the state changes of their entries.
    Single reads of a map (``dict.get``) are atomic and may be done without it.  Each map
    counts its entries per owner (:class:`OwnedMap`).
    """

    def __init__(self, now: Callable[[], datetime]) -> None:
        self._now = now
        self.lock = threading.RLock()
        self.subscriptions: OwnedMap[LiveSubscription] = OwnedMap()
        self.pull_points: OwnedMap[LivePullPoint] = OwnedMap()
        self.registrations: OwnedMap[LiveRegistration] = OwnedMap()
        #: with a shared store: loads a resource this instance does not know yet
        #: (kind, id) from the store (``core.follow``); None: the maps are complete
        self.loader: Callable[[str, str], object] | None = None

    def _load(self, kind: str, resource_id: str) -> None:
        if self.loader is not None:
            self.loader(kind, resource_id)

    def live_subscription(self, subscription_id: str) -> LiveSubscription:
        """The subscription; ResourceUnknown when unknown or expired."""
        state = self.subscriptions.get(subscription_id)
        if state is None and self.loader is not None:
            self._load("subscription", subscription_id)
            state = self.subscriptions.get(subscription_id)
        if state is None or is_expired(state.record.termination_time, self._now()):
            raise errors.ResourceUnknown(f"no subscription {subscription_id!r}")
        return state

    def current_subscription(self, subscription_id: str) -> LiveSubscription:
        """The subscription as the store holds it now: with a shared store, read again
        first, so that an operation that depends on its state (Pause, Resume) sees what
        another instance wrote a moment ago, not what this one has followed so far (a
        Resume sent to one instance right after a Pause sent to another was taken for a
        no-op, and the subscription stayed paused).  ResourceUnknown as
        :meth:`live_subscription`."""
        if self.loader is not None:
            self._load("subscription", subscription_id)
        return self.live_subscription(subscription_id)

    def live_pull_point(self, pull_point_id: str) -> LivePullPoint:
        """The pull point; ResourceUnknown when unknown or expired."""
        state = self.pull_points.get(pull_point_id)
        if state is None and self.loader is not None:
            self._load("pull_point", pull_point_id)
            state = self.pull_points.get(pull_point_id)
        if state is None or is_expired(state.record.termination_time, self._now()):
            raise errors.ResourceUnknown(f"no pull point {pull_point_id!r}")
        return state

    def pull_point_gone(self, pull_point_id: str) -> bool:
        """Whether the pull point is gone from a shared store (destroyed through another
        instance): read again from the store, and forgotten here when it is.  False
        without a shared store (the maps are complete) or when it is still stored."""
        if self.loader is None:
            return False
        self._load("pull_point", pull_point_id)
        return pull_point_id not in self.pull_points

    def live_registration(self, registration_id: str) -> LiveRegistration:
        """The registration; ResourceUnknown when unknown or expired."""
        state = self.registrations.get(registration_id)
        if state is None and self.loader is not None:
            self._load("registration", registration_id)
            state = self.registrations.get(registration_id)
        if state is None or is_expired(state.record.termination_time, self._now()):
            raise errors.ResourceUnknown(f"no publisher registration {registration_id!r}")
        return state

    def handles(self) -> list[SubscriptionHandle]:
        """Every open adapter handle (subscriptions and pull points)."""
        with self.lock:
            out = [s.handle for s in self.subscriptions.values() if s.handle is not None]
            out += [p.handle for p in self.pull_points.values()]
        return out

    def buffered(self) -> int:
        """Messages held in core's pull buffers (push-only middleware)."""
        with self.lock:
            readers = [p.reader for p in self.pull_points.values()]
        return sum(r.buffered() for r in readers)

    def update_gauges(self) -> None:
        """Publish the resource counts to ``/metrics``."""
        metrics.SUBSCRIPTIONS.set(len(self.subscriptions))
        metrics.PULL_POINTS.set(len(self.pull_points))
        metrics.REGISTRATIONS.set(len(self.registrations))
