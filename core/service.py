"""``BrokerService``: the WS-N NotificationBroker, SubscriptionManager, PullPoint and
PublisherRegistrationManager semantics, independent of SOAP and of the middleware.

The SOAP frontend calls the methods below with request records from ``core.model`` and
renders results and ``core.errors`` exceptions.  This class is a facade: it builds the
broker's parts and delegates to them.

========================  ===========================================================
``core.context``          what the parts share (settings, adapter, store, outbound
                          port, topic set, delivery engine, clock, addresses)
``core.registry``         the live resources and their lock
``core.subscriptions``    Subscribe, Renew, Unsubscribe, Pause/Resume, broker-made ends
                          (parts: ``subscription_changes``, ``subscription_ends``)
``core.subscription_delivery``  delivery channels, rendering for a subscriber
``core.direct_routing``   routing at publish time into pull points (sole publisher)
``core.inbound``          Notify, publishing, GetCurrentMessage
``core.pull_points``      CreatePullPoint, GetMessages, DestroyPullPoint
``core.registrations``    RegisterPublisher, DestroyRegistration
``core.recovery``         restore from the store at start
``core.sweep``            expiry and overflow ends
``core.operations``       what operators see (all resources, delivery state, topics)
``core.cluster_parts``    this instance in a cluster: follower, ownership, membership,
                          pull-point readers, the position fence
========================  ===========================================================

Beside the facade: ``core.service_setup`` (the outbound policy and delivery engine built
from the settings, the demand manager), ``core.service_operators`` (the operators'
calls, a base class), ``core.advertised`` (resource properties and policy) and
``core.readiness`` (whether the broker can serve).

Resource ids are unguessable (``new_resource_id``); addresses follow ``core.addresses``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from wsnmom.core import errors, metrics
from wsnmom.core.adapter import Adapter
from wsnmom.core.advertised import AdvertisedProperties, broker_policy
from wsnmom.core.availability import shown_reason
from wsnmom.core.cluster_parts import ClusterParts
from wsnmom.core.config import Settings
from wsnmom.core.context import BrokerContext
from wsnmom.core.dead_letter_admin import DeadLetterAdmin
from wsnmom.core.inbound import Inbound
from wsnmom.core.lifetimes import utc_now
from wsnmom.core.model import (
    CreatePullPointRequest,
    ExpressionSource,
    InboundNotification,
    NotificationMessage,
    PublisherRegistration,
    PullPoint,
    RegisterPublisherRequest,
    RequestedTime,
    SubscribeRequest,
    Subscription,
)
from wsnmom.core.observers import Observers
from wsnmom.core.operations import Operations
from wsnmom.core.orphans import OrphanSweep
from wsnmom.core.outbound_policy import OutboundPolicy
from wsnmom.core.peek import Peeker
from wsnmom.core.periodic import PeriodicTask
from wsnmom.core.policy import BrokerPolicy
from wsnmom.core.ports import BrokerProperties, OutboundSoap
from wsnmom.core.pull_handout import Settlement
from wsnmom.core.pull_points import PullPoints
from wsnmom.core.rate_history import RateHistory
from wsnmom.core.readiness import disk_low, unready_reason
from wsnmom.core.recovery import restore
from wsnmom.core.registrations import Registrations
from wsnmom.core.registry import Registry
from wsnmom.core.service_operators import OperatorCalls
from wsnmom.core.service_setup import (
    build_delivery_engine,
    build_demand_manager,
    build_outbound_policy,
    gateway_version,
)
from wsnmom.core.store import Store
from wsnmom.core.subscription_delivery import SubscriptionDelivery
from wsnmom.core.subscription_end import NATO_NS, WSNMOM_NS, subscription_end_payload
from wsnmom.core.subscriptions import Subscriptions
from wsnmom.core.sweep import Sweeper
from wsnmom.topic_mapping.topic_set import TopicSet

if TYPE_CHECKING:
    from wsnmom.core.plugins import PluginManager

__all__ = [
    "NATO_NS",
    "WSNMOM_NS",
    "BrokerProperties",
    "BrokerService",
    "subscription_end_payload",
]

log = logging.getLogger(__name__)


class BrokerService(OperatorCalls):
    """The broker; see the module docstring.  All public methods are thread-safe.
    Implements ``core.ports.BrokerPort``, what the SOAP frontend is written against."""

    def __init__(
        self,
        settings: Settings,
        adapter: Adapter,
        store: Store,
        outbound: OutboundSoap,
        *,
        topic_set: TopicSet | None = None,
        clock: Callable[[], datetime] = utc_now,
        autostart: bool = True,
        demand_interval: float = 5.0,
        plugins: PluginManager | None = None,
        outbound_policy: OutboundPolicy | None = None,
    ) -> None:
        self.settings = settings
        #: the outbound-address policy; share it with the outbound SOAP client so both
        #: apply the same rules (built from ``settings.outbound`` when not given)
        self.outbound_policy = build_outbound_policy(settings, outbound_policy)
        #: observer hooks are called through it (None: no observers)
        self.plugins = plugins
        self.adapter = adapter
        self.store = store
        self.outbound = outbound
        self.topic_set = topic_set if topic_set is not None else TopicSet(fixed=False)
        self.engine = build_delivery_engine(settings)
        self._advertised = AdvertisedProperties(settings, self.topic_set)
        ctx = self._ctx = BrokerContext(
            settings,
            adapter,
            store,
            outbound,
            self.topic_set,
            self.engine,
            Observers(plugins),
            clock,
            self.outbound_policy,
        )
        self.registry: Registry = ctx.registry
        self._gate = ctx.gate
        self._guard = ctx.guard
        self.delivery = SubscriptionDelivery(ctx)
        self.inbound = Inbound(ctx, self.delivery.direct)
        self.subscriptions = Subscriptions(ctx, self.delivery, self.inbound)
        self.pull_points = PullPoints(ctx, self.inbound, self.subscriptions.destroy)
        self.demand = build_demand_manager(
            ctx, lambda: self.registrations, self.subscriptions, demand_interval
        )
        self.registrations = Registrations(ctx, self.demand)
        self.operations = Operations(ctx)
        self.peeker = Peeker(ctx)
        #: the last hour of traffic for the admin page's charts
        self.rates = RateHistory(
            self._backlog, interval=settings.admin.chart_interval.total_seconds()
        )
        self.dead_letter_admin = DeadLetterAdmin(ctx, self.delivery.render, self.delivery.forward)
        self.sweeper = Sweeper(ctx, self.subscriptions, self.pull_points, self.registrations)
        self.lifetimes = PeriodicTask(
            self.sweeper.sweep,
            name="wsnmom-lifetimes",
            interval=settings.termination.sweep_interval.total_seconds(),
        )
        ctx.wake_sweep = self.lifetimes.wake
        #: removes durable subscriptions without a record (``core.orphans``)
        self.orphans = OrphanSweep(ctx)
        ctx.wake_demand = self.demand.wake
        self._join_cluster(ctx)
        self._policy = broker_policy(ctx)
        self._started = False
        self._closed = False
        metrics.set_backlog_source(self._backlog)
        metrics.set_subscription_backlog_source(self._subscription_backlogs)
        if autostart:
            self.start()

    def _join_cluster(self, ctx: BrokerContext) -> None:
        """This instance among those sharing the store (``core.cluster_parts``)."""
        parts = ClusterParts(
            ctx,
            self.subscriptions,
            self.pull_points,
            self.registrations,
            self.orphans,
            became_leader=self._became_leader,
        )
        #: loads what other instances wrote (``core.follow``)
        self.follower = parts.follower
        #: opens and closes deliveries as shards come and go (``core.ownership``)
        self.ownership = parts.ownership
        #: this instance among those sharing the store (``core.cluster``)
        self.cluster = parts.cluster
        #: which instance reads a pull point core buffers (``core.pull_owners``)
        self.pull_owners = parts.pull_owners
        #: the topic set the instances share (``core.topic_share``; None: alone)
        self.shared_topics = parts.topics

    # -- infrastructure --------------------------------------------------------------------
    def now(self) -> datetime:
        """The broker's clock (UTC, timezone-aware)."""
        return self._ctx.now()

    @property
    def broker_address(self) -> str:
        """Address of the NotificationBroker endpoint."""
        return self._ctx.broker_address

    def subscription_address(self, subscription_id: str) -> str:
        """Address of a subscription's SubscriptionManager."""
        return self._ctx.subscription_address(subscription_id)

    def pull_point_address(self, pull_point_id: str) -> str:
        """Address of a pull point."""
        return self._ctx.pull_point_address(pull_point_id)

    def registration_address(self, registration_id: str) -> str:
        """Address of a PublisherRegistrationManager resource."""
        return self._ctx.registration_address(registration_id)

    def ready(self) -> bool:
        """Restored from the store, the adapter answers, the store works and the disk is
        not low."""
        return not self.unready_reason()

    def unready_reason(self) -> str:
        """Why the broker is not ready ("" when it is): which dependency is missing."""
        return unready_reason(self._ctx, closing=self._closed)

    def disk_low(self) -> str:
        """Why the data directory's disk refuses new work ("" when it does not)."""
        return disk_low(self._gate)

    def opening_failed(self, error: BaseException) -> None:
        """The last attempt to open the adapter (before the broker started) raised
        ``error``: the refusals and ``/readyz`` say so until the broker starts."""
        self._gate.open_error = shown_reason(error)

    @property
    def started(self) -> bool:
        """Whether ``start`` restored the broker's state (it serves requests)."""
        return self._gate.ready

    def policy(self) -> BrokerPolicy:
        """The advertised broker policy."""
        return self._policy

    def broker_properties(self) -> BrokerProperties:
        """NotificationBroker resource properties, as the caller may see them: an identity
        with topic ACLs sees only the topics they name (``Principal.may_see``).  Built once
        per topic-set version and visibility (``AdvertisedProperties``); the ``topic_set``
        element is shared and must not be changed."""
        return self._advertised.get()

    # -- the cluster -----------------------------------------------------------------------
    @property
    def instance_id(self) -> str:
        """This instance's id (the ``WSNMOM-Instance`` header)."""
        return self._ctx.instance_id

    def _became_leader(self) -> None:
        self.lifetimes.wake()
        self.demand.wake()

    # -- start-up / shutdown ---------------------------------------------------------------
    def start(self) -> None:
        """Restore state from the store, drop what expired while down, resume delivery."""
        with self.registry.lock:
            if self._started:
                return
            self._started = True
        # the adapter is open now, and its capabilities may differ from its class's (they
        # are per instance, known after open()): advertise what this instance does
        self._policy = broker_policy(self._ctx)
        self._ctx.limit_keeper.warn_unenforced()
        self.cluster.join(
            self.settings.instance_url,
            gateway_version(),
            single_instance=self.adapter.capabilities.local_queues,
        )
        # without a native pull, each pull point is read by the instance holding its
        # shard, and GetMessages sent elsewhere is forwarded there (docs/scale-out.md)
        self.pull_owners.active = self.cluster.shared and not self.adapter.capabilities.native_pull
        self.pull_owners.clustered = self.cluster.shared
        self._ctx.shared = self.cluster.shared
        if self.shared_topics is not None:
            self.shared_topics.start()
        restore(self._ctx, self.subscriptions, self.pull_points, self.registrations)
        self.orphans.at_start(shared=self.cluster.shared)
        self.cluster.start()
        self._gate.ready = True
        self.lifetimes.start()
        self.orphans.start()
        self.demand.start()
        self.demand.wake()
        self.rates.start()

    def close(self) -> None:
        """Stop delivery and background threads; state stays in the store and middleware."""
        with self.registry.lock:
            if self._closed:
                return
            self._closed = True
        self._gate.ready = False
        # first: a shard gained meanwhile opens no more deliveries (core.ownership)
        self.ownership.close()
        self.rates.stop()
        self.lifetimes.stop()
        self.orphans.stop()
        self.demand.stop()
        self.engine.close()
        # the feeds' stops under way stop their handle now (none runs after the close)
        self.delivery.feeds.close()
        self._ctx.dead_letters.close()
        if self._started:
            self.cluster.stop()
        if self.shared_topics is not None:
            self.shared_topics.stop()
        with self.registry.lock:
            for pp in self.registry.pull_points.values():
                try:
                    pp.stop()
                except Exception:
                    log.debug("stopping pull point handle failed", exc_info=True)

    # -- NotificationProducer / SubscriptionManager ---------------------------------------
    def subscribe(self, req: SubscribeRequest) -> Subscription:
        """Create a subscription (BN §4.2)."""
        self._gate.require_middleware()
        self._gate.require_space()
        self._guard.check_quota("subscriptions", errors.SubscribeCreationFailed)
        return self.subscriptions.subscribe(req)

    def get_subscription(self, subscription_id: str) -> Subscription:
        """The subscription (a copy); ResourceUnknown when unknown or expired."""
        self._gate.require_ready()
        self._guard.subscription(subscription_id)
        return self.subscriptions.get(subscription_id)

    def renew(
        self, subscription_id: str, termination: RequestedTime, *, invalid: bool = False
    ) -> Subscription:
        """Set a new termination time (BN §6.1.1)."""
        self._gate.require_ready()
        self._guard.subscription(subscription_id)
        return self.subscriptions.renew(subscription_id, termination, invalid=invalid)

    def unsubscribe(self, subscription_id: str) -> None:
        """Destroy the subscription (BN §6.1.2); no SubscriptionEnd."""
        self._gate.require_middleware()
        self._guard.subscription(subscription_id)
        self.subscriptions.unsubscribe(subscription_id)

    def pause(self, subscription_id: str) -> None:
        """PauseSubscription: stop delivering, keep accumulating; idempotent."""
        self._gate.require_middleware()
        self._guard.subscription(subscription_id, pause=True)
        self.subscriptions.pause(subscription_id)

    def resume(self, subscription_id: str) -> None:
        """ResumeSubscription: deliver what accumulated, in order; no-op when not paused."""
        self._gate.require_middleware()
        self._guard.subscription(subscription_id, pause=True)
        self.subscriptions.resume(subscription_id)

    # -- NotificationConsumer / current message -------------------------------------------
    def notify(self, messages: Sequence[InboundNotification]) -> None:
        """Publish; returns once the middleware confirmed every message (all or nothing
        is validated before anything is published)."""
        self._gate.require_middleware()
        self._gate.require_space()
        self.inbound.notify(messages)

    def get_current_message(self, topic: ExpressionSource) -> NotificationMessage:
        """The last notification on exactly one topic (BN §4.3)."""
        if self.adapter.capabilities.retained_current_message:
            self._gate.require_middleware()
        else:
            self._gate.require_ready()
        return self.inbound.get_current_message(topic)

    # -- PullPoints ------------------------------------------------------------------------
    def create_pull_point(self, req: CreatePullPointRequest) -> PullPoint:
        """CreatePullPoint (BN §5.2); a known ``name`` re-attaches to its pull point."""
        self._gate.require_middleware()
        self._gate.require_space()
        return self.pull_points.create(req)

    def get_pull_point(self, pull_point_id: str) -> PullPoint:
        """The pull point (a copy); ResourceUnknown when unknown or expired."""
        self._gate.require_ready()
        self._guard.pull_point(pull_point_id)
        return self.pull_points.get(pull_point_id)

    def get_messages(self, pull_point_id: str, maximum: int | None) -> list[NotificationMessage]:
        """Destructive FIFO read (BN §5.1.2); None/0 = all available up to the cap.  In
        a cluster where core buffers pull points, only the instance reading the pull
        point reads it (``core.pull_owners``): elsewhere "retry later"."""
        self._gate.require_middleware()
        self._guard.pull_point(pull_point_id)
        if not self.pull_owners.reads_here(pull_point_id):
            raise self.pull_owners.refusal(pull_point_id)
        return self.pull_points.get_messages(pull_point_id, maximum)

    def hand_out_messages(
        self, pull_point_id: str, maximum: int | None
    ) -> tuple[list[NotificationMessage], Settlement]:
        """``get_messages`` for a caller that writes the answer: it settles the messages
        once the answer was written, or gives them back (``core.pull_handout``)."""
        self._gate.require_middleware()
        self._guard.pull_point(pull_point_id)
        if not self.pull_owners.reads_here(pull_point_id):
            raise self.pull_owners.refusal(pull_point_id)
        return self.pull_points.hand_out(pull_point_id, maximum)

    def notify_pull_point(
        self, pull_point_id: str, messages: Sequence[InboundNotification]
    ) -> None:
        """Notify sent to a pull point: accumulate as received (PP-05)."""
        self._gate.require_middleware()
        self._gate.require_space()
        self._guard.pull_point(pull_point_id)
        self.pull_points.notify(pull_point_id, messages)

    def renew_pull_point(self, pull_point_id: str, termination: RequestedTime) -> PullPoint:
        """A new termination time for the pull point (ONVIF's Renew)."""
        self._gate.require_ready()
        self._guard.pull_point(pull_point_id)
        return self.pull_points.renew(pull_point_id, termination)

    def synchronize(self, subscription_id: str) -> int:
        """ONVIF's SetSynchronizationPoint: the current messages of the subscription's
        topics into the pull point it feeds again; how many."""
        self._gate.require_middleware()
        self._gate.require_space()
        self._guard.subscription(subscription_id)
        state = self._ctx.registry.live_subscription(subscription_id)
        return self.pull_points.synchronize(state)

    def destroy_pull_point(self, pull_point_id: str) -> None:
        """DestroyPullPoint: destroys the subscriptions feeding it too."""
        self._gate.require_middleware()
        self._guard.pull_point(pull_point_id)
        self.pull_points.destroy(pull_point_id)

    # -- RegisterPublisher / PublisherRegistrationManager ---------------------------------
    def register_publisher(self, req: RegisterPublisherRequest) -> PublisherRegistration:
        """RegisterPublisher (BR §6.1)."""
        self._gate.require_ready()
        self._gate.require_space()
        self._guard.check_quota("registrations", errors.PublisherRegistrationFailed)
        return self.registrations.register(req)

    def get_registration(self, registration_id: str) -> PublisherRegistration:
        """The registration (a copy); ResourceUnknown when unknown or expired."""
        self._gate.require_ready()
        self._guard.registration(registration_id)
        return self.registrations.get(registration_id)

    def renew_registration(
        self, registration_id: str, termination: RequestedTime, *, invalid: bool = False
    ) -> PublisherRegistration:
        """A new termination time for the registration (WS-N 1.0's SetTerminationTime)."""
        self._gate.require_ready()
        self._guard.registration(registration_id)
        if invalid:
            raise errors.UnacceptableTerminationTime(
                "TerminationTime is empty or not a dateTime/duration"
            )
        return self.registrations.renew(registration_id, termination)

    def destroy_registration(self, registration_id: str) -> None:
        """DestroyRegistration (BR §7.2); a demand subscription is unsubscribed."""
        self._gate.require_ready()
        self._guard.registration(registration_id)
        self.registrations.destroy(registration_id)

    # -- lifetimes -------------------------------------------------------------------------
    def sweep(self) -> None:
        """Destroy every expired subscription, pull point and registration."""
        self.sweeper.sweep()
