"""``BrokerService``: the WS-N NotificationBroker, SubscriptionManager, PullPoint and
PublisherRegistrationManager semantics, independent of SOAP and of the middleware.

The SOAP frontend calls the methods below with request records from ``core.model`` and
renders results and ``core.errors`` exceptions.  The service owns:

* the adapter (one durable native subscription per WS-N subscription and pull point),
* the store (subscriptions, pull points, registrations, current messages),
* the delivery engine (push subscriptions and subscriptions feeding local pull points),
* the lifetime scheduler and the demand manager.

Resource ids are unguessable (``new_resource_id``); addresses are
``<public_url>/wsn/subscriptions/<id>``, ``/wsn/pullpoints/<id>``, ``/wsn/registrations/<id>``
and ``/wsn/broker``.

Decisions not made in the other core modules (filters, lifetimes, demand, codec) are:

* Subscribe without a consumer address, or with a consumer address the outbound policy
  refuses -> SubscribeCreationFailedFault (SUB-05 names no fault).
* A consumer address that is one of this broker's pull points (same address, or a path
  ``/wsn/pullpoints/<id>`` of a live pull point) makes the subscription *feed* that pull
  point.  UseRaw is ignored for such subscriptions: pull points always hold
  NotificationMessages (PP-10).  How its messages reach the pull point depends on the
  middleware:

  - ``Capabilities.sole_publisher`` (every message comes through this process): the
    subscription has no durable subscription of its own.  When a notification is
    published, core finds the feeding subscriptions it matches (a ``TopicIndex`` plus the
    residual filter) and publishes the rendered copies into their pull points' inboxes in
    the same ``publish_many`` as the notification itself, so they are as durable as it is
    and nothing waits to be forwarded after a restart.  The first PauseSubscription gives
    it a durable subscription of its own (``Subscription.queued``), which it keeps: paused
    messages accumulate there and are forwarded on resume, in order.  A ``PublishGate``
    keeps publishes out while a subscription switches.
  - otherwise (native publishers may exist): it has its own durable native subscription,
    and a delivery channel republishes its matching messages into the pull point's inbox
    (confirmed publish, then ack).
* DestroyPullPoint and pull point expiry destroy the subscriptions feeding it (DPP-04).
* GetMessages: FIFO; MaximumNumber absent or 0 returns everything available up to
  ``limits.get_messages_cap``; the read is destructive (acked before the response is
  sent: at-most-once if the response is lost).
* Notify with ``requires_registration``: a message is accepted when its ProducerReference
  address equals the PublisherReference of a live registration whose topics cover the
  message's topic; otherwise the whole Notify is refused with
  PublisherRegistrationRejectedFault.  A middleware that does not confirm a publish gives
  ResourceUnavailableFault (Receiver).
* RegisterPublisher: Demand=true without PublisherReference -> PublisherRegistrationFailed;
  Demand=true without Topic -> InvalidTopicExpression; an unknown topic dialect ->
  InvalidTopicExpression (BR lists no dialect fault).  A registration without
  PublisherReference (with or without Topic) is accepted; without Topic it covers every
  topic.
* Observer hooks (``wsnmom.core.hookspecs``), called through the ``plugins`` facade only
  when some plugin implements them: ``wsnmom_notification_published`` per message after
  the middleware confirmed a Notify (to the broker or to a pull point) or a
  SubscriptionEnd; ``wsnmom_notification_delivered`` per message after a consumer answered
  2xx (subscription id) or GetMessages returned it (pull point id);
  ``wsnmom_delivery_failed`` per message of a failed push attempt, or of a failed copy
  into a pull point (subscription id).  Copies into a pull point are not "delivered".
* SubscriptionEnd (NCIA Annex 1) is published when the broker ends a subscription itself:
  retry give-up, a full backlog with ``limits.on_full = "end"`` (checked by the lifetime
  sweep), administrative removal (``end_subscription``), a filter that no longer compiles
  after restart.  Never for Unsubscribe or expiry.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from fnmatch import fnmatch
from functools import partial
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from lxml import etree
from wsnmom.core import errors, metrics
from wsnmom.core.adapter import (
    Adapter,
    AdapterError,
    OutboundMessage,
    Overflow,
    QueueLimits,
    Received,
    SubscriptionHandle,
    SubscriptionSpec,
)
from wsnmom.core.codec import decode, encode, is_internal_routing, pull_point_inbox
from wsnmom.core.config import Settings
from wsnmom.core.delivery import Backoff, Channel, DeliveryEngine
from wsnmom.core.demand import DemandEntry, DemandManager
from wsnmom.core.filters import (
    MESSAGE_CONTENT_DIALECTS,
    CompiledFilter,
    MessageContentFilter,
    check_producer_properties,
    compile_topic_filter,
    concrete_topic,
    topic_errors,
)
from wsnmom.core.gate import PublishGate
from wsnmom.core.lifetimes import is_expired, resolve_termination, utc_now
from wsnmom.core.model import (
    INFINITE,
    CreatePullPointRequest,
    Delivered,
    EndpointReference,
    ExpressionSource,
    InboundNotification,
    NotificationMessage,
    PublisherRegistration,
    PullPoint,
    RegisterPublisherRequest,
    RequestedTime,
    SubscribeRequest,
    Subscription,
    SubscriptionState,
    new_message_ids,
    new_resource_id,
)
from wsnmom.core.periodic import PeriodicTask
from wsnmom.core.policy import BrokerPolicy, build_policy
from wsnmom.core.ports import DeliveryFailed, OutboundSoap
from wsnmom.core.store import Store
from wsnmom.topic_mapping.dialects import (
    CONCRETE,
    FULL,
    SIMPLE,
    SUPPORTED_DIALECTS,
    parse_topic_expression,
)
from wsnmom.topic_mapping.index import TopicIndex
from wsnmom.topic_mapping.model import PathPattern, Topic, TopicExpression
from wsnmom.topic_mapping.namespaces import TopicSet

if TYPE_CHECKING:
    from wsnmom.core.plugins import PluginManager

log = logging.getLogger(__name__)

#: observer hooks core calls (``wsnmom.core.hookspecs``), checked with ``observes`` first
_PUBLISHED = "wsnmom_notification_published"
_DELIVERED = "wsnmom_notification_delivered"
_FAILED = "wsnmom_delivery_failed"

#: NCIA extension namespace (SubscriptionEnd, SubscriptionEndTopic)
NATO_NS = "http://nc3a.nato.int/ces/wsn/extension"
WSA_NS = "http://www.w3.org/2005/08/addressing"
WSNMOM_NS = "urn:wsnmom:ns:1"
WSNT_USE_RAW = "{http://docs.oasis-open.org/wsn/b-2}UseRaw"

_ALMOST_FOREVER = datetime(9999, 12, 31, 23, 59, 59)


@dataclass(frozen=True, slots=True)
class BrokerProperties:
    """NotificationBroker resource properties (BRP-01)."""

    #: one Full-dialect expression per member topic (with the namespaces it uses)
    topic_expressions: list[ExpressionSource]
    fixed_topic_set: bool
    dialects: tuple[str, ...]
    #: the ``wstop:TopicSet`` element
    topic_set: etree._Element
    requires_registration: bool


@dataclass(slots=True)
class _Sub:
    record: Subscription
    filter: CompiledFilter
    end_topic: tuple[Topic, str] | None = None
    handle: SubscriptionHandle | None = None
    #: routed into its pull point when published (no durable subscription of its own)
    direct: bool = False


@dataclass(slots=True)
class _PP:
    record: PullPoint
    handle: SubscriptionHandle
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass(slots=True)
class _Reg:
    record: PublisherRegistration
    topics: tuple[TopicExpression, ...]


class _Forwarder:
    """The delivery functions of a subscription whose consumer is one of the broker's pull
    points: bound methods of one small object (not closures) since there is one per
    subscription."""

    __slots__ = ("pull_point_id", "service", "state")

    def __init__(self, service: BrokerService, state: _Sub, pull_point_id: str) -> None:
        self.service = service
        self.state = state
        self.pull_point_id = pull_point_id

    def prepare(self, received: Received) -> NotificationMessage | None:
        """The message as the pull point is to hold it, or None to drop it."""
        message = self.service._accepted(self.state, received)
        return None if message is None else self.service._render(self.state, message)

    def send(self, batch: Sequence[NotificationMessage]) -> None:
        """Publish ``batch`` into the pull point's inbox."""
        self.service._forward(self.state, self.pull_point_id, batch)


def _normalise_requested(value: RequestedTime) -> RequestedTime:
    """The frontend may pass ``datetime.max`` (UTC) for ``xsi:nil``: treat as INFINITE."""
    if isinstance(value, datetime) and value.replace(tzinfo=None) >= _ALMOST_FOREVER:
        return INFINITE
    return value


def address_refusal(address: str, settings: Settings) -> str | None:
    """Why the broker may not call ``address`` (outbound policy), or None when allowed.

    Literal IP addresses are checked against loopback / link-local rules and CIDR entries;
    host names against fnmatch patterns (``localhost`` counts as loopback).  Host names are
    not resolved here.
    """
    out = settings.outbound
    try:
        parts = urlsplit(address)
    except ValueError:
        return "not a URL"
    if parts.scheme.lower() not in [s.lower() for s in out.schemes]:
        return f"URL scheme {parts.scheme!r} is not allowed"
    host = (parts.hostname or "").lower()
    if not host:
        return "no host"
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    loopback = (
        host == "localhost" or host.endswith(".localhost") or (ip is not None and ip.is_loopback)
    )
    if loopback and not out.allow_loopback:
        return "loopback addresses are refused"
    if ip is not None and ip.is_link_local and not out.allow_link_local:
        return "link-local addresses are refused"

    def hit(pattern: str) -> bool:
        if ip is not None and "/" in pattern:
            try:
                return ip in ipaddress.ip_network(pattern, strict=False)
            except ValueError:
                return False
        return fnmatch(host, pattern.lower())

    if any(hit(p) for p in out.deny):
        return "address is on the deny list"
    if out.allow and not any(hit(p) for p in out.allow):
        return "address is not on the allow list"
    return None


class BrokerService:
    """The broker; see the module docstring.  All public methods are thread-safe."""

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
    ) -> None:
        self.settings = settings
        #: observer hooks are called through it (None: no observers)
        self.plugins = plugins
        self.adapter = adapter
        self.store = store
        self.outbound = outbound
        self.topic_set = topic_set if topic_set is not None else TopicSet(fixed=False)
        self._clock = clock
        self._lock = threading.RLock()
        self._subs: dict[str, _Sub] = {}
        self._pps: dict[str, _PP] = {}
        self._regs: dict[str, _Reg] = {}
        #: subscriptions routed into their pull points at publish time, by topic pattern,
        #: and those without a topic filter (see the module docstring)
        self._direct_index: TopicIndex[str] = TopicIndex()
        self._direct_any: set[str] = set()
        self._gate = PublishGate()
        self._started = False
        self._closed = False
        r = settings.retry
        self.engine = DeliveryEngine(
            workers=settings.delivery.workers,
            backoff=Backoff(
                max_attempts=r.max_attempts,
                initial_delay=r.initial_delay.total_seconds(),
                multiplier=r.multiplier,
                max_delay=r.max_delay.total_seconds(),
                give_up=r.give_up,
            ),
            prefetch=settings.delivery.prefetch,
        )
        self.lifetimes = PeriodicTask(
            self.sweep,
            name="wsnmom-lifetimes",
            interval=settings.termination.sweep_interval.total_seconds(),
        )
        self.demand = DemandManager(
            outbound,
            broker_consumer=lambda: EndpointReference(self.broker_address),
            entries=self._demand_entries,
            active_filters=self._active_topic_filters,
            save=self._save_registration,
            timeout=r.timeout,
            interval=demand_interval,
        )
        self._policy = build_policy(settings, message_content_dialects=MESSAGE_CONTENT_DIALECTS)
        metrics.set_backlog_source(self._backlog)
        if autostart:
            self.start()

    # ==========================================================================================
    # infrastructure
    # ==========================================================================================

    def now(self) -> datetime:
        """The broker's clock (UTC, timezone-aware)."""
        value = self._clock()
        return value if value.tzinfo else value.replace(tzinfo=UTC)

    @property
    def broker_address(self) -> str:
        """Address of the NotificationBroker endpoint."""
        return f"{self.settings.base_url}/wsn/broker"

    def subscription_address(self, subscription_id: str) -> str:
        """Address of a subscription's SubscriptionManager."""
        return f"{self.settings.base_url}/wsn/subscriptions/{subscription_id}"

    def pull_point_address(self, pull_point_id: str) -> str:
        """Address of a pull point."""
        return f"{self.settings.base_url}/wsn/pullpoints/{pull_point_id}"

    def registration_address(self, registration_id: str) -> str:
        """Address of a PublisherRegistrationManager resource."""
        return f"{self.settings.base_url}/wsn/registrations/{registration_id}"

    def ready(self) -> bool:
        """Adapter answers and the store works."""
        try:
            return bool(self.adapter.ping()) and self.store.ping() and not self._closed
        except Exception:
            return False

    def policy(self) -> BrokerPolicy:
        """The advertised broker policy."""
        return self._policy

    def broker_properties(self) -> BrokerProperties:
        """NotificationBroker resource properties."""
        topics = [t for t in self.topic_set.topics() if not self.topic_set.is_alias(t)]
        exprs: list[ExpressionSource] = []
        for topic in topics:
            exprs.append(
                ExpressionSource(FULL, "tns:" + "/".join(topic.path), {"tns": topic.namespace})
            )
        return BrokerProperties(
            topic_expressions=exprs,
            fixed_topic_set=self.topic_set.fixed,
            dialects=tuple(SUPPORTED_DIALECTS),
            topic_set=self.topic_set.to_element(),
            requires_registration=self.settings.requires_registration,
        )

    def _limits(self) -> QueueLimits:
        lim = self.settings.limits
        return QueueLimits(
            max_messages=lim.max_messages,
            max_bytes=lim.max_bytes,
            overflow=Overflow(lim.overflow),
            max_age=lim.max_age,
        )

    def _backlog(self) -> float:
        total = 0
        with self._lock:
            handles = [s.handle for s in self._subs.values() if s.handle is not None]
            handles += [p.handle for p in self._pps.values()]
        for h in handles:
            try:
                depth = h.depth()
            except Exception:
                depth = None
            total += depth or 0
        return float(total)

    def _update_gauges(self) -> None:
        metrics.SUBSCRIPTIONS.set(len(self._subs))
        metrics.PULL_POINTS.set(len(self._pps))
        metrics.REGISTRATIONS.set(len(self._regs))

    def _observes(self, hook: str) -> bool:
        """Whether a plugin implements the observer ``hook`` (a set lookup: call it before
        doing any per-message work for observers)."""
        plugins = self.plugins
        return plugins is not None and plugins.observes(hook)

    def _delivered(self, messages: Sequence[NotificationMessage], subscription_id: str) -> None:
        if self.plugins is not None and self._observes(_DELIVERED):
            for m in messages:
                self.plugins.notification_delivered(m, subscription_id)

    def _failed(
        self, messages: Sequence[NotificationMessage], subscription_id: str, error: BaseException
    ) -> None:
        if self.plugins is not None and self._observes(_FAILED):
            for m in messages:
                self.plugins.delivery_failed(m, subscription_id, error)

    # ==========================================================================================
    # start-up / shutdown
    # ==========================================================================================

    def start(self) -> None:
        """Restore state from the store, drop what expired while down, resume delivery."""
        with self._lock:
            if self._started:
                return
            self._started = True
        now = self.now()
        for reg in self.store.list_registrations():
            if is_expired(reg.termination_time, now):
                log.info("registration %s expired while the broker was down", reg.id)
                self.store.delete_registration(reg.id)
                self.demand.release(reg)
                continue
            try:
                topics = self._compile_registration_topics(reg.topics)
            except errors.WsnError as exc:
                log.warning("registration %s dropped: %s", reg.id, exc.description)
                self.store.delete_registration(reg.id)
                self.demand.release(reg)
                continue
            self._regs[reg.id] = _Reg(reg, topics)
        for pp in self.store.list_pull_points():
            if is_expired(pp.termination_time, now):
                log.info("pull point %s expired while the broker was down", pp.id)
                self._delete_native(pp.id)
                self.store.delete_pull_point(pp.id)
                continue
            try:
                handle = self._open_pull_point_handle(pp.id)
            except AdapterError:
                log.exception("cannot reopen pull point %s; it stays stored", pp.id)
                continue
            self._pps[pp.id] = _PP(pp, handle)
        sole_publisher = self.adapter.capabilities.sole_publisher
        listed = self.adapter.subscription_names() if sole_publisher else None
        native_names = set(listed) if listed is not None else None
        compiled_topics: dict[tuple[Any, ...], TopicExpression] = {}
        for sub in self.store.list_subscriptions():
            if (
                sole_publisher
                and sub.pull_point_id is not None
                and not sub.queued
                and (native_names is None or sub.id in native_names)
            ):
                # made before routing at publish time, or a pause cut short by a crash:
                # its durable subscription may hold messages, so it keeps using it
                sub.queued = True
                self.store.put_subscription(sub)
            if is_expired(sub.termination_time, now):
                log.info("subscription %s expired while the broker was down", sub.id)
                self._delete_native(sub.id)
                self.store.delete_subscription(sub.id)
                continue
            if sub.pull_point_id is not None and sub.pull_point_id not in self._pps:
                log.info("subscription %s feeds a pull point that is gone", sub.id)
                self._delete_native(sub.id)
                self.store.delete_subscription(sub.id)
                continue
            try:
                compiled = self._compile_filter(
                    sub.topic, sub.message_content, sub.producer_properties, compiled_topics
                )
                end_topic = self._end_topic(sub.subscription_end_topic)
            except errors.WsnError as exc:
                state = _Sub(sub, CompiledFilter())
                self._finish_subscription(state, f"filter no longer valid: {exc.description}")
                continue
            state = _Sub(sub, compiled, end_topic)
            try:
                self._attach(state)
            except AdapterError as exc:
                log.error("cannot reopen subscription %s: %s", sub.id, exc)
                self._subs[sub.id] = state  # kept; ready() reports the adapter problem
                continue
        self._update_gauges()
        self.lifetimes.start()
        self.demand.start()
        self.demand.wake()

    def close(self) -> None:
        """Stop delivery and background threads; state stays in the store and middleware."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.lifetimes.stop()
        self.demand.stop()
        self.engine.close()
        with self._lock:
            for pp in self._pps.values():
                try:
                    pp.handle.stop()
                except Exception:
                    log.debug("stopping pull point handle failed", exc_info=True)

    # ==========================================================================================
    # helpers
    # ==========================================================================================

    def _termination(
        self,
        requested: RequestedTime,
        error: type[errors.WsnError],
        default: Any = None,
    ) -> datetime | None:
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

    def _compile_filter(
        self,
        topic: ExpressionSource | None,
        content: ExpressionSource | None,
        producer_properties: ExpressionSource | None,
        memo: dict[tuple[Any, ...], TopicExpression] | None = None,
    ) -> CompiledFilter:
        """The subscription's filters; ``memo`` shares compiled topic expressions between
        calls while the topic set does not change (start-up: thousands of subscriptions
        often use a handful of expressions)."""
        expr: TopicExpression | None = None
        if topic is not None:
            key = (topic.dialect, topic.text, tuple(sorted(topic.namespaces.items(), key=str)))
            expr = memo.get(key) if memo is not None else None
            if expr is None:
                expr = compile_topic_filter(topic, self.topic_set)
                if memo is not None:
                    memo[key] = expr
        if producer_properties is not None:
            check_producer_properties(producer_properties)
        mc = MessageContentFilter(content) if content is not None else None
        return CompiledFilter(expr, mc)

    def _end_topic(self, source: ExpressionSource | None) -> tuple[Topic, str] | None:
        if source is None:
            return None
        topic, dialect = concrete_topic(source, self.topic_set)
        with topic_errors():
            self.topic_set.admit(topic)
        return topic, dialect

    def _pull_point_for(self, address: str) -> str | None:
        """The id of the local pull point ``address`` designates, if any."""
        base = self.settings.base_url + "/wsn/pullpoints/"
        path = urlsplit(address).path.rstrip("/")
        candidates = []
        if address.startswith(base):
            candidates.append(address[len(base) :].split("?", 1)[0].strip("/"))
        if "/wsn/pullpoints/" in path:
            candidates.append(path.rsplit("/", 1)[-1])
        with self._lock:
            for c in candidates:
                if c in self._pps:
                    return c
        return None

    def _live_sub(self, subscription_id: str) -> _Sub:
        with self._lock:
            state = self._subs.get(subscription_id)
        if state is None or is_expired(state.record.termination_time, self.now()):
            raise errors.ResourceUnknown(f"no subscription {subscription_id!r}")
        return state

    def _live_pp(self, pull_point_id: str) -> _PP:
        with self._lock:
            state = self._pps.get(pull_point_id)
        if state is None or is_expired(state.record.termination_time, self.now()):
            raise errors.ResourceUnknown(f"no pull point {pull_point_id!r}")
        return state

    def _live_reg(self, registration_id: str) -> _Reg:
        with self._lock:
            state = self._regs.get(registration_id)
        if state is None or is_expired(state.record.termination_time, self.now()):
            raise errors.ResourceUnknown(f"no publisher registration {registration_id!r}")
        return state

    def _delete_native(self, name: str) -> None:
        try:
            self.adapter.delete_subscription(name)
        except Exception:
            log.warning("deleting durable subscription %s failed", name, exc_info=True)

    # ==========================================================================================
    # NotificationProducer: Subscribe
    # ==========================================================================================

    def subscribe(self, req: SubscribeRequest) -> Subscription:
        """Create a subscription (BN §4.2)."""
        address = (req.consumer.address or "").strip() if req.consumer else ""
        if not address:
            raise errors.SubscribeCreationFailed("Subscribe needs a ConsumerReference address")
        if req.unsupported_policy:
            raise errors.UnrecognizedPolicyRequest(
                "SubscriptionPolicy requests not recognised: " + ", ".join(req.unsupported_policy),
                policies=tuple(req.unsupported_policy),
            )
        compiled = self._compile_filter(req.topic, req.message_content, req.producer_properties)
        end_topic = self._end_topic(req.subscription_end_topic)
        if req.initial_termination_time_invalid:
            raise errors.UnacceptableInitialTerminationTime(
                "InitialTerminationTime is empty or not a dateTime/duration"
            )
        termination = self._termination(
            req.initial_termination_time, errors.UnacceptableInitialTerminationTime
        )
        pull_point_id = self._pull_point_for(address)
        if pull_point_id is None:
            refusal = address_refusal(address, self.settings)
            if refusal is not None:
                raise errors.SubscribeCreationFailed(
                    f"consumer address {address!r} refused: {refusal}"
                )
        sub = Subscription(
            id=new_resource_id(),
            consumer=req.consumer,
            creation_time=self.now(),
            termination_time=termination,
            topic=req.topic,
            message_content=req.message_content,
            producer_properties=req.producer_properties,
            filter_xml=req.filter_xml,
            policy_xml=req.policy_xml,
            use_raw=req.use_raw and pull_point_id is None,
            subscription_end_topic=req.subscription_end_topic,
            soap_version=req.soap_version,
            pull_point_id=pull_point_id,
        )
        state = _Sub(sub, compiled, end_topic)
        try:
            self.store.put_subscription(sub)
            self._attach(state)
        except AdapterError as exc:
            self.store.delete_subscription(sub.id)
            self._delete_native(sub.id)
            raise errors.SubscribeCreationFailed(f"the middleware refused: {exc}") from exc
        self._update_gauges()
        self.demand.wake()
        return replace(sub)

    def _routes_direct(self, sub: Subscription) -> bool:
        """Whether ``sub`` is routed into its pull point at publish time."""
        return (
            sub.pull_point_id is not None
            and not sub.queued
            and sub.state is SubscriptionState.ACTIVE
            and self.adapter.capabilities.sole_publisher
        )

    def _add_direct(self, state: _Sub) -> None:
        """Route ``state`` at publish time (call with ``_lock`` held)."""
        state.direct = True
        patterns = state.filter.native_patterns
        if patterns is None:
            self._direct_any.add(state.record.id)
        else:
            self._direct_index.add(state.record.id, patterns)

    def _drop_direct(self, state: _Sub) -> None:
        """Stop routing ``state`` at publish time (call with ``_lock`` held)."""
        if state.direct:
            state.direct = False
            self._direct_any.discard(state.record.id)
            self._direct_index.remove(state.record.id)

    def _attach(self, state: _Sub) -> None:
        """Open the durable subscription and its delivery channel (started unless paused),
        or, for a subscription routed at publish time, just index it."""
        sub = state.record
        if self._routes_direct(sub):
            with self._lock:
                self._subs[sub.id] = state
                self._add_direct(state)
            return
        handle = self.adapter.subscription(
            SubscriptionSpec(
                name=sub.id, patterns=state.filter.native_patterns, limits=self._limits()
            )
        )
        state.handle = handle
        give_up = partial(self._give_up, sub.id)
        batch_size = self.settings.delivery.batch_size
        channel: Channel[Any]
        if sub.pull_point_id is not None:
            forwarder = _Forwarder(self, state, sub.pull_point_id)
            channel = self.engine.open_channel(
                sub.id, handle, forwarder.prepare, forwarder.send, give_up, batch_size=batch_size
            )
        else:
            push, send = self._pusher(state)
            channel = self.engine.open_channel(
                sub.id, handle, push, send, give_up, batch_size=batch_size
            )
        with self._lock:
            self._subs[sub.id] = state
        if sub.state is SubscriptionState.ACTIVE:
            channel.start()

    def _render(self, state: _Sub, message: NotificationMessage) -> NotificationMessage:
        """The message as this subscriber sees it: topic dialect (META-04), producer
        reference per configuration, the broker's SubscriptionReference (META-B1)."""
        dialect: str | None = None
        if message.topic is not None:
            if state.filter.topic is not None:
                dialect = state.filter.topic.dialect
            else:
                dialect = SIMPLE if len(message.topic.path) == 1 else CONCRETE
        producer = message.producer_reference if self.settings.forward_producer_reference else None
        return replace(
            message,
            topic_dialect=dialect,
            producer_reference=producer,
            subscription_reference=EndpointReference(self.subscription_address(state.record.id)),
        )

    def _accepted(self, state: _Sub, received: Received) -> NotificationMessage | None:
        """The message if this subscription is to deliver it; None to drop it (acked).

        Drops internal traffic, messages the filters refuse, and everything once the
        subscription has expired: clients already get ResourceUnknown for it, so it must not
        deliver in the moments before the sweep destroys it (the sweep is woken now).
        """
        if is_expired(state.record.termination_time, self.now()):
            self.lifetimes.wake()
            return None
        if is_internal_routing(received):
            return None
        message = decode(received)
        return message if state.filter.matches(message) else None

    def _pusher(
        self, state: _Sub
    ) -> tuple[Callable[[Received], Delivered | None], Callable[[Sequence[Delivered]], None]]:
        sub = state.record

        def prepare(received: Received) -> Delivered | None:
            message = self._accepted(state, received)
            if message is None:
                return None
            rendered = self._render(state, message)
            return Delivered(rendered, sub.id, rendered.subscription_reference)

        def send(batch: Sequence[Delivered]) -> None:
            try:
                with metrics.DELIVERY_SECONDS.time():
                    self.outbound.notify(
                        sub.consumer,
                        sub.soap_version,
                        list(batch),
                        use_raw=sub.use_raw,
                        timeout=self.settings.retry.timeout,
                    )
            except Exception as exc:
                self._failed([d.message for d in batch], sub.id, exc)
                raise
            metrics.NOTIFICATIONS_OUT.labels(mode="push").inc(len(batch))
            self._delivered([d.message for d in batch], sub.id)

        return prepare, send

    def _forward(
        self, state: _Sub, pull_point_id: str, batch: Sequence[NotificationMessage]
    ) -> None:
        """Publish a subscription's accepted messages into its pull point's inbox."""
        with self._lock:
            alive = pull_point_id in self._pps
        if not alive:
            raise DeliveryFailed(f"pull point {pull_point_id} is gone", permanent=True)
        inbox = pull_point_inbox(pull_point_id)
        try:
            self.adapter.publish_many([encode(m, route=inbox) for m in batch])
        except AdapterError as exc:
            failure = DeliveryFailed(f"publishing into the pull point failed: {exc}")
            self._failed(batch, state.record.id, failure)
            raise failure from exc
        metrics.NOTIFICATIONS_OUT.labels(mode="forward").inc(len(batch))

    # ==========================================================================================
    # SubscriptionManager
    # ==========================================================================================

    def get_subscription(self, subscription_id: str) -> Subscription:
        """The subscription (a copy); ResourceUnknown when unknown or expired."""
        return replace(self._live_sub(subscription_id).record)

    def renew(
        self, subscription_id: str, termination: RequestedTime, *, invalid: bool = False
    ) -> Subscription:
        """Set a new termination time (BN §6.1.1)."""
        state = self._live_sub(subscription_id)
        if invalid:
            raise errors.UnacceptableTerminationTime(
                "TerminationTime is empty or not a dateTime/duration"
            )
        if termination is None:
            raise errors.UnacceptableTerminationTime("Renew needs a TerminationTime")
        new_time = self._termination(termination, errors.UnacceptableTerminationTime)
        with self._lock:
            state.record.termination_time = new_time
            self.store.put_subscription(state.record)
        return replace(state.record)

    def unsubscribe(self, subscription_id: str) -> None:
        """Destroy the subscription (BN §6.1.2); no SubscriptionEnd."""
        state = self._live_sub(subscription_id)
        try:
            self._destroy_subscription(state)
        except AdapterError as exc:
            raise errors.UnableToDestroySubscription(str(exc)) from exc

    def pause(self, subscription_id: str) -> None:
        """PauseSubscription: stop delivering, keep accumulating; idempotent."""
        state = self._live_sub(subscription_id)
        # the gate before the lock: publishes hold the gate while they route (lock order)
        with self._gate.exclusive(), self._lock:
            if state.record.state is SubscriptionState.PAUSED:
                return
            if state.direct:
                self._queue_direct(state)
                self.store.put_subscription(state.record)
                return
            channel = self.engine.channel(subscription_id)
            try:
                if channel is not None:
                    channel.stop()
            except AdapterError as exc:
                raise errors.PauseFailed(str(exc)) from exc
            state.record.state = SubscriptionState.PAUSED
            self.store.put_subscription(state.record)
        self.demand.wake()

    def _queue_direct(self, state: _Sub) -> None:
        """Pause a subscription routed at publish time: from now on it has a durable
        subscription of its own, which accumulates while paused (hold the gate)."""
        record = state.record
        self._drop_direct(state)
        record.queued = True
        record.state = SubscriptionState.PAUSED
        try:
            self._attach(state)
        except AdapterError as exc:
            record.queued = False
            record.state = SubscriptionState.ACTIVE
            self._add_direct(state)
            raise errors.PauseFailed(str(exc)) from exc

    def resume(self, subscription_id: str) -> None:
        """ResumeSubscription: deliver what accumulated, in order; no-op when not paused."""
        state = self._live_sub(subscription_id)
        with self._lock:
            if state.record.state is SubscriptionState.ACTIVE:
                return
            channel = self.engine.channel(subscription_id)
            state.record.state = SubscriptionState.ACTIVE
            try:
                if channel is None:
                    self._attach(state)
                else:
                    channel.start()
            except AdapterError as exc:
                state.record.state = SubscriptionState.PAUSED
                raise errors.ResumeFailed(str(exc)) from exc
            self.store.put_subscription(state.record)
        self.demand.wake()

    def end_subscription(self, subscription_id: str, reason: str) -> None:
        """Administrative removal: destroy and publish SubscriptionEnd (NCIA Annex 1)."""
        state = self._live_sub(subscription_id)
        self._finish_subscription(state, reason)

    def _give_up(self, subscription_id: str, reason: str) -> None:
        with self._lock:
            state = self._subs.get(subscription_id)
        if state is None:
            return
        metrics.SUBSCRIPTIONS_ENDED.labels(reason="delivery").inc()
        self._finish_subscription(state, f"consumer unreachable: {reason}")

    def _finish_subscription(self, state: _Sub, reason: str) -> None:
        """End a subscription for a reason other than Unsubscribe/expiry."""
        log.warning("ending subscription %s: %s", state.record.id, reason)
        try:
            self._destroy_subscription(state)
        except AdapterError:
            log.exception("destroying subscription %s failed", state.record.id)
        self._publish_subscription_end(state, reason)

    def _destroy_subscription(self, state: _Sub) -> None:
        sub_id = state.record.id
        with self._lock:
            self._subs.pop(sub_id, None)
            direct = state.direct
            self._drop_direct(state)
        self.engine.close_channel(sub_id)
        try:
            if not direct:
                self.adapter.delete_subscription(sub_id)
        finally:
            self.store.delete_subscription(sub_id)
            self._update_gauges()
            self.demand.wake()

    def _publish_subscription_end(self, state: _Sub, reason: str) -> None:
        sub = state.record
        if sub.subscription_end_topic is None:
            return
        end_topic = state.end_topic
        if end_topic is None:
            try:
                end_topic = self._end_topic(sub.subscription_end_topic)
            except errors.WsnError:
                log.warning("subscription %s: SubscriptionEndTopic unusable", sub.id)
                return
        if end_topic is None:
            return
        topic, dialect = end_topic
        payload = subscription_end_payload(self.subscription_address(sub.id), reason)
        message = NotificationMessage(
            message_id=new_resource_id(),
            payload=payload,
            topic=topic,
            topic_dialect=dialect,
            producer_reference=EndpointReference(self.broker_address),
            published_at=self.now(),
        )
        try:
            self._publish([message])
        except errors.WsnError:
            log.exception("publishing SubscriptionEnd for %s failed", sub.id)

    # ==========================================================================================
    # NotificationConsumer: Notify
    # ==========================================================================================

    def _inbound(
        self, items: Sequence[InboundNotification], *, registration_check: bool
    ) -> list[NotificationMessage]:
        """Validate a Notify's messages and make them NotificationMessages.

        Work that is the same for every message of one Notify is done once: one timestamp,
        one draw of message ids (``new_message_ids``), each topic expression resolved and
        admitted once while consecutive messages repeat it (the frontend hands them one
        shared ``ExpressionSource``), and each producer/topic pair checked against the
        registrations once.  A Notify is still validated in message order and refused as a
        whole at its first invalid message.
        """
        now = self.now()
        ids = new_message_ids(len(items))
        topic_set = self.topic_set
        check = registration_check and self.settings.requires_registration
        registered: set[tuple[str | None, Topic | None]] = set()
        last_source: ExpressionSource | None = None
        last_topic: Topic | None = None
        last_dialect: str | None = None
        out: list[NotificationMessage] = []
        for item, message_id in zip(items, ids, strict=True):
            source = item.topic
            topic: Topic | None = None
            dialect: str | None = None
            if source is not None:
                if source is last_source or source == last_source:
                    topic, dialect = last_topic, last_dialect
                else:
                    topic, dialect = concrete_topic(source, topic_set)
                    with topic_errors():
                        topic_set.admit(topic)
                    last_source, last_topic, last_dialect = source, topic, dialect
            producer = item.producer_reference
            if check:
                key = (producer.address if producer is not None else None, topic)
                if key not in registered:
                    self._check_registered(producer, topic)
                    registered.add(key)
            out.append(
                NotificationMessage(
                    message_id=message_id,
                    payload=item.payload,
                    topic=topic,
                    topic_dialect=dialect,
                    producer_reference=producer,
                    published_at=now,
                    subscription_reference=item.subscription_reference,
                )
            )
        return out

    def _check_registered(self, producer: EndpointReference | None, topic: Topic | None) -> None:
        if producer is not None:
            now = self.now()
            with self._lock:
                regs = list(self._regs.values())
            for reg in regs:
                ref = reg.record.publisher_reference
                if ref is None or ref.address != producer.address:
                    continue
                if is_expired(reg.record.termination_time, now):
                    continue
                if not reg.topics or (
                    topic is not None and any(t.matches(topic) for t in reg.topics)
                ):
                    return
        metrics.NOTIFICATIONS_REJECTED.labels(reason="unregistered").inc()
        who = producer.address if producer is not None else "an anonymous producer"
        raise errors.PublisherRegistrationRejected(
            f"this broker requires registration; {who} is not registered for "
            f"{topic if topic is not None else 'topicless notifications'}"
        )

    def _publish(self, messages: Sequence[NotificationMessage], route: Topic | None = None) -> None:
        if not messages:
            return
        outbound = [encode(m, route=route) for m in messages]
        timeout = self.settings.publish_timeout
        try:
            if route is None and self.adapter.capabilities.sole_publisher:
                with self._gate.shared():
                    outbound.extend(self._direct_routes(messages))
                    receipts = self.adapter.publish_many(outbound, timeout)
            else:
                receipts = self.adapter.publish_many(outbound, timeout)
        except AdapterError as exc:
            raise errors.ResourceUnavailable(
                f"the middleware did not confirm the notifications: {exc}"
            ) from exc
        metrics.NOTIFICATIONS_IN.inc(len(messages))
        if self.plugins is not None and self._observes(_PUBLISHED):
            for m, receipt in zip(messages, receipts, strict=False):
                self.plugins.notification_published(m, receipt)
        if route is None and not self.adapter.capabilities.retained_current_message:
            for m in messages:
                if m.topic is not None:
                    try:
                        self.store.put_current_message(m)
                    except Exception:
                        log.exception("storing the current message failed")

    def _direct_routes(self, messages: Sequence[NotificationMessage]) -> list[OutboundMessage]:
        """Copies of ``messages`` for the pull points of the subscriptions routed at
        publish time, rendered for each subscription (hold the gate shared).  Reads the
        index and ``_subs`` without ``_lock``: single dict/set reads are atomic."""
        if not self._direct_any and not len(self._direct_index):
            return []
        now = self.now()
        copies: list[OutboundMessage] = []
        expired = False
        for message in messages:
            ids = self._direct_index.match(message.topic) if message.topic is not None else set()
            if self._direct_any:
                ids = ids | self._direct_any
            for sub_id in sorted(ids):
                state = self._subs.get(sub_id)
                if state is None or not state.direct:
                    continue
                record = state.record
                if is_expired(record.termination_time, now):
                    expired = True
                    continue
                if not state.filter.matches(message) or record.pull_point_id is None:
                    continue
                copies.append(
                    encode(
                        self._render(state, message), route=pull_point_inbox(record.pull_point_id)
                    )
                )
        if expired:
            self.lifetimes.wake()
        if copies:
            metrics.NOTIFICATIONS_OUT.labels(mode="forward").inc(len(copies))
        return copies

    def notify(self, messages: Sequence[InboundNotification]) -> None:
        """Publish; returns once the middleware confirmed every message (all or nothing
        is validated before anything is published)."""
        self._publish(self._inbound(messages, registration_check=True))

    def get_current_message(self, topic: ExpressionSource) -> NotificationMessage:
        """The last notification on exactly one topic (BN §4.3)."""
        concrete, _ = concrete_topic(topic, self.topic_set)
        if not self.topic_set.permits(concrete):
            raise errors.TopicNotSupported(f"topic {concrete} is not supported")
        message: NotificationMessage | None = None
        if self.adapter.capabilities.retained_current_message:
            try:
                stored = self.adapter.current_message(concrete)
            except AdapterError as exc:
                raise errors.ResourceUnavailable(f"middleware unavailable: {exc}") from exc
            if stored is not None:
                message = decode(stored)
        if message is None:
            message = self.store.get_current_message(concrete)
        if message is None:
            raise errors.NoCurrentMessageOnTopic(f"no current message on topic {concrete}")
        return message

    # ==========================================================================================
    # PullPoints
    # ==========================================================================================

    def _open_pull_point_handle(self, pull_point_id: str) -> SubscriptionHandle:
        return self.adapter.subscription(
            SubscriptionSpec(
                name=pull_point_id,
                patterns=(_inbox_pattern(pull_point_id),),
                limits=self._limits(),
            )
        )

    def create_pull_point(self, req: CreatePullPointRequest) -> PullPoint:
        """CreatePullPoint (BN §5.2); a known ``name`` re-attaches to its pull point."""
        if req.name:
            with self._lock:
                for state in self._pps.values():
                    if state.record.name == req.name and not is_expired(
                        state.record.termination_time, self.now()
                    ):
                        return replace(state.record)
        termination = self._termination(
            req.initial_termination_time,
            errors.UnableToCreatePullPoint,
            default=self.settings.termination.pull_point_default,
        )
        pp = PullPoint(new_resource_id(), self.now(), termination, req.name)
        try:
            handle = self._open_pull_point_handle(pp.id)
            self.store.put_pull_point(pp)
        except AdapterError as exc:
            self._delete_native(pp.id)
            raise errors.UnableToCreatePullPoint(f"the middleware refused: {exc}") from exc
        with self._lock:
            self._pps[pp.id] = _PP(pp, handle)
        self._update_gauges()
        return replace(pp)

    def get_pull_point(self, pull_point_id: str) -> PullPoint:
        """The pull point (a copy); ResourceUnknown when unknown or expired."""
        return replace(self._live_pp(pull_point_id).record)

    def get_messages(self, pull_point_id: str, maximum: int | None) -> list[NotificationMessage]:
        """Destructive FIFO read (BN §5.1.2); None/0 = all available up to the cap."""
        state = self._live_pp(pull_point_id)
        if maximum is not None and maximum < 0:
            raise errors.UnableToGetMessages("MaximumNumber must not be negative")
        limit = maximum if maximum else self.settings.limits.get_messages_cap
        with state.lock:
            try:
                # removed on hand-out: GetMessages is destructive and settles nothing later
                received = state.handle.take(limit)
            except AdapterError as exc:
                raise errors.UnableToGetMessages(f"middleware unavailable: {exc}") from exc
        out: list[NotificationMessage] = []
        for r in received:
            try:
                out.append(decode(r))
            except Exception:
                log.exception("undecodable message in pull point %s dropped", pull_point_id)
        metrics.NOTIFICATIONS_OUT.labels(mode="pull").inc(len(out))
        self._delivered(out, pull_point_id)
        return out

    def notify_pull_point(
        self, pull_point_id: str, messages: Sequence[InboundNotification]
    ) -> None:
        """Notify sent to a pull point: accumulate as received (PP-05)."""
        self._live_pp(pull_point_id)
        prepared = self._inbound(messages, registration_check=False)
        self._publish(prepared, route=pull_point_inbox(pull_point_id))

    def destroy_pull_point(self, pull_point_id: str) -> None:
        """DestroyPullPoint: destroys the subscriptions feeding it too."""
        state = self._live_pp(pull_point_id)
        try:
            self._destroy_pull_point(state)
        except AdapterError as exc:
            raise errors.UnableToDestroyPullPoint(str(exc)) from exc

    def _destroy_pull_point(self, state: _PP) -> None:
        pp_id = state.record.id
        with self._lock:
            self._pps.pop(pp_id, None)
            feeding = [s for s in self._subs.values() if s.record.pull_point_id == pp_id]
        for sub in feeding:
            try:
                self._destroy_subscription(sub)
            except AdapterError:
                log.exception("destroying subscription %s failed", sub.record.id)
        try:
            self.adapter.delete_subscription(pp_id)
        finally:
            self.store.delete_pull_point(pp_id)
            self._update_gauges()

    # ==========================================================================================
    # RegisterPublisher / PublisherRegistrationManager
    # ==========================================================================================

    def _compile_registration_topics(
        self, topics: Sequence[ExpressionSource]
    ) -> tuple[TopicExpression, ...]:
        out: list[TopicExpression] = []
        for source in topics:
            with topic_errors(unknown_dialect=errors.InvalidTopicExpression):
                expr = parse_topic_expression(
                    source.text, source.dialect, source.namespaces, topic_set=self.topic_set
                )
                expr = self.topic_set.validate(expr)
                if expr.is_concrete:
                    self.topic_set.admit(expr.patterns[0].as_topic())
            out.append(expr)
        return tuple(out)

    def register_publisher(self, req: RegisterPublisherRequest) -> PublisherRegistration:
        """RegisterPublisher (BR §6.1)."""
        if req.demand and req.publisher_reference is None:
            raise errors.PublisherRegistrationFailed(
                "Demand=true requires a PublisherReference (REG-04)"
            )
        if req.demand and not req.topics:
            raise errors.InvalidTopicExpression(
                "Demand=true requires at least one Topic to subscribe to at the publisher"
            )
        topics = self._compile_registration_topics(req.topics)
        termination = self._termination(
            req.initial_termination_time,
            errors.UnacceptableInitialTerminationTime,
            default=self.settings.termination.registration_default,
        )
        if req.demand and req.publisher_reference is not None:
            refusal = address_refusal(req.publisher_reference.address, self.settings)
            if refusal is not None:
                raise errors.PublisherRegistrationRejected(
                    f"publisher address {req.publisher_reference.address!r} refused: {refusal}"
                )
        reg = PublisherRegistration(
            id=new_resource_id(),
            creation_time=self.now(),
            termination_time=termination,
            publisher_reference=req.publisher_reference,
            topics=tuple(req.topics),
            demand=req.demand,
        )
        self.store.put_registration(reg)
        with self._lock:
            self._regs[reg.id] = _Reg(reg, topics)
        self._update_gauges()
        if reg.demand:
            self.demand.wake()
        return replace(reg)

    def get_registration(self, registration_id: str) -> PublisherRegistration:
        """The registration (a copy); ResourceUnknown when unknown or expired."""
        return replace(self._live_reg(registration_id).record)

    def destroy_registration(self, registration_id: str) -> None:
        """DestroyRegistration (BR §7.2); a demand subscription is unsubscribed."""
        state = self._live_reg(registration_id)
        self._destroy_registration(state)

    def _destroy_registration(self, state: _Reg) -> None:
        with self._lock:
            self._regs.pop(state.record.id, None)
        try:
            self.store.delete_registration(state.record.id)
        except Exception as exc:
            raise errors.ResourceNotDestroyed(str(exc)) from exc
        self.demand.release(state.record)
        self._update_gauges()

    def _save_registration(self, reg: PublisherRegistration) -> None:
        with self._lock:
            if reg.id in self._regs:
                self.store.put_registration(reg)

    def _demand_entries(self) -> list[DemandEntry]:
        with self._lock:
            return [DemandEntry(r.record, r.topics) for r in self._regs.values() if r.record.demand]

    def _active_topic_filters(self) -> list[TopicExpression | None]:
        now = self.now()
        with self._lock:
            return [
                s.filter.topic
                for s in self._subs.values()
                if s.record.state is SubscriptionState.ACTIVE
                and not is_expired(s.record.termination_time, now)
            ]

    # ==========================================================================================
    # lifetimes
    # ==========================================================================================

    def _full_subscriptions(self) -> list[_Sub]:
        """Subscriptions whose backlog reached ``limits.max_messages`` when the configured
        reaction is to end them (``limits.on_full = "end"``)."""
        lim = self.settings.limits
        if lim.on_full != "end" or lim.max_messages is None:
            return []
        with self._lock:
            states = list(self._subs.values())
        full: list[_Sub] = []
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
        now = self.now()
        with self._lock:
            subs = [s for s in self._subs.values() if is_expired(s.record.termination_time, now)]
            pps = [p for p in self._pps.values() if is_expired(p.record.termination_time, now)]
            regs = [r for r in self._regs.values() if is_expired(r.record.termination_time, now)]
        for sub in self._full_subscriptions():
            metrics.SUBSCRIPTIONS_ENDED.labels(reason="overflow").inc()
            self._finish_subscription(sub, "accumulation limit reached")
        for sub in subs:
            log.info("subscription %s expired", sub.record.id)
            try:
                self._destroy_subscription(sub)
            except AdapterError:
                log.exception("destroying expired subscription %s failed", sub.record.id)
        for pp in pps:
            log.info("pull point %s expired", pp.record.id)
            try:
                self._destroy_pull_point(pp)
            except AdapterError:
                log.exception("destroying expired pull point %s failed", pp.record.id)
        for reg in regs:
            log.info("publisher registration %s expired", reg.record.id)
            try:
                self._destroy_registration(reg)
            except errors.WsnError:
                log.exception("destroying expired registration %s failed", reg.record.id)


def _inbox_pattern(pull_point_id: str) -> PathPattern:
    topic = pull_point_inbox(pull_point_id)
    return PathPattern(topic.namespace, topic.path)


def subscription_end_payload(subscription_address: str, reason: str) -> bytes:
    """The NCIA ``wsn-nato:SubscriptionEnd`` element (Annex 1, A.2/A.3)::

    <wsn-nato:SubscriptionEnd>
      <wsn-nato:SubscriptionReference><wsa:Address>...</wsa:Address></...>
      <wsnmom:Reason>...</wsnmom:Reason>          (##other extension)
    </wsn-nato:SubscriptionEnd>
    """
    root = etree.Element(
        f"{{{NATO_NS}}}SubscriptionEnd",
        nsmap={"wsn-nato": NATO_NS, "wsa": WSA_NS, "wsnmom": WSNMOM_NS},
    )
    ref = etree.SubElement(root, f"{{{NATO_NS}}}SubscriptionReference")
    etree.SubElement(ref, f"{{{WSA_NS}}}Address").text = subscription_address
    etree.SubElement(root, f"{{{WSNMOM_NS}}}Reason").text = reason
    return etree.tostring(root, encoding="UTF-8")
