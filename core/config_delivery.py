"""The settings sections of delivery (``core.config_model``): how long resources live
(``[termination]``), retries and give-ups (``[retry]``), dead letters (``[dead_letters]``),
the queue limits (``[limits]``), the delivery engine (``[delivery]``), outbound calls
(``[outbound]``) and MessageContent filters (``[filters]``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal

from wsnmom.core.config_values import limits


@dataclass(slots=True)
class TerminationSettings:
    """Lifetimes of subscriptions, pull points and registrations."""

    #: granted when Subscribe / CreatePullPoint / RegisterPublisher gives no time
    default: timedelta = field(default=timedelta(hours=1), metadata=limits(above=0))
    #: longest lifetime granted; a longer request is refused with the
    #: Unacceptable(Initial)TerminationTimeFault (ITT-03 / REN-04 forbid granting less)
    maximum: timedelta | None = field(default=timedelta(days=30), metadata=limits(above=0))
    #: whether ``xsi:nil`` (infinite) requests are granted
    allow_infinite: bool = False
    #: pull points: default lifetime (CreatePullPoint has no lifetime parameter)
    pull_point_default: timedelta = field(default=timedelta(days=1), metadata=limits(above=0))
    #: publisher registrations: default lifetime
    registration_default: timedelta = field(default=timedelta(days=1), metadata=limits(above=0))
    #: how often the lifetime scheduler looks for expired resources
    sweep_interval: timedelta = field(default=timedelta(seconds=1), metadata=limits(above=0))
    #: how often the orphan sweep looks for durable subscriptions without a record (stale
    #: intents; listed names, where the adapter lists its own: ``core.orphans``); 0 turns
    #: the orphan sweep off
    orphan_sweep_interval: timedelta = field(default=timedelta(minutes=5), metadata=limits(0))
    #: how old an intent without a record must be, or how long a listed durable
    #: subscription must stay without a record, before the orphan sweep removes it
    orphan_grace: timedelta = field(default=timedelta(minutes=10), metadata=limits(0))


@dataclass(slots=True)
class RetrySettings:
    """Push delivery retries (NCIA §2.3.2)."""

    #: delivery attempts per batch, the first one included
    max_attempts: int = field(default=8, metadata=limits(1))
    initial_delay: timedelta = field(default=timedelta(seconds=1), metadata=limits(0))
    multiplier: float = field(default=2.0, metadata=limits(1))
    max_delay: timedelta = field(default=timedelta(minutes=5), metadata=limits(0))
    #: after ``max_attempts``: "keep" retries at ``max_delay`` forever while the
    #: middleware accumulates; "end" ends the subscription (SubscriptionEnd is published)
    give_up: Literal["keep", "end"] = "end"
    #: timeout of one outbound Notify, seconds
    timeout: float = field(default=10.0, metadata=limits(above=0))
    #: whether a consumer's ``Retry-After`` (with HTTP 429 or 503) sets the delay before
    #: the next attempt, for subscriptions that do not choose (``wsnmom:DeliveryPolicy``)
    honour_retry_after: bool = False
    #: the longest ``Retry-After`` honoured (a longer one is cut to this), and the most a
    #: subscriber's ``RetryAfterMax`` may be
    retry_after_max: timedelta = field(default=timedelta(minutes=5), metadata=limits(0))
    #: HTTP statuses after which a batch is not retried but goes to the dead letters at
    #: once (subscriptions that do not choose); 300 to 599
    final_statuses: list[int] = field(default_factory=list, metadata=limits(check="http_statuses"))


@dataclass(slots=True)
class DeadLetterSettings:
    """Where messages the gateway gives up on go (``core.dead_letters``)."""

    #: publish given-up messages to a dead-letter destination before settling them
    #: (False: they are dropped, as before dead letters existed)
    enabled: bool = True
    #: the destination of subscriptions that name none (``wsnmom:DeadLetters``): 1 to 64
    #: letters, digits, "-" or "_"
    destination: str = field(default="default", metadata=limits(check="dead_letter_destination"))
    #: dead letters of one destination the gateway holds for listing, replay and purge
    #: (the oldest ones; the rest wait in the middleware)
    list_max: int = field(default=1000, metadata=limits(1, 100_000))


@dataclass(slots=True)
class LimitSettings:
    """What a subscription or pull point accumulates; None = unbounded."""

    max_messages: int | None = field(default=100_000, metadata=limits(1))
    max_bytes: int | None = field(default=256 * 1024 * 1024, metadata=limits(1))
    #: retention: messages older than this are discarded undelivered
    max_age: timedelta | None = field(default=timedelta(days=7), metadata=limits(above=0))
    overflow: Literal["drop_oldest", "drop_newest"] = "drop_oldest"
    #: when a push subscription's backlog reaches ``max_messages``: "drop" (apply
    #: ``overflow`` and go on) or "end" (end the subscription, SubscriptionEnd published;
    #: checked by the lifetime sweep)
    on_full: Literal["drop", "end"] = "drop"
    #: cap on messages one GetMessages returns when MaximumNumber is absent or 0
    get_messages_cap: int = field(default=1000, metadata=limits(1))


@dataclass(slots=True)
class DeliverySettings:
    """Push delivery engine."""

    #: worker threads shared by all push subscriptions (always running)
    workers: int = field(default=8, metadata=limits(1, 1024))
    #: notifications per outbound Notify (wrapped form; raw sends one per message)
    batch_size: int = field(default=10, metadata=limits(1))
    #: unsettled messages per subscription held in memory
    prefetch: int = field(default=64, metadata=limits(1, 65535))
    #: most threads while deliveries wait on slow consumers (at least ``workers``)
    max_workers: int = field(default=256, metadata=limits(1, 4096))
    #: most deliveries in progress to one destination (scheme, host, port) at once;
    #: 0: half of ``workers``
    per_destination: int = field(default=0, metadata=limits(0, 1024))
    #: most deliveries in progress to all the ports of one host at once; 0: one and a
    #: half times ``per_destination`` (rounded up)
    per_host: int = field(default=0, metadata=limits(0, 4096))
    #: most deliveries in progress for the subscriptions of one owner (identity;
    #: anonymous subscriptions are not limited) at once; 0: a quarter of ``max_workers``
    per_owner: int = field(default=0, metadata=limits(0, 4096))
    #: bytes of messages delivery may hold in memory over all subscriptions (what does
    #: not fit stays in the middleware until there is room)
    memory: int = field(default=256 * 1024 * 1024, metadata=limits(64 * 1024))
    #: bytes of messages delivery may hold for the subscriptions of one owner
    memory_per_owner: int = field(default=64 * 1024 * 1024, metadata=limits(64 * 1024))
    #: seconds after which a busy thread counts as held by a slow consumer (more threads
    #: are started when all are)
    slow_after: float = field(default=0.2, metadata=limits(above=0))
    #: consecutive deliveries without an answer within ``retry.timeout`` that open a
    #: destination's circuit
    breaker_failures: int = field(default=3, metadata=limits(1, 1000))
    #: seconds a destination's circuit first stays open (doubles after each failed probe,
    #: up to ``retry.max_delay``)
    breaker_open: timedelta = field(default=timedelta(seconds=5), metadata=limits(above=0))
    #: how a push subscription's messages are delivered unless its subscriber chose
    #: (``wsnmom:DeliveryPolicy/Ordering``): "ordered" (one batch at a time, in arrival
    #: order) or "unordered" (several at once, each retried on its own)
    ordering: Literal["ordered", "unordered"] = "ordered"
    #: deliveries in flight at once for an unordered subscription whose subscriber did not
    #: choose (``InFlight``); at most ``max_in_flight``
    in_flight: int = field(default=4, metadata=limits(1, 1024))
    #: the most deliveries in flight a subscriber may choose for an unordered subscription
    max_in_flight: int = field(default=16, metadata=limits(1, 1024))


@dataclass(slots=True)
class OutboundSettings:
    """Which consumer / publisher addresses the broker may call."""

    #: host patterns (fnmatch) or CIDR networks that are allowed; empty = all
    allow: list[str] = field(default_factory=list)
    #: host patterns or CIDR networks that are refused
    deny: list[str] = field(default_factory=list)
    #: consumers on loopback addresses (127.0.0.0/8, ::1, localhost); the strict profile
    #: (docs/security.md) sets it false
    allow_loopback: bool = True
    allow_link_local: bool = False
    #: consumers on private and internal networks (10/8, 172.16/12, 192.168/16,
    #: 100.64/10, 192.0.0.0/24, 198.18/15, fc00::/7); the strict profile sets it false
    allow_private: bool = True
    #: consumers on the cloud providers' instance metadata addresses (169.254.169.254,
    #: fd00:ec2::254, 100.100.100.200, 192.0.0.192, ...): refused in every spelling unless
    #: this is true
    allow_cloud_metadata: bool = False
    #: URL schemes allowed for consumer addresses
    schemes: list[str] = field(default_factory=lambda: ["http", "https"])
    #: seconds the checked addresses of a host name are reused for outbound calls
    #: (0: resolve and check before every call)
    resolve_cache: float = field(default=10.0, metadata=limits(0, 3600))


@dataclass(slots=True)
class FilterSettings:
    """MessageContent filters: what an expression may use, what evaluating it may cost
    (docs/security.md)."""

    #: allow the EXSLT regular-expression functions (``re:test``, ``re:match``,
    #: ``re:replace``); their time is unbounded (backtracking), so they are off unless
    #: an operator trusts the subscribers or keeps ``isolation = "process"``
    exslt_regex: bool = False
    #: longest expression accepted, characters
    max_expression_length: int = field(default=2048, metadata=limits(1, 1_000_000))
    #: deepest nesting of parentheses and predicates accepted
    max_nesting: int = field(default=16, metadata=limits(1, 1000))
    #: "process": evaluated in worker processes, each message within ``cpu_limit`` and
    #: ``memory`` (a subscription whose filter exceeds them is ended with
    #: SubscriptionEnd); "inline": in the delivery threads without any budget (trusted
    #: subscribers only)
    isolation: Literal["process", "inline"] = "process"
    #: CPU seconds parsing and evaluating one message may take
    cpu_limit: float = field(default=0.5, metadata=limits(above=0, maximum=3600))
    #: address space of each evaluation process, MiB
    memory: int = field(default=512, metadata=limits(64))
    #: evaluation processes for cheap filters (shared by all subscriptions); costly ones
    #: have ``ceil(costly_share)`` processes of their own, ``costly_nice`` lower
    processes: int = field(default=2, metadata=limits(1, 64))
    #: the share of one evaluation process a costly subscription (messages over a tenth
    #: of ``cpu_limit`` each) may use over time (usage decays with a 10 s half-life);
    #: beyond it its deliveries wait
    cpu_share: float = field(default=0.1, metadata=limits(above=0, maximum=64))
    #: the share of one evaluation process all costly subscriptions together (and those
    #: not yet known to be cheap) may use over time; beyond it they wait as above
    costly_share: float = field(default=0.25, metadata=limits(above=0, maximum=64))
    #: seconds a costly subscription may stay over its ``cpu_share`` before it is ended
    #: with SubscriptionEnd; 0: never (it is only pushed back)
    over_share_end: float = field(default=60.0, metadata=limits(0, 86400))
    #: how much lower than the gateway's the scheduling priority (nice value) of the
    #: costly filters' processes is, so that the kernel runs them when the gateway and
    #: the cheap filters leave a CPU free; 0: the same priority
    costly_nice: int = field(default=19, metadata=limits(0, 19))
