"""Prometheus metrics of the broker, on a registry of their own (``REGISTRY``).

The SOAP frontend counts requests and faults with :func:`count_request` and
:func:`count_fault` and serves :func:`render` at ``GET /metrics``; core counts
notifications in and out, delivery failures and resource gauges.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

REGISTRY = CollectorRegistry(auto_describe=True)

REQUESTS = Counter(
    "wsnmom_requests", "SOAP requests handled, by operation", ["operation"], registry=REGISTRY
)
FAULTS = Counter("wsnmom_faults", "SOAP faults returned, by fault", ["fault"], registry=REGISTRY)
NOTIFICATIONS_IN = Counter(
    "wsnmom_notifications_in", "Notifications accepted and published", registry=REGISTRY
)
NOTIFICATIONS_REJECTED = Counter(
    "wsnmom_notifications_rejected",
    "Notifications refused, by reason",
    ["reason"],
    registry=REGISTRY,
)
NOTIFICATIONS_OUT = Counter(
    "wsnmom_notifications_out",
    "Notifications handed to consumers, by mode (push, pull, forward)",
    ["mode"],
    registry=REGISTRY,
)
NOTIFICATIONS_FILTERED = Counter(
    "wsnmom_notifications_filtered",
    "Notifications received by a subscription but removed by its filters",
    registry=REGISTRY,
)
NOTIFICATIONS_EXPIRED = Counter(
    "wsnmom_notifications_expired",
    "Notifications dropped by the gateway for being older than limits.max_age",
    registry=REGISTRY,
)
NOTIFICATIONS_DROPPED = Counter(
    "wsnmom_notifications_dropped",
    "Notifications dropped by the gateway to keep a backlog within limits.max_messages",
    registry=REGISTRY,
)
DEAD_LETTERS = Counter(
    "wsnmom_dead_letters",
    "Dead letters, by reason (retries-exhausted, final-status, filter-budget, max-age, "
    "overflow) and source: gateway (counted when the gateway's publish of it is confirmed) "
    "or middleware (an adapter dropped it for the queue limits; counted when a dead-letter "
    "box first reads it back)",
    ["reason", "source"],
    registry=REGISTRY,
)
DEAD_LETTERS_HELD = Gauge(
    "wsnmom_dead_letters_held",
    "Dead letters this gateway holds (read back, not yet replayed or purged) per "
    "destination; at most dead_letters.list_max each",
    ["destination"],
    registry=REGISTRY,
)
NOTIFICATIONS_PURGED = Counter(
    "wsnmom_notifications_purged",
    "Notifications dropped by an operator's purge of a subscription or pull point",
    registry=REGISTRY,
)
DELIVERY_FAILURES = Counter(
    "wsnmom_delivery_failures", "Failed outbound Notify attempts", registry=REGISTRY
)
DELIVERY_DEFERRED = Counter(
    "wsnmom_delivery_deferred",
    "Delivery attempts not made because the destination's circuit was open",
    registry=REGISTRY,
)
DELIVERY_BREAKERS = Gauge(
    "wsnmom_delivery_breakers",
    "Destinations by circuit breaker state (closed, open, half_open)",
    ["state"],
    registry=REGISTRY,
)
DELIVERY_THREADS = Gauge(
    "wsnmom_delivery_threads",
    "Threads of the push delivery engine (delivery.workers, more while deliveries are slow)",
    registry=REGISTRY,
)
SUBSCRIPTIONS_ENDED = Counter(
    "wsnmom_subscriptions_ended",
    "Subscriptions ended by the broker, by reason",
    ["reason"],
    registry=REGISTRY,
)
ORPHANS_REMOVED = Counter(
    "wsnmom_orphans_removed",
    "Durable subscriptions removed by the orphan sweep (no record in the store)",
    registry=REGISTRY,
)
DELIVERY_SECONDS = Histogram(
    "wsnmom_delivery_seconds", "Duration of successful outbound Notify calls", registry=REGISTRY
)
CONNECTIONS_OPEN = Gauge(
    "wsnmom_connections_open", "Open HTTP connections (connections.limit)", registry=REGISTRY
)
CONNECTIONS_REFUSED = Counter(
    "wsnmom_connections_refused",
    "HTTP connections refused with 503, by limit (limit, per_client)",
    ["reason"],
    registry=REGISTRY,
)
CONNECTIONS_CLOSED = Counter(
    "wsnmom_connections_closed",
    "HTTP connections closed by the gateway, by deadline (header_timeout, body_timeout, "
    "idle_timeout, min_body_rate), eviction (evicted) or refused framing (framing)",
    ["reason"],
    registry=REGISTRY,
)
SUBSCRIPTIONS = Gauge("wsnmom_subscriptions", "Live subscriptions", registry=REGISTRY)
PULL_POINTS = Gauge("wsnmom_pull_points", "Live pull points", registry=REGISTRY)
REGISTRATIONS = Gauge("wsnmom_registrations", "Live publisher registrations", registry=REGISTRY)
QUEUED = Gauge(
    "wsnmom_delivery_queued",
    "Messages held in memory by the delivery engine, not yet settled",
    registry=REGISTRY,
)
HELD_BYTES = Gauge(
    "wsnmom_delivery_held_bytes",
    "Bytes of the messages the delivery engine holds in memory (charged to its budget)",
    registry=REGISTRY,
)
PARKED = Gauge(
    "wsnmom_delivery_parked",
    "Subscriptions whose delivery waits for room in the memory budget",
    registry=REGISTRY,
)
BACKLOG = Gauge(
    "wsnmom_backlog_messages",
    "Messages waiting in durable subscriptions (where the middleware can tell)",
    registry=REGISTRY,
)

CLUSTER_LEASE_RENEWALS = Counter(
    "wsnmom_cluster_lease_renewals",
    "Heartbeats of this instance that renewed its shard leases (cluster mode)",
    registry=REGISTRY,
)
CLUSTER_HEARTBEAT_FAILURES = Counter(
    "wsnmom_cluster_heartbeat_failures",
    "Heartbeats of this instance that failed (the store did not answer)",
    registry=REGISTRY,
)
CLUSTER_SHARDS_TAKEN = Counter(
    "wsnmom_cluster_shards_taken",
    "Shards this instance took, by how: free (unowned, or handed over) or failover (from "
    "an instance whose lease had expired)",
    ["how"],
    registry=REGISTRY,
)
CLUSTER_SHARDS_LOST = Counter(
    "wsnmom_cluster_shards_lost",
    "Shards this instance stopped delivering, by why: released (above its fair share) or "
    "expired (its lease could not be renewed in time)",
    ["why"],
    registry=REGISTRY,
)
CLUSTER_SHARDS_OWNED = Gauge(
    "wsnmom_cluster_shards_owned",
    "Shards whose push subscriptions this instance delivers now",
    registry=REGISTRY,
)
CLUSTER_LEADER = Gauge(
    "wsnmom_cluster_leader",
    "1 when this instance runs the cluster's periodic work",
    registry=REGISTRY,
)
CLUSTER_FOLLOW_SECONDS = Histogram(
    "wsnmom_cluster_follow_seconds",
    "Duration of one round of following the store's change log: reading it and bringing "
    "this instance in line with what other instances wrote (cluster mode)",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
    registry=REGISTRY,
)
CLUSTER_FOLLOW_FAILING = Gauge(
    "wsnmom_cluster_follow_failing",
    "Changes other instances made whose following failed here and is tried again (a "
    "subscription made elsewhere that this instance does not know yet)",
    registry=REGISTRY,
)
STORE_ROUND_TRIP_SECONDS = Histogram(
    "wsnmom_store_round_trip_seconds",
    "Duration of the cluster heartbeat's transaction in the store (one per heartbeat)",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
    registry=REGISTRY,
)

#: 0.1 s steps up to 6 s (a take-over within lease + 2 s is read to a tenth), then coarser
_TAKEOVER_BUCKETS = (
    *(round(0.1 * i, 1) for i in range(1, 61)),
    7.0,
    8.0,
    10.0,
    15.0,
    20.0,
    30.0,
    60.0,
)
TAKEOVER_SECONDS = Histogram(
    "wsnmom_takeover_seconds",
    "Cluster mode: seconds from this instance taking a shard to each stage (opening, "
    "channel, opened, read, lane, run, post, answer) of the first delivery of each of the shard's "
    "push subscriptions it opened (docs/scale-out.md, Failover at scale)",
    ["stage"],
    buckets=_TAKEOVER_BUCKETS,
    registry=REGISTRY,
)


class _SubscriptionBacklogs:
    """``wsnmom_subscription_backlog_messages{subscription}``: each live subscription's
    backlog (its lag, on a log-shaped middleware), read from a source at scrape time."""

    NAME = "wsnmom_subscription_backlog_messages"
    HELP = "Messages not yet delivered to one subscription, by subscription id"

    def __init__(self) -> None:
        self.source: Callable[[], Iterable[tuple[str, float]]] | None = None

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(self.NAME, self.HELP, labels=["subscription"])

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(self.NAME, self.HELP, labels=["subscription"])
        for subscription, backlog in self.source() if self.source is not None else ():
            family.add_metric([subscription], backlog)
        yield family


SUBSCRIPTION_BACKLOGS = _SubscriptionBacklogs()
REGISTRY.register(SUBSCRIPTION_BACKLOGS)
AUTH_FAILURES = Counter(
    "wsnmom_auth_failures",
    "Requests refused with HTTP 401, by reason (missing, bearer, basic, wsse, scheme)",
    ["reason"],
    registry=REGISTRY,
)
ACCESS_DENIED = Counter(
    "wsnmom_access_denied",
    "Requests refused for the caller's identity (not the owner, topic ACL), by fault",
    ["fault"],
    registry=REGISTRY,
)
QUOTA_REFUSALS = Counter(
    "wsnmom_quota_refusals",
    "Requests refused by a quota, by quota setting (subscriptions, rate, ...)",
    ["quota"],
    registry=REGISTRY,
)
AD_HOC_TOPICS = Gauge(
    "wsnmom_ad_hoc_topics",
    "Topics in the topic set beyond the declared ones (bounded by quotas.ad_hoc_topics)",
    registry=REGISTRY,
)
TOPICS_NOT_RECORDED = Counter(
    "wsnmom_topics_not_recorded",
    "Topics admitted on this instance that the cluster's recorded topic set had no room "
    "for (quotas.ad_hoc_topics): usable here, not listed by the other instances",
    registry=REGISTRY,
)


def count_request(operation: str) -> None:
    """Count one SOAP request for ``operation`` (e.g. "Subscribe")."""
    child = _REQUEST_CHILDREN.get(operation)
    if child is None:
        child = _REQUEST_CHILDREN[operation] = REQUESTS.labels(operation=operation)
    child.inc()


#: REQUESTS' child per operation: ``labels()`` validates and locks on every call, and
#: returns the same child for the same value (operations are a small fixed set)
_REQUEST_CHILDREN: dict[str, Counter] = {}


def count_fault(fault: str) -> None:
    """Count one SOAP fault (fault element local name)."""
    FAULTS.labels(fault=fault).inc()


def set_queued_source(fn: Callable[[], float]) -> None:
    """Make the in-memory queue gauge read ``fn`` at scrape time."""
    QUEUED.set_function(fn)


def set_memory_sources(held_bytes: Callable[[], float], parked: Callable[[], float]) -> None:
    """Make the delivery memory gauges read their sources at scrape time."""
    HELD_BYTES.set_function(held_bytes)
    PARKED.set_function(parked)


def set_delivery_sources(breakers: Callable[[str], float], threads: Callable[[], float]) -> None:
    """Make the breaker gauges (``breakers(state)``) and the thread gauge read their
    sources at scrape time."""
    for state in ("closed", "open", "half_open"):
        DELIVERY_BREAKERS.labels(state=state).set_function(
            lambda s=state: breakers(s)  # type: ignore[misc]
        )
    DELIVERY_THREADS.set_function(threads)


def set_cluster_sources(
    owned: Callable[[], float], leader: Callable[[], float], follow_failing: Callable[[], float]
) -> None:
    """Make the cluster gauges read this instance's shards, leadership and failing follows
    at scrape time."""
    CLUSTER_SHARDS_OWNED.set_function(owned)
    CLUSTER_LEADER.set_function(leader)
    CLUSTER_FOLLOW_FAILING.set_function(follow_failing)


def set_topics_source(fn: Callable[[], float]) -> None:
    """Make the ad-hoc topics gauge read ``fn`` at scrape time."""
    AD_HOC_TOPICS.set_function(fn)


def set_backlog_source(fn: Callable[[], float]) -> None:
    """Make the backlog gauge read ``fn`` at scrape time."""
    BACKLOG.set_function(fn)


def set_subscription_backlog_source(fn: Callable[[], Iterable[tuple[str, float]]]) -> None:
    """Make the per-subscription backlog family read ``fn`` (subscription id, backlog) at
    scrape time."""
    SUBSCRIPTION_BACKLOGS.source = fn


UPSTREAM_UP = Gauge(
    "wsnmom_upstream_up",
    "1 while the gateway holds a subscription at the upstream, else 0 (wsnmom.upstreams)",
    ["upstream"],
    registry=REGISTRY,
)
UPSTREAM_RELAYED = Counter(
    "wsnmom_upstream_relayed",
    "Notifications received from an upstream and published into the middleware",
    ["upstream"],
    registry=REGISTRY,
)
UPSTREAM_SUBSCRIBES = Counter(
    "wsnmom_upstream_subscribes",
    "Subscribe requests sent to an upstream, by outcome (ok, failed)",
    ["upstream", "outcome"],
    registry=REGISTRY,
)


def render() -> tuple[bytes, str]:
    """The exposition text and its content type."""
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
