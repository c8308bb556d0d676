"""The settings model: one dataclass per section of the configuration (``[retry]``,
``[delivery]``, ...) and :class:`Settings`, their root with the top-level settings; ranges
and choices are declared on the fields (:func:`~wsnmom.core.config_values.limits`).  The
sections of delivery are in :mod:`wsnmom.core.config_delivery`, those that protect the
HTTP side in :mod:`wsnmom.core.config_protection`, the others (tracing, the middleware,
storage, the cluster) here.  Code outside the configuration imports them all from
:mod:`wsnmom.core.config`, which reads values into them; the ``[[upstream]]`` entries:
:mod:`wsnmom.core.config_upstreams`; where data lives: :mod:`wsnmom.core.config_locations`.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from wsnmom.core.config_delivery import (
    DeadLetterSettings,
    DeliverySettings,
    FilterSettings,
    LimitSettings,
    OutboundSettings,
    RetrySettings,
    TerminationSettings,
)
from wsnmom.core.config_locations import _derive_locations
from wsnmom.core.config_protection import (
    AdminSettings,
    AuthSettings,
    ConnectionSettings,
    LoopSettings,
    QuotaSettings,
    TlsSettings,
)
from wsnmom.core.config_upstreams import UpstreamSettings
from wsnmom.core.config_values import limits


@dataclass(slots=True)
class TracingSettings:
    """OpenTelemetry spans (``core.tracing``; docs/operations.md, "Tracing")."""

    #: emit spans for each Notify received, its publish and each delivery attempt (needs
    #: the ``otel`` extra; False: nothing of OpenTelemetry is imported)
    enabled: bool = False


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
