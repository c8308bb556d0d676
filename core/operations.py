"""What operators see of a running broker, and the one action WS-N has no operation for.

WS-N lets a client read its own resources; an operator needs all of them at once, with
what only the running gateway knows: how many messages wait for each subscription and pull
point (one bulk ``Adapter.depths`` call for all of them), each push subscription's delivery
state (failures, next retry, last error), message counts and rates per topic, and whether
the middleware answers.  :class:`Operations` assembles that as plain records; the admin
page and its JSON API (``soap_frontend.admin_api``) render them.  The overview's light
scan of every subscription, its totals and its choice of those needing attention most are
``core.overview_scan`` (whose :class:`SubscriptionTotals` this module re-exports).

Purge, an operator's action, lives with the resource kinds (``Subscriptions.purge``,
``PullPoints.purge``); pause, resume and unsubscribe are the WS-N operations themselves.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from wsnmom.core.adapter import SubscriptionHandle
from wsnmom.core.availability import middleware_reason, store_reason
from wsnmom.core.context import BrokerContext
from wsnmom.core.delivery import ChannelStatus
from wsnmom.core.delivery_policy import EffectivePolicy, effective
from wsnmom.core.disk import storage_full_text
from wsnmom.core.lifetimes import is_expired
from wsnmom.core.model import (
    ExpressionSource,
    PublisherRegistration,
    PullPoint,
    Subscription,
    SubscriptionState,
    shallow_copy,
)
from wsnmom.core.overview_scan import Found, SubscriptionTotals, needing_attention, scan, totals
from wsnmom.core.redaction import redact_url
from wsnmom.core.registry import LivePullPoint, LiveSubscription
from wsnmom.core.topic_stats import TopicCount

__all__ = [
    "AdapterHealth",
    "Operations",
    "Overview",
    "PullPointStatus",
    "RegistrationStatus",
    "SubscriptionRow",
    "SubscriptionStatus",
    "SubscriptionTotals",
]

log = logging.getLogger(__name__)


def _backlog(waiting: int | None, delivery: ChannelStatus | None) -> int | None:
    """Messages not yet delivered: ``waiting`` (None: unknown) plus those the delivery
    channel holds in memory."""
    if waiting is None:
        return None
    return waiting + (delivery.held if delivery is not None else 0)


@dataclass(frozen=True, slots=True)
class SubscriptionStatus:
    """One live subscription as operators see it."""

    record: Subscription
    address: str
    #: "push" (to its consumer), "pull point" (read by one of the broker's pull points
    #: from its own queue) or "routed" (routed into its pull point when published: no
    #: queue of its own)
    mode: str
    #: messages waiting in the middleware (not handed out); None: it cannot tell
    waiting: int | None
    #: the delivery channel's state; None for a routed subscription
    delivery: ChannelStatus | None
    #: the delivery policy its pushes follow (``core.delivery_policy``); None unless push
    delivery_policy: EffectivePolicy | None = None

    @property
    def backlog(self) -> int | None:
        """Messages not yet delivered (:func:`_backlog`)."""
        return _backlog(self.waiting, self.delivery)


@dataclass(frozen=True, slots=True)
class SubscriptionRow:
    """What searching and sorting the list of all live subscriptions look at, read for
    each of tens of thousands: a few fields of the record (no copy of it), its delivery
    state and backlog, not its address or delivery policy.  The page shown is then read
    as :class:`SubscriptionStatus` (``Operations.subscriptions(ids)``)."""

    id: str
    consumer: str
    topic: ExpressionSource | None
    paused: bool
    creation_time: datetime
    termination_time: datetime | None
    #: as in :class:`SubscriptionStatus` (``delivery`` None also when it was not read)
    waiting: int | None
    delivery: ChannelStatus | None

    @property
    def backlog(self) -> int | None:
        """Messages not yet delivered (:func:`_backlog`)."""
        return _backlog(self.waiting, self.delivery)


@dataclass(frozen=True, slots=True)
class PullPointStatus:
    """One live pull point as operators see it."""

    record: PullPoint
    address: str
    #: messages waiting for GetMessages; None: the middleware cannot tell
    waiting: int | None
    #: ids of the subscriptions feeding it
    feeding: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RegistrationStatus:
    """One live publisher registration."""

    record: PublisherRegistration
    address: str


@dataclass(frozen=True, slots=True)
class AdapterHealth:
    """Whether the broker can serve, and why not."""

    adapter: str
    #: the adapter URL without its password
    url: str
    #: "queue", "log" or "session"
    shape: str
    #: the adapter knows of no outage (no I/O)
    available: bool
    #: the middleware answered a ping just now
    answers: bool
    #: the broker restored its resources and serves WS-N requests
    started: bool
    #: ``started`` and the middleware and the store answer (``/readyz``)
    ready: bool
    #: bytes free on the data directory's tightest filesystem (None: not watched)
    disk_free: int | None = None
    #: why the disk refuses new work ("" when it does not): below storage.min_free, or a
    #: write just found it full
    disk_low: str = ""
    #: why the middleware does not answer, as the adapter says ("" when it answers or
    #: says nothing; ``Adapter.unavailable_reason``)
    reason: str = ""
    #: why the store does not answer ("" when it answers or says nothing)
    store_reason: str = ""


@dataclass(frozen=True, slots=True)
class Overview:
    """Everything the admin page shows, read at ``time`` (POSIX seconds)."""

    time: float
    health: AdapterHealth
    #: every live subscription oldest first, or with a ``limit`` those that need
    #: attention most (``Operations.overview``), oldest first
    subscriptions: list[SubscriptionStatus]
    #: counted over every live subscription, whatever ``subscriptions`` holds
    subscription_totals: SubscriptionTotals
    pull_points: list[PullPointStatus]
    registrations: list[RegistrationStatus]
    topics: list[TopicCount]
    #: topics forgotten to bound the table (``TopicStats.forgotten``)
    topics_forgotten: int


class Operations:
    """Reads the broker for operators (see the module docstring)."""

    def __init__(self, ctx: BrokerContext) -> None:
        self._ctx = ctx

    def health(self, *, ping_timeout: float = 1.0) -> AdapterHealth:
        """The adapter's and the broker's state now (one ping of the middleware)."""
        ctx = self._ctx
        adapter = ctx.adapter
        try:
            available = bool(adapter.available())
        except Exception:
            available = False
        try:
            answers = available and bool(adapter.ping(ping_timeout))
        except Exception:
            answers = False
        try:
            store = bool(ctx.store.ping())
        except Exception:
            store = False
        started = ctx.gate.ready
        disk = ctx.gate.disk.state() if ctx.gate.disk is not None else None
        low = storage_full_text(disk) if disk is not None and disk.low else ""
        return AdapterHealth(
            adapter=adapter.name,
            url=redact_url(adapter.url),
            shape=adapter.capabilities.shape,
            available=available,
            answers=answers,
            started=started,
            ready=started and answers and store and not low,
            disk_free=disk.free if disk is not None else None,
            disk_low=low,
            reason="" if answers else middleware_reason(adapter),
            store_reason="" if store else store_reason(ctx.store),
        )

    def subscriptions(
        self, ids: Sequence[str] | None = None, *, depths: bool = True
    ) -> list[SubscriptionStatus]:
        """Every live subscription with its state, oldest first (one ``depths`` call), or
        those of ``ids`` that are live, in that order.  Without ``depths`` the middleware
        is not asked: ``waiting`` is None (unknown) for each one with a queue of its own,
        which makes listing tens of thousands cheap enough to search and sort them (the
        admin API then reads the depths of the one page it shows)."""
        ctx = self._ctx
        registry = ctx.registry
        now = ctx.now()
        with registry.lock:
            if ids is None:
                found = list(registry.subscriptions.values())
            else:
                found = [s for i in ids if (s := registry.subscriptions.get(i)) is not None]
            subs = [s for s in found if not is_expired(s.record.termination_time, now)]
            records = {s.record.id: shallow_copy(s.record) for s in subs}
        handles = [s.handle for s in subs if s.handle is not None] if depths else []
        read = dict(zip((id(h) for h in handles), self._depths(handles), strict=True))
        out = [self._subscription(s, records[s.record.id], read) for s in subs]
        if ids is None:
            out.sort(key=lambda s: (s.record.creation_time, s.record.id))
        return out

    def subscription_rows(
        self, *, depths: bool = False, delivery: bool = True
    ) -> list[SubscriptionRow]:
        """Every live subscription as a :class:`SubscriptionRow`, in no order; ``waiting``
        is None (unknown) for those with a queue of their own unless ``depths`` (then one
        ``depths`` call for all), ``delivery`` None for all unless ``delivery`` (a
        channel's status is most of a row's cost).  A fraction of the cost of
        :meth:`subscriptions` per subscription: the admin API searches, sorts and pages
        these, then reads the statuses of the one page it shows."""
        ctx = self._ctx
        registry = ctx.registry
        now = ctx.now()
        paused = SubscriptionState.PAUSED
        with registry.lock:
            found = []
            for s in registry.subscriptions.values():
                r = s.record
                if not is_expired(r.termination_time, now):
                    found.append(
                        (
                            s.handle,
                            r.id,
                            r.consumer.address,
                            r.topic,
                            r.state is paused,
                            r.creation_time,
                            r.termination_time,
                        )
                    )
        handles = [f[0] for f in found if f[0] is not None] if depths else []
        read = dict(zip((id(h) for h in handles), self._depths(handles), strict=True))
        channel = ctx.engine.channel
        rows = []
        for handle, sub_id, consumer, topic, is_paused, created, terminates in found:
            status = None
            if delivery and handle is not None:
                open_channel = channel(sub_id)
                status = open_channel.status() if open_channel is not None else None
            waiting = 0 if handle is None else read.get(id(handle))
            rows.append(
                SubscriptionRow(
                    sub_id, consumer, topic, is_paused, created, terminates, waiting, status
                )
            )
        return rows

    def overview(self, limit: int | None = None) -> Overview:
        """Every live resource with its state, the topics and the health: the depths of
        all subscriptions and pull points come from one ``Adapter.depths`` call.  With a
        ``limit``, only the ``limit`` subscriptions that need attention most (failing
        first, then the largest backlogs, then the oldest) are read in full, shown oldest
        first; the totals count every one from a light scan of each (a few fields, its
        depth, its channel's failures and held messages; F31): what lets the admin page
        poll this every few seconds with 100,000 subscriptions.  The statuses shown are
        read after the scan (their delivery state a moment younger than the totals')."""
        ctx = self._ctx
        registry = ctx.registry
        now = ctx.now()
        paused = SubscriptionState.PAUSED
        with registry.lock:
            found = [
                Found(s, r.id, r.state is paused, r.creation_time, r.pull_point_id)
                for s in registry.subscriptions.values()
                if not is_expired((r := s.record).termination_time, now)
            ]
            pps = [
                p
                for p in registry.pull_points.values()
                if not is_expired(p.record.termination_time, now)
            ]
            regs = [
                replace(r.record)
                for r in registry.registrations.values()
                if not is_expired(r.record.termination_time, now)
            ]
        handles: list[SubscriptionHandle] = [
            f.state.handle for f in found if f.state.handle is not None
        ]
        handles += [p.handle for p in pps]
        depths = dict(zip((id(h) for h in handles), self._depths(handles), strict=True))
        seen = scan(found, depths, ctx.engine.channel)
        chosen = needing_attention(seen, limit)
        with registry.lock:
            records = [shallow_copy(c.found.state.record) for c in chosen]
        sub_status = [
            self._subscription(c.found.state, record, depths)
            for c, record in zip(chosen, records, strict=True)
        ]
        feeding: dict[str, list[str]] = {}
        for f in found:
            if f.pull_point_id is not None:
                feeding.setdefault(f.pull_point_id, []).append(f.id)
        pp_status = [self._pull_point(p, depths, feeding.get(p.record.id, [])) for p in pps]
        pp_status.sort(key=lambda p: (p.record.creation_time, p.record.id))
        regs.sort(key=lambda r: (r.creation_time, r.id))
        return Overview(
            time=time.time(),
            health=self.health(),
            subscriptions=sub_status,
            subscription_totals=totals(seen),
            pull_points=pp_status,
            registrations=[RegistrationStatus(r, ctx.registration_address(r.id)) for r in regs],
            topics=ctx.topic_stats.snapshot(),
            topics_forgotten=ctx.topic_stats.forgotten,
        )

    def subscription(self, subscription_id: str) -> SubscriptionStatus:
        """One live subscription's state; ResourceUnknown when unknown or expired."""
        ctx = self._ctx
        state = ctx.registry.live_subscription(subscription_id)
        with ctx.registry.lock:
            record = replace(state.record)
        handles = [state.handle] if state.handle is not None else []
        depths = dict(zip((id(h) for h in handles), self._depths(handles), strict=True))
        return self._subscription(state, record, depths)

    def _depths(self, handles: Sequence[SubscriptionHandle]) -> list[int | None]:
        if not handles:
            return []
        try:
            return self._ctx.adapter.depths(handles)
        except Exception:
            log.debug("reading the depths failed", exc_info=True)
            return [None] * len(handles)

    def _subscription(
        self, state: LiveSubscription, record: Subscription, depths: dict[int, int | None]
    ) -> SubscriptionStatus:
        ctx = self._ctx
        channel = ctx.engine.channel(record.id) if state.handle is not None else None
        waiting: int | None = 0
        if state.handle is None:
            mode = "routed"
        else:
            mode = "push" if record.pull_point_id is None else "pull point"
            waiting = depths.get(id(state.handle))
        return SubscriptionStatus(
            record=record,
            address=ctx.subscription_address(record.id),
            mode=mode,
            waiting=waiting,
            delivery=channel.status() if channel is not None else None,
            delivery_policy=(
                effective(record.delivery_policy, ctx.settings.retry, ctx.settings.delivery)
                if record.pull_point_id is None
                else None
            ),
        )

    def _pull_point(
        self, state: LivePullPoint, depths: dict[int, int | None], feeding: list[str]
    ) -> PullPointStatus:
        waiting = depths.get(id(state.handle))
        if waiting is not None:
            waiting += state.reader.buffered()
        return PullPointStatus(
            record=replace(state.record),
            address=self._ctx.pull_point_address(state.record.id),
            waiting=waiting,
            feeding=tuple(sorted(feeding)),
        )
