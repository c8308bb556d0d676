"""A small in-memory stand-in for ``core.service.BrokerService`` used by the frontend unit
tests: it records calls and implements just enough semantics (lifetimes, exact topic
matching, pull point queues) to exercise every code path of the SOAP layer.

It implements ``core.ports.BrokerPort``, the port the frontend is written against; strict
mypy checks that (``scripts/typecheck.sh`` type-checks this file too)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from lxml import etree
from wsnmom.core import errors
from wsnmom.core.cluster import ClusterCounts, ClusterStatus
from wsnmom.core.config import Settings
from wsnmom.core.dead_letter_records import DeadLetter
from wsnmom.core.model import (
    CreatePullPointRequest,
    ExpressionSource,
    InboundNotification,
    NotificationMessage,
    PublisherRegistration,
    PullPoint,
    RegisterPublisherRequest,
    SubscribeRequest,
    Subscription,
    SubscriptionState,
)
from wsnmom.core.operations import (
    AdapterHealth,
    Overview,
    PullPointStatus,
    RegistrationStatus,
    SubscriptionRow,
    SubscriptionStatus,
    SubscriptionTotals,
)
from wsnmom.core.peek import Peeked, PeekResult
from wsnmom.core.policy import BrokerPolicy, build_policy
from wsnmom.core.ports import BrokerPort, BrokerProperties
from wsnmom.core.pull_handout import Settlement, nack_all
from wsnmom.core.rate_history import RatePoint
from wsnmom.topic_mapping.model import Topic

SIMPLE = "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Simple"
CONCRETE = "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Concrete"
MAX = timedelta(days=30)


@dataclass(frozen=True)
class Policy:
    filter_combination: str = "AND"
    default_termination_time: timedelta = timedelta(hours=1)
    use_raw_supported: bool = True
    nested: tuple[str, ...] = ("a", "b")


def _topic(expr: Any) -> Topic | None:
    if expr is None:
        return None
    text = expr.text.strip()
    prefix, _, local = text.rpartition(":")
    ns = expr.namespaces.get(prefix or None, "")
    return Topic(ns, tuple(local.split("/")))


@dataclass
class FakeService:
    base: str = "http://testserver"
    now_value: datetime = field(default_factory=lambda: datetime.now(UTC))
    subs: dict[str, Subscription] = field(default_factory=dict)
    pps: dict[str, PullPoint] = field(default_factory=dict)
    regs: dict[str, PublisherRegistration] = field(default_factory=dict)
    pp_queues: dict[str, list[NotificationMessage]] = field(default_factory=dict)
    notified: list[InboundNotification] = field(default_factory=list)
    calls: list[tuple[str, Any]] = field(default_factory=list)
    is_ready: bool = True
    counter: int = 0
    fail_with: BaseException | None = None

    # --- addresses
    @property
    def broker_address(self) -> str:
        return f"{self.base}/wsn/broker"

    def subscription_address(self, sid: str) -> str:
        return f"{self.base}/wsn/subscriptions/{sid}"

    def pull_point_address(self, pid: str) -> str:
        return f"{self.base}/wsn/pullpoints/{pid}"

    def registration_address(self, rid: str) -> str:
        return f"{self.base}/wsn/registrations/{rid}"

    def now(self) -> datetime:
        return self.now_value

    def ready(self) -> bool:
        return self.is_ready

    def disk_low(self) -> str:
        return ""

    def unready_reason(self) -> str:
        return "" if self.is_ready else "the broker is starting"

    def _id(self, kind: str) -> str:
        self.counter += 1
        return f"{kind}{self.counter:04d}"

    def _check(self) -> None:
        if self.fail_with is not None:
            raise self.fail_with

    def _termination(self, value: Any, invalid: bool, fault: type[errors.WsnError]) -> datetime:
        if invalid:
            raise fault("invalid termination time")
        now = self.now()
        if value is None:
            return now + timedelta(hours=1)
        if not isinstance(value, datetime):
            value = now + value  # timedelta or isodate.Duration
        assert isinstance(value, datetime)
        if value <= now:
            raise fault("termination time is not in the future")
        if value > now + MAX:
            err = fault("termination time beyond the maximum")
            err.maximum_time = now + MAX  # type: ignore[attr-defined]
            raise err
        return value

    # --- producer
    def subscribe(self, req: SubscribeRequest) -> Subscription:
        self._check()
        self.calls.append(("subscribe", req))
        if req.topic is not None and req.topic.dialect not in (None, SIMPLE, CONCRETE):
            raise errors.TopicExpressionDialectUnknown(f"unknown dialect {req.topic.dialect}")
        if req.producer_properties is not None:
            raise errors.InvalidProducerPropertiesExpression("ProducerProperties unsupported")
        if req.unsupported_policy:
            raise errors.UnrecognizedPolicyRequest(
                "unknown policy", policies=tuple(req.unsupported_policy)
            )
        term = self._termination(
            req.initial_termination_time,
            req.initial_termination_time_invalid,
            errors.UnacceptableInitialTerminationTime,
        )
        sub = Subscription(
            id=self._id("s"),
            consumer=req.consumer,
            creation_time=self.now(),
            termination_time=term,
            topic=req.topic,
            message_content=req.message_content,
            filter_xml=req.filter_xml,
            policy_xml=req.policy_xml,
            use_raw=req.use_raw,
            subscription_end_topic=req.subscription_end_topic,
            soap_version=req.soap_version,
        )
        self.subs[sub.id] = sub
        return sub

    def get_subscription(self, sid: str) -> Subscription:
        try:
            return self.subs[sid]
        except KeyError:
            raise errors.ResourceUnknown(f"no subscription {sid}") from None

    def renew(self, sid: str, termination: Any, *, invalid: bool = False) -> Subscription:
        sub = self.get_subscription(sid)
        sub.termination_time = self._termination(
            termination, invalid, errors.UnacceptableTerminationTime
        )
        return sub

    def unsubscribe(self, sid: str) -> None:
        self.get_subscription(sid)
        del self.subs[sid]

    def pause(self, sid: str) -> None:
        self.get_subscription(sid).state = SubscriptionState.PAUSED

    def resume(self, sid: str) -> None:
        self.get_subscription(sid).state = SubscriptionState.ACTIVE

    def notify(self, messages: Sequence[InboundNotification]) -> None:
        self._check()
        self.notified.extend(messages)

    def get_current_message(self, topic: Any) -> NotificationMessage:
        wanted = _topic(topic)
        for m in reversed(self.notified):
            if _topic(m.topic) == wanted:
                return NotificationMessage("m", m.payload, wanted)
        raise errors.NoCurrentMessageOnTopic("nothing published on that topic")

    # --- pull points
    def create_pull_point(self, req: CreatePullPointRequest) -> PullPoint:
        pp = PullPoint(self._id("p"), self.now(), self.now() + timedelta(days=1), req.name)
        self.pps[pp.id] = pp
        self.pp_queues[pp.id] = []
        return pp

    def get_pull_point(self, pid: str) -> PullPoint:
        try:
            return self.pps[pid]
        except KeyError:
            raise errors.ResourceUnknown(f"no pull point {pid}") from None

    def get_messages(self, pid: str, maximum: int | None) -> list[NotificationMessage]:
        self.get_pull_point(pid)
        queue = self.pp_queues[pid]
        n = maximum if maximum else len(queue)
        out, self.pp_queues[pid] = queue[:n], queue[n:]
        return out

    def hand_out_messages(
        self, pid: str, maximum: int | None
    ) -> tuple[list[NotificationMessage], Settlement]:
        return self.get_messages(pid, maximum), Settlement((), nack_all)

    def destroy_pull_point(self, pid: str) -> None:
        self.get_pull_point(pid)
        del self.pps[pid]

    def renew_pull_point(self, pid: str, termination: Any) -> PullPoint:
        pp = self.get_pull_point(pid)
        pp.termination_time = self._termination(
            termination, False, errors.UnacceptableTerminationTime
        )
        return pp

    def synchronize(self, sid: str) -> int:
        self.get_subscription(sid)
        return 0

    def notify_pull_point(self, pid: str, messages: Sequence[InboundNotification]) -> None:
        self.get_pull_point(pid)
        for m in messages:
            self.pp_queues[pid].append(
                NotificationMessage(
                    f"m{len(self.pp_queues[pid])}",
                    m.payload,
                    _topic(m.topic),
                    m.topic.dialect if m.topic else None,
                    m.producer_reference,
                )
            )

    # --- registrations
    def register_publisher(self, req: RegisterPublisherRequest) -> PublisherRegistration:
        reg = PublisherRegistration(
            self._id("r"),
            self.now(),
            self.now() + timedelta(days=1),
            req.publisher_reference,
            req.topics,
            req.demand,
        )
        self.regs[reg.id] = reg
        return reg

    def get_registration(self, rid: str) -> PublisherRegistration:
        try:
            return self.regs[rid]
        except KeyError:
            raise errors.ResourceUnknown(f"no registration {rid}") from None

    def renew_registration(
        self, rid: str, termination: Any, *, invalid: bool = False
    ) -> PublisherRegistration:
        reg = self.get_registration(rid)
        reg.termination_time = self._termination(
            termination, invalid, errors.UnacceptableTerminationTime
        )
        return reg

    def destroy_registration(self, rid: str) -> None:
        self.get_registration(rid)
        del self.regs[rid]

    # --- operators
    def overview(self, limit: int | None = None) -> Overview:
        health = AdapterHealth("fake", "fake://", "queue", True, True, True, self.is_ready)
        subs = self.subscription_statuses()
        backlogs = [s.backlog for s in subs if s.mode != "routed"]
        totals = SubscriptionTotals(
            count=len(subs),
            paused=sum(1 for s in subs if s.record.state is SubscriptionState.PAUSED),
            failing=sum(1 for s in subs if s.delivery is not None and s.delivery.failures),
            backlog=sum(b for b in backlogs if b is not None),
            backlog_unknown=sum(1 for b in backlogs if b is None),
        )
        return Overview(
            time=self.now().timestamp(),
            health=health,
            subscriptions=subs[:limit],
            subscription_totals=totals,
            pull_points=[
                PullPointStatus(pp, self.pull_point_address(pp.id), len(self.pp_queues[pp.id]), ())
                for pp in self.pps.values()
            ],
            registrations=[
                RegistrationStatus(reg, self.registration_address(reg.id))
                for reg in self.regs.values()
            ],
            topics=[],
            topics_forgotten=0,
        )

    def subscription_statuses(
        self, ids: Sequence[str] | None = None, *, depths: bool = True
    ) -> list[SubscriptionStatus]:
        return [self.subscription_status(sid) for sid in (self.subs if ids is None else ids)]

    def subscription_rows(
        self, *, depths: bool = False, delivery: bool = True
    ) -> list[SubscriptionRow]:
        return [
            SubscriptionRow(
                s.record.id,
                s.record.consumer.address,
                s.record.topic,
                s.record.state is SubscriptionState.PAUSED,
                s.record.creation_time,
                s.record.termination_time,
                s.waiting,
                s.delivery if delivery else None,
            )
            for s in self.subscription_statuses()
        ]

    def rate_history(self) -> list[RatePoint]:
        return []

    def cluster_status(self) -> ClusterStatus:
        return ClusterStatus("fake", False, True, 64, 10.0, {}, None, ClusterCounts())

    def subscription_status(self, sid: str) -> SubscriptionStatus:
        sub = self.get_subscription(sid)
        return SubscriptionStatus(sub, self.subscription_address(sid), "push", 0, None)

    def purge_subscription(self, sid: str) -> int | None:
        self.get_subscription(sid)
        return 0

    def peek_subscription(self, sid: str, count: int) -> PeekResult:
        self.get_subscription(sid)
        return PeekResult([], False, "the fake middleware cannot peek")

    def peek_pull_point(self, pid: str, count: int) -> PeekResult:
        self.get_pull_point(pid)
        shown = [Peeked(m, "middleware", None, None) for m in self.pp_queues[pid][:count]]
        return PeekResult(shown, True)

    def dead_letters(self, destination: str | None = None) -> list[DeadLetter]:
        return []

    def dead_letter(self, letter_id: str) -> DeadLetter:
        raise errors.ResourceUnknown(f"no dead letter {letter_id!r}")

    def replay_dead_letter(self, letter_id: str, consumer: str | None = None) -> str:
        raise errors.ResourceUnknown(f"no dead letter {letter_id!r}")

    def purge_dead_letters(
        self, letter_ids: Sequence[str] | None = None, destination: str | None = None
    ) -> int:
        return 0

    def purge_pull_point(self, pid: str) -> int | None:
        self.get_pull_point(pid)
        dropped = len(self.pp_queues[pid])
        self.pp_queues[pid] = []
        return dropped

    # --- properties
    def broker_properties(self) -> BrokerProperties:
        ts = etree.fromstring(
            b'<wstop:TopicSet xmlns:wstop="http://docs.oasis-open.org/wsn/t-1" '
            b'xmlns:t="urn:t"><t:a wstop:topic="true"/></wstop:TopicSet>'
        )
        return BrokerProperties(
            topic_expressions=[ExpressionSource(SIMPLE, "t:a", {"t": "urn:t"})],
            fixed_topic_set=False,
            dialects=(SIMPLE, CONCRETE),
            topic_set=ts,
            requires_registration=False,
        )

    def policy(self) -> BrokerPolicy:
        return build_policy(Settings(), message_content_dialects=())


def as_port(service: FakeService) -> BrokerPort:
    """The fake as the frontend sees it (strict mypy checks it implements the port)."""
    return service
