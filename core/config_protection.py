"""The settings sections that protect the gateway's HTTP side (``core.config_model``): its
connections (``[connections]``), delivery loops through other gateways (``[loops]``),
authentication (``[auth]``), TLS (``[tls]``), quotas (``[quotas]``) and the admin API
(``[admin]``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal

from wsnmom.core.config_values import limits


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
    #: topics the topic set may take in beyond the declared ones (a Notify's, a
    #: RegisterPublisher's, a SubscriptionEnd topic that is new); a new one beyond it is
    #: refused (TopicNotSupportedFault, HTTP 403).  In a cluster, the topics all
    #: instances recorded together (``core.topic_share``)
    ad_hoc_topics: int | None = field(default=10_000, metadata=limits(0))


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
