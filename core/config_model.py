"""The settings model: one dataclass per section of the configuration (``[retry]``,
``[delivery]``, ...) and :class:`Settings`, their root with the top-level settings; ranges
and choices are declared on the fields (:func:`~wsnmom.core.config_values.limits`).  How
values are read into them: :mod:`wsnmom.core.config`; the ``[[upstream]]`` entries:
:mod:`wsnmom.core.config_upstreams`; where data lives: :mod:`wsnmom.core.config_locations`.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from wsnmom.core.config_locations import _derive_locations
from wsnmom.core.config_upstreams import UpstreamSettings
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
class TracingSettings:
    """OpenTelemetry spans (``core.tracing``; docs/operations.md, "Tracing")."""

    #: emit spans for each Notify received, its publish and each delivery attempt (needs
    #: the ``otel`` extra; False: nothing of OpenTelemetry is imported)
    enabled: bool = False


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


#: field metadata of settings that are bookkeeping, not configurable
_INTERNAL = {"internal": True}


@dataclass(slots=True)
class MiddlewareSettings:
    """What the gateway does while its middleware is unreachable."""

    #: seconds an operation may wait for the middleware to come back, counted from when
    #: the outage was first seen (later requests are refused at once: HTTP 503)
    grace: float = field(default=2.0, metadata=limits(0, 60))
    #: the Retry-After (seconds) of those refusals
    retry_after: float = field(default=5.0, metadata=limits(1, 3600))
    #: at start-up, seconds to wait for an unreachable middleware before exiting with
    #: status 9; 0 waits forever (the gateway serves /healthz and answers WS-N requests
    #: with HTTP 503 until it connects)
    wait: float = field(default=0.0, metadata=limits(0))


@dataclass(slots=True)
class ConnectionSettings:
    """HTTP connections: how many, and how long a client may take to send a request
    (docs/security.md); 0 = no limit."""

    #: open connections at most; more are answered 503 and closed
    limit: int = field(default=1000, metadata=limits(0, 100_000))
    #: open connections per client address (``trusted_proxies`` are exempt)
    per_client: int = field(default=64, metadata=limits(0, 100_000))
    #: seconds a request's line and headers may take to arrive
    header_timeout: float = field(default=10.0, metadata=limits(0))
    #: seconds a request's body may take to arrive after its headers
    body_timeout: float = field(default=60.0, metadata=limits(0))
    #: seconds a connection may sit without a request (keep-alive)
    idle_timeout: float = field(default=30.0, metadata=limits(0))
    #: places of ``limit`` kept for /healthz, /readyz and authenticated requests (at most
    #: half of ``limit``)
    reserve: int = field(default=50, metadata=limits(0, 50_000))
    #: bytes per second a request body must average once ``body_grace`` has passed
    min_body_rate: float = field(default=500.0, metadata=limits(0))
    #: seconds a body may take before ``min_body_rate`` applies
    body_grace: float = field(default=5.0, metadata=limits(0))


@dataclass(slots=True)
class LoopSettings:
    """Notifications that come back to the gateway through other gateways
    (docs/security.md)."""

    #: this gateway's id in the hop marker of the notifications it publishes; "" = a
    #: random id at every start (gateways sharing one store and middleware may share one)
    gateway_id: str = field(default="", metadata=limits(check="gateway_id"))
    #: gateways a notification may pass through; one that went through more is dropped
    max_hops: int = field(default=8, metadata=limits(1, 1000))


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


@dataclass(slots=True)
class StorageSettings:
    """The data directory's disk (docs/operations.md#a-full-disk)."""

    #: bytes that must stay free on the filesystems of the data directory and the store:
    #: below it Notify, Subscribe, CreatePullPoint and RegisterPublisher are refused
    #: (HTTP 503) and /readyz says not ready; 0 = refuse only once a write found it full
    min_free: int = field(default=64 * 1024 * 1024, metadata=limits(0))


@dataclass(slots=True)
class ClusterSettings:
    """Several gateway instances on one PostgreSQL store and one middleware
    (docs/scale-out.md); ignored on a SQLite store, whose one instance does everything."""

    #: this instance's id in the store's ``instances`` table, its leases and the
    #: ``WSNMOM-Instance`` header; "" = ``<hostname>-<pid>-<random>`` at every start
    instance_id: str = ""
    #: shards push subscriptions are hashed into; the live instances share them
    shards: int = field(default=64, metadata=limits(1, 4096))
    #: how long a shard's lease lasts without renewal (an instance stops delivering its
    #: shards before this has passed since its last renewal)
    lease: timedelta = field(default=timedelta(seconds=10), metadata=limits(1, 3600))
    #: seconds between heartbeats (lease renewals, taking free shards, leadership)
    heartbeat: float = field(default=1.0, metadata=limits(above=0, maximum=60))
    #: seconds between reads of the store's change log when no NOTIFY woke the instance
    poll: float = field(default=0.5, metadata=limits(above=0, maximum=60))
    #: where the other instances reach this one (a pull point's GetMessages sent to
    #: another instance is forwarded here when this one reads it); "" =
    #: ``http(s)://<listen host>:<port>`` (the host name when listening on every address)
    address: str = field(default="", metadata=limits(check="http_url"))


@dataclass(slots=True)
class AdminSettings:
    """The admin page (``/admin``)."""

    #: how long a sign-in on the admin page lasts (the page keeps an admin's verified
    #: identity in a session cookie)
    session: timedelta = field(default=timedelta(hours=8), metadata=limits(above=0))
    #: how often the traffic charts (the last hour) take a sample
    chart_interval: timedelta = field(
        default=timedelta(seconds=15), metadata=limits(above=0, maximum=300)
    )


@dataclass(slots=True)
class AuthSettings:
    """Who may call the gateway (docs/security.md)."""

    #: whether every WS-N request must authenticate: "auto" = yes unless the gateway
    #: listens on loopback addresses only; "true" / "false" force it
    required: Literal["auto", "true", "false"] = "auto"
    #: bearer token of the identity ``admin`` (also its HTTP Basic password): the one
    #: setting that turns authentication on
    admin_token: str | None = field(default=None, repr=False, metadata={"secret": True})
    #: TOML credentials file: identities, hashed passwords and tokens, roles, ACLs, quotas
    users_file: str | None = None
    #: the realm of the ``WWW-Authenticate`` challenge
    realm: str = "wsnmom"
    #: accept a WS-Security UsernameToken in the SOAP header (PasswordText, PasswordDigest)
    wsse: bool = True
    #: how far a UsernameToken's Created may lie from the gateway's clock, and how long its
    #: nonce is remembered (replays inside the window are refused)
    wsse_window: timedelta = field(default=timedelta(minutes=5), metadata=limits(above=0))
    #: request header naming the client identity, believed only from ``trusted_proxies``
    #: (for example ``X-Client-Identity`` set by a TLS-terminating proxy); None = off
    proxy_header: str | None = None
    #: with ``proxy_header``, allow ``trusted_proxies`` to hold ``*`` (or a network of
    #: every address): any client can then send the header and claim any identity that
    #: has no secret.  The gateway refuses that combination at start without this.
    i_know_any_client_can_claim_any_identity: bool = False
    #: threads that check password hashes (off the request threads, at the lowest CPU
    #: priority): the password-hashing work in flight
    hash_threads: int = field(default=1, metadata=limits(1, 64))
    #: password checks that may wait for a hashing thread; more are refused at once
    #: (HTTP 503, Retry-After) rather than holding request threads
    hash_queue: int = field(default=16, metadata=limits(0, 100_000))
    #: the identity of a TLS client certificate: "subject" (RFC 4514 distinguished name)
    #: or "cn" (its common name)
    tls_identity: Literal["subject", "cn"] = "subject"
    #: any authenticated identity may Pause/Resume any subscription (the third-party
    #: pause the specification mentions); owners and admins always may
    third_party_pause: bool = False


@dataclass(slots=True)
class TlsSettings:
    """HTTPS served by the gateway itself."""

    #: PEM certificate (chain) of the gateway; with ``keyfile`` the gateway speaks HTTPS
    certfile: str | None = None
    #: PEM private key of ``certfile`` (None: the key is in ``certfile``)
    keyfile: str | None = None
    #: PEM CA certificates that sign client certificates (mutual TLS)
    client_ca: str | None = None
    #: with ``client_ca``: "required" refuses clients without a valid certificate,
    #: "optional" lets them authenticate otherwise
    client_cert: Literal["required", "optional"] = "required"


@dataclass(slots=True)
class QuotaSettings:
    """Per-identity and global bounds on what clients may create and send; None = none."""

    #: live subscriptions one identity may own
    subscriptions: int | None = field(default=10_000, metadata=limits(1))
    #: live pull points one identity may own
    pull_points: int | None = field(default=1_000, metadata=limits(1))
    #: live publisher registrations one identity may own
    registrations: int | None = field(default=1_000, metadata=limits(1))
    #: live subscriptions over all identities
    total_subscriptions: int | None = field(default=250_000, metadata=limits(1))
    total_pull_points: int | None = field(default=25_000, metadata=limits(1))
    total_registrations: int | None = field(default=25_000, metadata=limits(1))
    #: SOAP requests per second one identity may send (anonymous clients: per address)
    rate: float | None = field(default=None, metadata=limits(above=0))
    #: requests one identity may send at once above ``rate`` (default: 2 s of ``rate``)
    burst: int | None = field(default=None, metadata=limits(1))
    #: SOAP requests per second over all clients
    total_rate: float | None = field(default=None, metadata=limits(above=0))
    #: bytes one Notify may make the gateway copy: its payload bytes times the number of
    #: subscriptions they fan out to
    notify_fanout_bytes: int | None = field(default=1024**3, metadata=limits(1))


@dataclass(slots=True)
class Settings:
    """Everything the gateway can be configured with."""

    #: directory of the store and of the embedded middleware (see the module docstring);
    #: None = derived by :func:`load_settings`
    data_dir: str | None = None
    #: the middleware; "" = ``embedded://<data_dir>``
    adapter_url: str = ""
    #: adapter-specific options passed to the adapter constructor
    adapter_options: dict[str, Any] = field(default_factory=dict)
    #: where subscriptions, pull points and registrations are kept;
    #: "" = ``sqlite:///<data_dir>/store.db``
    store_url: str = ""
    host: str = "127.0.0.1"
    port: int = field(default=8080, metadata=limits(1, 65535))
    #: base URL clients reach the gateway at; default ``http://host:port``
    public_url: str | None = field(default=None, metadata=limits(check="http_url"))
    #: peers (IP addresses or networks, ``*`` = any) whose ``Forwarded`` /
    #: ``X-Forwarded-Proto`` / ``X-Forwarded-Host`` headers are believed (WSDL addresses)
    trusted_proxies: list[str] = field(default_factory=list, metadata=limits(check="networks"))
    #: more names the ``Host`` header of SOAP and admin requests may carry (patterns,
    #: ``*.example.org``; ``*`` turns the DNS-rebinding check off), besides addresses,
    #: localhost, ``public_url``'s host and the listen host (docs/security.md)
    allowed_hosts: list[str] = field(default_factory=list)
    #: waitress worker threads
    threads: int = field(default=16, metadata=limits(1, 1024))
    max_request_bytes: int = field(default=10 * 1024 * 1024, metadata=limits(1))
    #: Notify only from registered publishers (RequiresRegistration)
    requires_registration: bool = False
    #: FixedTopicSet: only topics of the configured namespaces / topic list
    fixed_topic_set: bool = False
    #: WS-Topics TopicNamespace documents to load
    topic_namespaces: list[str] = field(default_factory=list)
    #: forward the publisher's ProducerReference to consumers (False: anonymous)
    forward_producer_reference: bool = True
    #: the Dialect of the Topic a consumer receives: "subscriber" (the dialect its
    #: Subscribe used, as BN §3.1 requires; without a TopicExpression Simple for a root
    #: topic, Concrete otherwise) or "concrete" (Concrete for every topic and consumer:
    #: one rendering per topic, leaving BN §3.1 for subscribers of other dialects)
    topic_dialect: Literal["subscriber", "concrete"] = "subscriber"
    #: seconds the middleware may take to confirm a Notify's messages before the Notify
    #: is answered with a fault (the messages may still arrive: a retry can duplicate
    #: them).  One persistent message routed into 10,000 RabbitMQ queues took over 10 s
    #: to confirm on a busy one-CPU broker.
    publish_timeout: float = field(default=30.0, metadata=limits(above=0))
    log_level: str = field(default="INFO", metadata=limits(check="log_level"))
    #: "text" (one line per record) or "json" (one JSON object per line)
    log_format: Literal["text", "json"] = "text"
    #: levels of individual loggers (``{"pika" = "INFO"}``); third-party libraries log
    #: WARNING and above unless named here
    log_levels: dict[str, str] = field(default_factory=dict, metadata=limits(check="log_level"))
    termination: TerminationSettings = field(default_factory=TerminationSettings)
    retry: RetrySettings = field(default_factory=RetrySettings)
    dead_letters: DeadLetterSettings = field(default_factory=DeadLetterSettings)
    tracing: TracingSettings = field(default_factory=TracingSettings)
    limits: LimitSettings = field(default_factory=LimitSettings)
    delivery: DeliverySettings = field(default_factory=DeliverySettings)
    outbound: OutboundSettings = field(default_factory=OutboundSettings)
    middleware: MiddlewareSettings = field(default_factory=MiddlewareSettings)
    filters: FilterSettings = field(default_factory=FilterSettings)
    connections: ConnectionSettings = field(default_factory=ConnectionSettings)
    loops: LoopSettings = field(default_factory=LoopSettings)
    auth: AuthSettings = field(default_factory=AuthSettings)
    tls: TlsSettings = field(default_factory=TlsSettings)
    quotas: QuotaSettings = field(default_factory=QuotaSettings)
    admin: AdminSettings = field(default_factory=AdminSettings)
    storage: StorageSettings = field(default_factory=StorageSettings)
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    #: remote producers relayed into the middleware (``[[upstream]]``; more are added at
    #: run time with ``wsnmom upstream add`` and kept in the store)
    upstream: list[UpstreamSettings] = field(default_factory=list)
    #: dotted setting name -> where its value came from ("WSNMOM_PORT=9090", a file,
    #: "--port=9090"); settings left at their default are absent
    origins: dict[str, str] = field(
        default_factory=dict, repr=False, compare=False, metadata=_INTERNAL
    )

    def __post_init__(self) -> None:
        if not self.adapter_url or not self.store_url:
            given = frozenset(
                n for n in ("data_dir", "adapter_url", "store_url") if getattr(self, n)
            )
            _derive_locations(self, explicit=given, environ=os.environ)

    @property
    def base_url(self) -> str:
        """``public_url`` without a trailing slash (default ``http://host:port``, or
        ``https://`` with ``tls.certfile``)."""
        scheme = "https" if self.tls.certfile else "http"
        url = self.public_url or f"{scheme}://{_url_host(self.host)}:{self.port}"
        return url.rstrip("/")

    @property
    def instance_url(self) -> str:
        """Where the other instances of a cluster reach this one: ``cluster.address``
        without a trailing slash, else ``http(s)://<listen host>:<port>`` (this host's name
        when listening on every address)."""
        if self.cluster.address:
            return self.cluster.address.rstrip("/")
        scheme = "https" if self.tls.certfile else "http"
        host = self.host.strip()
        if host in ("", "0.0.0.0", "::", "[::]"):
            host = socket.getfqdn()
        return f"{scheme}://{_url_host(host)}:{self.port}"

    def origin(self, name: str) -> str:
        """Where the setting ``name`` (dotted) came from, "default" when not set."""
        return self.origins.get(name, "default")


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
