"""The broker policy document: every behaviour the specifications leave open, as decided by
this broker and its configuration (NCIA §2.3; docs/conformance.md lists the rules).

``BrokerPolicy`` is plain data; the SOAP frontend renders it as XML (resource property,
``GET /wsn/policy``, WS-Policy assertions in the WSDL).  ``as_dict`` gives a JSON-able view.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from wsnmom.core.config import LimitSettings, RetrySettings, Settings
from wsnmom.core.dead_letter_records import REASONS
from wsnmom.core.delivery_policy import BACKOFFS, ORDERINGS


def xsd_duration(value: timedelta | None) -> str | None:
    """``timedelta`` as an xsd:duration (``PT3600S`` style), None stays None."""
    if value is None:
        return None
    seconds = value.total_seconds()
    text = f"{seconds:.3f}".rstrip("0").rstrip(".")
    return f"PT{text}S"


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retries towards unreachable consumers (NCIA §2.3.2)."""

    max_attempts: int
    initial_delay: timedelta
    multiplier: float
    max_delay: timedelta
    #: "keep": keep accumulating and retry at max_delay forever; "end": end the
    #: subscription (SubscriptionEnd when requested)
    give_up: str


@dataclass(frozen=True, slots=True)
class AccumulationPolicy:
    """Bounds of what a subscription or pull point keeps undelivered."""

    max_messages: int | None
    max_bytes: int | None
    #: retention time of undelivered notifications
    retention: timedelta | None
    #: "drop_oldest" (dispose of earlier ones, keep accumulating) or "drop_newest"
    #: (ignore the most recent ones)
    overflow: str
    #: "drop": apply ``overflow``; "end": end the subscription when its backlog is full
    on_full: str
    #: who enforces each bound: "middleware" (as messages arrive), "gateway" (when
    #: handed out, or every sweep) or "not enforced" (the middleware cannot measure it)
    enforced_by: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DeadLetterPolicy:
    """Where messages the broker gives up on go (``core.dead_letters``)."""

    enabled: bool
    #: the destination of subscriptions that name none
    default_destination: str
    #: how a subscriber names its own destination
    subscribe_extension: str
    #: why a message becomes a dead letter
    reasons: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DeliveryPolicyOffer:
    """The per-subscription delivery policy a subscriber may choose
    (``core.delivery_policy``): the gateway's values are the defaults, and the bounds."""

    #: how a subscriber chooses
    subscribe_extension: str
    #: default and most attempts per batch
    max_attempts: int
    #: default backoff and the choices
    backoff: str
    backoffs: tuple[str, ...]
    #: default first delay; delays (first and most) may be 0 up to ``max_delay``
    initial_delay: timedelta
    max_delay: timedelta
    #: exponential backoff's factor (the gateway's ``retry.multiplier``)
    multiplier: float
    #: default and longest timeout of each attempt
    timeout: timedelta
    #: whether Retry-After is honoured by default, and its default and highest cap
    retry_after: bool
    retry_after_max: timedelta
    #: statuses that are final by default (none: every failure is retried)
    final_statuses: tuple[int, ...]
    #: what an exhausted batch leads to (the gateway's ``retry.give_up``)
    give_up: str
    #: default ordering and the choices (``delivery.ordering``)
    ordering: str = "ordered"
    orderings: tuple[str, ...] = ()
    #: default and most deliveries in flight of an unordered subscription
    in_flight: int = 4
    max_in_flight: int = 16


@dataclass(frozen=True, slots=True)
class BrokerPolicy:
    """Everything the broker advertises about its behaviour."""

    #: several Filter children: all must accept (logical AND)
    filter_combination: str
    #: what a subscription without a TopicExpression receives
    no_topic_filter: str
    #: MessageContent dialects; XPath result conversion
    message_content_dialects: tuple[str, ...]
    message_content_evaluation: str
    producer_properties: str
    default_termination_time: timedelta
    maximum_termination_time: timedelta | None
    infinite_termination_allowed: bool
    #: termination time beyond the maximum (Subscribe / Renew / RegisterPublisher)
    termination_beyond_maximum: str
    termination_at_expiry: str
    pull_point_default_termination_time: timedelta
    registration_default_termination_time: timedelta
    retry: RetryPolicy
    accumulation: AccumulationPolicy
    #: what a paused subscription does and what ResumeSubscription delivers (RES-05)
    pause_behaviour: str
    delivery_order: str
    delivery_guarantee: str
    batching: int
    #: GetMessages: order, MaximumNumber handling, cap when absent/0
    get_messages_order: str
    get_messages_maximum_number: str
    get_messages_cap: int
    pull_point_notify: str
    pull_point_destroy_with_subscriptions: str
    unused_pull_points: str
    use_raw_supported: bool
    #: demand-based publishing behaviour
    demand: str
    register_publisher_without_reference: str
    requires_registration: bool
    unregistered_notify: str
    topicless_notify: str
    #: the Dialect of the Topic consumers receive (META-04, ``topic_dialect``)
    topic_dialect: str
    unknown_topic_notify: str
    fixed_topic_set: bool
    current_message: str
    subscription_end: str
    subscription_persistence: str
    dead_letters: DeadLetterPolicy
    delivery_policy: DeliveryPolicyOffer

    def as_dict(self) -> dict[str, Any]:
        """JSON-able view; durations as xsd:duration strings."""

        def conv(value: Any) -> Any:
            if isinstance(value, timedelta):
                return xsd_duration(value)
            if dataclasses.is_dataclass(value) and not isinstance(value, type):
                return {f.name: conv(getattr(value, f.name)) for f in dataclasses.fields(value)}
            if isinstance(value, tuple):
                return [conv(v) for v in value]
            return value

        result = conv(self)
        assert isinstance(result, dict)
        return result


#: DeliveryOrder, by the adapter's ``Capabilities.ordering``
DELIVERY_ORDER = {
    "subscription": "FIFO per subscription",
    "partition": (
        "FIFO per partition of the middleware's log, for each subscription: notifications "
        "of one partition (with the gateway's own publishes: of one topic) arrive in order; "
        "those of different partitions, of a natively produced topic too, may interleave"
    ),
    "none": "unordered: the middleware keeps no order",
}
#: GetMessagesOrder, by the same
GET_MESSAGES_ORDER = {
    "subscription": "FIFO (oldest first)",
    "partition": "FIFO per partition of the middleware's log (oldest first within one)",
    "none": "unordered",
}


def build_policy(
    settings: Settings,
    *,
    message_content_dialects: tuple[str, ...],
    use_raw: bool = True,
    limits_enforced_by: dict[str, str] | None = None,
    ordering: str = "subscription",
) -> BrokerPolicy:
    """The policy the broker runs with under ``settings``; ``limits_enforced_by`` says who
    enforces each accumulation bound (``core.limits.LimitKeeper.enforcement``), ``ordering``
    what order the adapter keeps (``Capabilities.ordering``)."""
    t = settings.termination
    r = settings.retry
    lim = settings.limits
    return BrokerPolicy(
        filter_combination="AND",
        no_topic_filter="all notifications, topicless ones included",
        message_content_dialects=message_content_dialects,
        message_content_evaluation=(
            "XPath 1.0 over the payload element in its own document; result converted "
            "with boolean(); prefixes from the MessageContent element's scope"
        ),
        producer_properties="unsupported: InvalidProducerPropertiesExpressionFault",
        default_termination_time=t.default,
        maximum_termination_time=t.maximum,
        infinite_termination_allowed=t.allow_infinite,
        termination_beyond_maximum=(
            "fault: UnacceptableInitialTerminationTimeFault / UnacceptableTerminationTimeFault "
            "with MaximumTime (a shorter lifetime than requested is never granted)"
        ),
        termination_at_expiry="destroyed (durable subscription deleted); no SubscriptionEnd",
        pull_point_default_termination_time=t.pull_point_default,
        registration_default_termination_time=t.registration_default,
        retry=_retry_policy(r),
        accumulation=_accumulation_policy(lim, limits_enforced_by),
        pause_behaviour=(
            "paused subscriptions keep accumulating (bounded by the accumulation policy); "
            "ResumeSubscription delivers everything accumulated, in order (RES-05 option 1)"
        ),
        delivery_order=_delivery_order(settings, ordering),
        delivery_guarantee=(
            "at-least-once: acknowledged to the middleware only after the consumer answered "
            "2xx; undelivered notifications survive restarts in the durable subscription; "
            "GetMessages settles a message only once the server wrote the whole answer "
            "carrying it: an answer not written (a gateway killed meanwhile, a failed "
            "write) is handed out again by the next GetMessages"
        ),
        batching=settings.delivery.batch_size,
        get_messages_order=GET_MESSAGES_ORDER[ordering],
        get_messages_maximum_number=(
            "MaximumNumber=n returns at most n and at most get_messages_cap; absent or 0 "
            "returns all available up to get_messages_cap; messages beyond stay in the pull "
            "point for later GetMessages"
        ),
        get_messages_cap=lim.get_messages_cap,
        pull_point_notify=(
            "pull points accept Notify; subscriptions whose consumer is one of this "
            "broker's pull points feed it internally (durably)"
        ),
        pull_point_destroy_with_subscriptions=(
            "DestroyPullPoint (and pull point expiry) destroys the subscriptions feeding it"
        ),
        unused_pull_points="removed at their termination time only",
        use_raw_supported=use_raw,
        demand=(
            "the broker subscribes to a demand-based publisher when the first active "
            "subscription overlapping its registered topics appears, pauses that "
            "subscription when none is left (falls back to Unsubscribe when pausing fails), "
            "resumes it on new demand, and unsubscribes on DestroyRegistration or expiry"
        ),
        register_publisher_without_reference=(
            "accepted (also without Topic: any topic); such a registration cannot identify "
            "its publisher and so does not authorise Notify when registration is required"
        ),
        requires_registration=settings.requires_registration,
        unregistered_notify=(
            "fault PublisherRegistrationRejectedFault (nothing of the Notify is published)"
            if settings.requires_registration
            else "accepted and distributed"
        ),
        topicless_notify=(
            "accepted; delivered only to subscriptions without a TopicExpression filter"
        ),
        topic_dialect=(
            "Concrete for every topic and consumer"
            if settings.topic_dialect == "concrete"
            else "the dialect of the subscriber's TopicExpression (BN 3.1); without one, "
            "Simple for a root topic and Concrete otherwise; pull points and "
            "GetCurrentMessage: the publisher's"
        ),
        unknown_topic_notify=(
            "TopicNotSupportedFault (fixed topic set)"
            if settings.fixed_topic_set
            else "topic added to the topic set and distributed"
        ),
        fixed_topic_set=settings.fixed_topic_set,
        current_message="last notification per concrete topic, kept durably",
        subscription_end=(
            "NCIA SubscriptionEnd published on the subscriber's SubscriptionEndTopic when the "
            "broker ends a subscription for any reason other than Unsubscribe or expiry"
        ),
        subscription_persistence=(
            "subscriptions, pull points, registrations and current messages are stored; "
            "restored after restart, expired ones removed"
        ),
        dead_letters=_dead_letter_policy(settings),
        delivery_policy=_delivery_policy_offer(settings),
    )


def _retry_policy(r: RetrySettings) -> RetryPolicy:
    """The retry part of the policy (``[retry]``)."""
    return RetryPolicy(
        max_attempts=r.max_attempts,
        initial_delay=r.initial_delay,
        multiplier=r.multiplier,
        max_delay=r.max_delay,
        give_up=r.give_up,
    )


def _accumulation_policy(
    lim: LimitSettings, limits_enforced_by: dict[str, str] | None
) -> AccumulationPolicy:
    """The accumulation bounds (``[limits]``) and who enforces each."""
    return AccumulationPolicy(
        max_messages=lim.max_messages,
        max_bytes=lim.max_bytes,
        retention=lim.max_age,
        overflow=lim.overflow,
        on_full=lim.on_full,
        enforced_by=dict(limits_enforced_by or {}),
    )


def _delivery_order(settings: Settings, ordering: str) -> str:
    """DeliveryOrder: the adapter's order, kept only by ordered deliveries."""
    return (
        DELIVERY_ORDER[ordering]
        if settings.delivery.ordering == "ordered"
        else "none by default: several deliveries in flight per subscription (delivery."
        "ordering unordered); with wsnmom:DeliveryPolicy Ordering ordered: "
        + DELIVERY_ORDER[ordering]
    )


def _dead_letter_policy(settings: Settings) -> DeadLetterPolicy:
    """The dead-letter part of the policy (``[dead_letters]``)."""
    return DeadLetterPolicy(
        enabled=settings.dead_letters.enabled,
        default_destination=settings.dead_letters.destination,
        subscribe_extension=(
            "{urn:wsnmom:ns:1}DeadLetters in wsnt:SubscriptionPolicy: the destination "
            "name, 1 to 64 letters, digits, '-' or '_' (SubscribeCreationFailedFault "
            "otherwise)"
        ),
        reasons=REASONS,
    )


def _delivery_policy_offer(settings: Settings) -> DeliveryPolicyOffer:
    """What a subscriber may ask in wsnmom:DeliveryPolicy, and this gateway's values."""
    r = settings.retry
    return DeliveryPolicyOffer(
        subscribe_extension=(
            "{urn:wsnmom:ns:1}DeliveryPolicy in wsnt:SubscriptionPolicy, with any of the "
            "children MaxAttempts, Backoff (exponential|linear), InitialDelay, MaxDelay, "
            "Timeout (xsd:duration or seconds), RetryAfter (true|false), RetryAfterMax, "
            "FinalStatuses (HTTP statuses 300-599), Ordering (ordered|unordered), "
            "InFlight (deliveries at once when unordered): absent ones take this "
            "gateway's value, each bounded by it (SubscribeCreationFailedFault otherwise)"
        ),
        max_attempts=r.max_attempts,
        backoff="exponential",
        backoffs=BACKOFFS,
        initial_delay=r.initial_delay,
        max_delay=r.max_delay,
        multiplier=r.multiplier,
        timeout=timedelta(seconds=r.timeout),
        retry_after=r.honour_retry_after,
        retry_after_max=r.retry_after_max,
        final_statuses=tuple(r.final_statuses),
        give_up=r.give_up,
        ordering=settings.delivery.ordering,
        orderings=ORDERINGS,
        in_flight=min(settings.delivery.in_flight, settings.delivery.max_in_flight),
        max_in_flight=settings.delivery.max_in_flight,
    )
