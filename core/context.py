"""``BrokerContext``: what the parts of the broker share.

``core.service.BrokerService`` builds one context and hands it to each part (subscription
lifecycle, inbound notifications, pull points, registrations, recovery, sweep).  It holds
the collaborators (settings, adapter, store, outbound SOAP port and address policy, topic
set, delivery engine, observers, MessageContent evaluator), the live-resource registry,
the clock, the resource addresses, and the two wake-ups parts use to ask for background
work (lifetime sweep, demand reconciliation).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from wsnmom.core import errors
from wsnmom.core.adapter import Adapter, Overflow, QueueLimits
from wsnmom.core.addresses import ResourceKind, broker_address, resource_address
from wsnmom.core.availability import MiddlewareGate, data_paths
from wsnmom.core.config import FilterSettings, Settings
from wsnmom.core.coordination import SINGLE_EPOCH, instance_id
from wsnmom.core.dead_letters import DeadLetters
from wsnmom.core.delivery import DeliveryEngine
from wsnmom.core.disk import DiskWatch
from wsnmom.core.filter_sandbox import ContentEvaluator, InlineEvaluator, SandboxEvaluator
from wsnmom.core.guard import Guard
from wsnmom.core.lifetimes import resolve_termination
from wsnmom.core.limits import LimitKeeper
from wsnmom.core.loops import LoopGuard, new_gateway_id
from wsnmom.core.model import INFINITE, RequestedTime
from wsnmom.core.observers import Observers
from wsnmom.core.outbound_policy import OutboundPolicy
from wsnmom.core.ports import OutboundSoap
from wsnmom.core.registry import Registry
from wsnmom.core.store import Store
from wsnmom.core.topic_stats import TopicStats
from wsnmom.core.tracing import Tracing, load_tracing
from wsnmom.core.xpath_guard import FilterRules
from wsnmom.topic_mapping.dialects import CONCRETE
from wsnmom.topic_mapping.topic_set import TopicSet

__all__ = ["BrokerContext"]

_log = logging.getLogger("wsnmom.core.service")

_ALMOST_FOREVER = datetime(9999, 12, 31, 23, 59, 59)


def _normalise_requested(value: RequestedTime) -> RequestedTime:
    """The frontend may pass ``datetime.max`` (UTC) for ``xsi:nil``: treat as INFINITE."""
    if isinstance(value, datetime) and value.replace(tzinfo=None) >= _ALMOST_FOREVER:
        return INFINITE
    return value


def _nothing() -> None:
    return None


def _always(_: str) -> bool:
    return True


def _yes() -> bool:
    return True


def _single_epoch() -> int | None:
    return SINGLE_EPOCH


def _content_evaluator(f: FilterSettings) -> ContentEvaluator:
    """What evaluates MessageContent filters under ``[filters]``: inline, or in the sandbox
    processes with their budgets."""
    if f.isolation == "inline":
        return InlineEvaluator()
    return SandboxEvaluator(
        cpu_limit=f.cpu_limit,
        memory_mb=f.memory,
        processes=f.processes,
        cpu_share=f.cpu_share,
        costly_share=f.costly_share,
        over_share_end=f.over_share_end,
        costly_nice=f.costly_nice,
    )


class BrokerContext:
    """Shared collaborators and helpers of one broker (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        adapter: Adapter,
        store: Store,
        outbound: OutboundSoap,
        topic_set: TopicSet,
        engine: DeliveryEngine,
        observers: Observers,
        clock: Callable[[], datetime],
        policy: OutboundPolicy,
    ) -> None:
        self.settings = settings
        self.adapter = adapter
        self.store = store
        self.outbound = outbound
        self.topic_set = topic_set
        self.engine = engine
        self.observers = observers
        #: which consumer and publisher addresses may be called (the one outbound policy)
        self.policy = policy
        self._clock = clock
        self.registry = Registry(self.now)
        #: messages and rates per topic, for operators
        self.topic_stats = TopicStats()
        #: limits the middleware leaves to core
        self.limit_keeper = LimitKeeper(adapter, self.limits())
        #: fails operations fast while the broker cannot serve them
        self.gate = MiddlewareGate(
            adapter,
            grace=settings.middleware.grace,
            retry_after=settings.middleware.retry_after,
            disk=DiskWatch(data_paths(settings, adapter, store), settings.storage.min_free),
        )
        #: this gateway's id in hop markers; drops notifications that looped
        self.loop_guard = LoopGuard(
            settings.loops.gateway_id or new_gateway_id(), settings.loops.max_hops
        )
        f = settings.filters
        #: what MessageContent filters may use
        self.filter_rules = FilterRules(
            exslt_regex=f.exslt_regex,
            max_expression_length=f.max_expression_length,
            max_nesting=f.max_nesting,
        )
        #: evaluates MessageContent filters (off the request threads, within budgets)
        self.content_evaluator = _content_evaluator(f)
        #: ownership, topic ACL and quota checks of the caller (``core.access``)
        self.guard = Guard(self)
        #: OpenTelemetry spans, None unless ``[tracing] enabled`` (``core.tracing``)
        self.tracing: Tracing | None = load_tracing(settings.tracing.enabled)
        dl = settings.dead_letters
        #: where given-up messages go (``core.dead_letters``)
        self.dead_letters = DeadLetters(
            adapter,
            enabled=dl.enabled,
            default=dl.destination,
            list_max=dl.list_max,
            clock=self.now,
            publish_timeout=settings.publish_timeout,
        )
        #: wake the lifetime sweep (set by the service once the sweep exists)
        self.wake_sweep: Callable[[], None] = _nothing
        #: wake the demand reconciler (set by the service once it exists)
        self.wake_demand: Callable[[], None] = _nothing
        #: whether other instances share this one's store (a cluster; set at the join,
        #: before anything is restored)
        self.shared = False
        #: this instance's id (``cluster.instance_id``; the ``WSNMOM-Instance`` header)
        self.instance_id = instance_id(settings.cluster.instance_id)
        #: whether this instance delivers a push subscription (by id): with several
        #: instances on one store, only the one holding its shard (``core.cluster``)
        self.delivers: Callable[[str], bool] = _always
        #: whether this instance runs the periodic work (expiry, overflow ends, demand)
        self.leads: Callable[[], bool] = _yes
        #: the epoch of the leadership this instance holds, None when it does not lead
        #: (``core.cluster``): the fencing token of the leader's demand saves
        self.leader_epoch: Callable[[], int | None] = _single_epoch

    def topic_dialect(self, chosen: str | None) -> str | None:
        """The Dialect of a Topic handed to a consumer: ``chosen`` (the subscriber's, or the
        publisher's for what a pull point or GetCurrentMessage hands out as it was
        published), or Concrete for everyone with ``topic_dialect = "concrete"``."""
        if chosen is not None and self.settings.topic_dialect == "concrete":
            return CONCRETE
        return chosen

    def now(self) -> datetime:
        """The broker's clock (UTC, timezone-aware)."""
        value = self._clock()
        return value if value.tzinfo else value.replace(tzinfo=UTC)

    # -- addresses -------------------------------------------------------------------------
    @property
    def broker_address(self) -> str:
        """Address of the NotificationBroker endpoint."""
        return broker_address(self.settings.base_url)

    def subscription_address(self, subscription_id: str) -> str:
        """Address of a subscription's SubscriptionManager."""
        return resource_address(self.settings.base_url, ResourceKind.SUBSCRIPTION, subscription_id)

    def pull_point_address(self, pull_point_id: str) -> str:
        """Address of a pull point."""
        return resource_address(self.settings.base_url, ResourceKind.PULL_POINT, pull_point_id)

    def registration_address(self, registration_id: str) -> str:
        """Address of a PublisherRegistrationManager resource."""
        return resource_address(self.settings.base_url, ResourceKind.REGISTRATION, registration_id)

    # -- settings-derived values -----------------------------------------------------------
    def limits(self) -> QueueLimits:
        """What every durable subscription and pull point may accumulate."""
        lim = self.settings.limits
        return QueueLimits(
            max_messages=lim.max_messages,
            max_bytes=lim.max_bytes,
            overflow=Overflow(lim.overflow),
            max_age=lim.max_age,
        )

    def termination(
        self,
        requested: RequestedTime,
        error: type[errors.WsnError],
        default: timedelta | None = None,
    ) -> datetime | None:
        """The termination time to grant for ``requested`` (None = never) or raise ``error``."""
        t = self.settings.termination
        granted: datetime | None = resolve_termination(
            _normalise_requested(requested),
            now=self.now(),
            default=default or t.default,
            maximum=t.maximum,
            allow_infinite=t.allow_infinite,
            error=error,
        )
        return granted

    def forget_native(self, name: str) -> None:
        """Another instance deleted the durable subscription ``name``: the adapter drops
        what it keeps of it here (``Adapter.forget_subscription``); what it left in the
        middleware gets an intent, which the orphan sweep finishes (``core.orphans``).
        Failures are logged."""
        try:
            left = self.adapter.forget_subscription(name)
        except Exception:
            _log.warning("forgetting durable subscription %s failed", name, exc_info=True)
            return
        if left:
            try:
                self.store.put_intent(name)
            except Exception:
                _log.warning(
                    "recording the intent of %s, left in the middleware, failed: it stays "
                    "there until an operator deletes it",
                    name,
                    exc_info=True,
                )

    def delete_native(self, name: str) -> bool:
        """Delete the durable subscription ``name``; failures are logged, not raised
        (False)."""
        try:
            self.adapter.delete_subscription(name)
        except Exception:
            _log.warning("deleting durable subscription %s failed", name, exc_info=True)
            return False
        return True

    def undo_native(self, name: str) -> None:
        """Take back the durable subscription ``name`` that a refused Subscribe or
        CreatePullPoint made (its record is not stored): delete it, then its intent; when
        either fails the intent stays and the orphan sweep finishes the job
        (``core.orphans``).  Failures are logged, not raised."""
        if self.delete_native(name):
            self.drop_intent(name)

    def drop_intent(self, name: str) -> None:
        """Remove the intent ``name`` once its durable subscription is gone; a failure is
        logged (the sweep then finds the intent, and its delete finds nothing)."""
        try:
            self.store.delete_intent(name)
        except Exception:
            _log.warning("removing the intent of %s failed", name, exc_info=True)
