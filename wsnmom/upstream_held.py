"""One upstream as the relay (:mod:`wsnmom.upstreams`) holds it, and how it is shown.

:class:`HeldUpstream` is what the relay knows of one upstream: its settings and where they
came from (the configuration file or the store), the subscription (and, in pull mode, the
pull point) it holds at the producer with its consumer key and expiry, the retry schedule
after a failure, and its counts.  :meth:`HeldUpstream.state_json` is what ``/admin``, the
admin API and ``wsnmom upstream list`` show of it (of its credentials only their kind,
never a secret); :meth:`HeldUpstream.gauge` sets its ``wsnmom_upstream_up`` gauge.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from wsnmom.core import metrics
from wsnmom.core.config import UpstreamSettings
from wsnmom.topic_mapping.dialects import CONCRETE, FULL, ONVIF_CONCRETE_SET, SIMPLE

if TYPE_CHECKING:
    from wsnmom.client import PullPoint, Subscription

__all__ = ["PULL_BATCH", "HeldUpstream", "dialect_uri"]

#: pull mode: notifications asked for by one GetMessages (ONVIF: PullMessages, unless the
#: device takes fewer)
PULL_BATCH = 100

_DIALECTS = {
    "simple": SIMPLE,
    "concrete": CONCRETE,
    "full": FULL,
    "concrete_set": ONVIF_CONCRETE_SET,
    "concreteset": ONVIF_CONCRETE_SET,
}


@dataclass(slots=True)
class HeldUpstream:
    """One upstream and what the relay knows of it."""

    spec: UpstreamSettings
    #: "config" (the configuration file) or "store" (added at run time)
    source: str
    state: str = "idle"
    subscription: Subscription | None = None
    #: pull mode: the pull point at the producer the subscription feeds
    pull_point: PullPoint | None = None
    #: the current consumer key (the last path segment of the consumer address)
    key: str | None = None
    expires: datetime | None = None
    last_renew: float = 0.0
    #: ONVIF pull mode: the MessageLimit of PullMessages (lowered to the device's maximum)
    pull_limit: int = PULL_BATCH
    next_try: float = 0.0
    backoff: float = 0.0
    error: str | None = None
    subscribes: int = 0
    #: Renews the producer granted (of every subscription made)
    renews: int = 0
    relayed: int = 0
    refused: int = 0
    last_notify: datetime | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def state_json(self) -> dict[str, Any]:
        """What ``/admin``, the admin API and ``wsnmom upstream list`` show of it."""
        s = self.spec
        return {
            "name": s.name,
            "url": s.url,
            "topic": s.topic,
            "dialect": dialect_uri(s.dialect),
            "message_content": s.message_content,
            "mode": s.mode,
            "namespace": s.namespace,
            "auth": _auth_kind(s),
            "source": self.source,
            "state": self.state,
            "subscription": (self.subscription.address if self.subscription is not None else None),
            "expires": _iso(self.expires),
            "error": self.error,
            "subscribes": self.subscribes,
            "renews": self.renews,
            "relayed": self.relayed,
            "refused": self.refused,
            "last_notify": _iso(self.last_notify),
        }

    def gauge(self) -> None:
        """Set its ``wsnmom_upstream_up`` gauge: 1 while subscribed, else 0."""
        metrics.UPSTREAM_UP.labels(upstream=self.spec.name).set(
            1 if self.state == "subscribed" else 0
        )


def dialect_uri(name: str) -> str:
    """The dialect URI of a configured dialect (a short name, or the URI itself)."""
    return _DIALECTS.get(name.lower(), name)


def _auth_kind(spec: UpstreamSettings) -> str | None:
    """How the gateway authenticates at the producer (never the secret itself)."""
    if spec.token is not None:
        return "bearer"
    if spec.user is None:
        return None
    return f"wsse-{spec.wsse}" if spec.wsse else "basic"


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None
