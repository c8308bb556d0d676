"""The ``[[upstream]]`` entries: :class:`UpstreamSettings` (a remote producer relayed into
the middleware; docs/federation.md), the checks of a list of them, and their stored JSON
document (``wsnmom upstream add`` keeps them in the store).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from wsnmom.core.config_values import ConfigError, InvalidValue, convert, limits

__all__ = ["UpstreamSettings", "check_upstreams", "upstream_from_json", "upstream_to_json"]


@dataclass(slots=True)
class UpstreamSettings:
    """One remote NotificationProducer or broker whose notifications the gateway relays
    into the middleware (``[[upstream]]``; docs/federation.md)."""

    #: the upstream's name (letters, digits, ``.``, ``_``, ``-``): admin, metrics, CLI
    name: str = ""
    #: the remote NotificationProducer / NotificationBroker endpoint
    url: str = field(default="", metadata=limits(check="http_url"))
    #: topic expression subscribed to (None: every topic the producer has)
    topic: str | None = None
    #: its dialect: "simple", "concrete", "full", "concrete_set" (ONVIF) or a dialect URI
    dialect: str = "concrete"
    #: prefix -> namespace URI of the prefixes ``topic`` uses
    namespaces: dict[str, str] = field(default_factory=dict)
    #: an XPath 1.0 MessageContent filter evaluated by the producer
    message_content: str | None = None
    #: prefix -> namespace URI of the prefixes ``message_content`` uses
    message_content_namespaces: dict[str, str] = field(default_factory=dict)
    #: credentials at the producer: ``user`` + ``password`` (HTTP Basic, or a
    #: WS-Security UsernameToken with ``wsse``), or a bearer ``token``
    user: str | None = None
    password: str | None = field(default=None, repr=False, metadata={"secret": True})
    token: str | None = field(default=None, repr=False, metadata={"secret": True})
    #: send ``user``/``password`` as a UsernameToken: "digest" (PasswordDigest, as ONVIF
    #: devices require) or "text"; None: HTTP Basic
    wsse: Literal["digest", "text"] | None = None
    #: "push": the producer sends Notify to the gateway; "pull": the gateway creates a
    #: pull point at the producer (WS-N CreatePullPoint) and takes from it with GetMessages
    #: every second (producers behind NAT or a firewall); "onvif-pull": ``url`` is an ONVIF
    #: device's event service, read with CreatePullPointSubscription and PullMessages
    mode: Literal["push", "pull", "onvif-pull"] = "push"
    #: the namespace URI relayed topics appear under (their prefix and path kept); None:
    #: the producer's own
    namespace: str | None = None
    #: the lifetime asked of the producer; renewed when two thirds of it have passed
    lifetime: timedelta = field(default=timedelta(minutes=10), metadata=limits(above=0))
    #: the longest time between two Renews: how soon a producer that restarted and forgot
    #: the subscription is noticed (and subscribed to again)
    check_interval: timedelta = field(default=timedelta(seconds=30), metadata=limits(above=0))
    #: the longest wait between two attempts to subscribe again after a failure
    max_backoff: timedelta = field(default=timedelta(minutes=2), metadata=limits(above=0))


#: the characters of an upstream's name (it appears in a URL path and in metric labels)
UPSTREAM_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")


def check_upstreams(upstreams: list[UpstreamSettings], origin: str = "upstream") -> None:
    """Reject upstreams without a name or URL, or with a name used twice or unusable."""
    seen: set[str] = set()
    for i, up in enumerate(upstreams):
        where = f"{origin}: upstream entry {i + 1}"
        if not UPSTREAM_NAME.fullmatch(up.name):
            raise ConfigError(f"{where}: name {up.name!r}: 1-64 letters, digits, '.', '_', '-'")
        if not up.url:
            raise ConfigError(f"{where} ({up.name}): url is required")
        if up.name in seen:
            raise ConfigError(f"{where}: the name {up.name!r} is used twice")
        if up.token is not None and up.user is not None:
            raise ConfigError(f"{where} ({up.name}): give a token or a user, not both")
        if (up.user is None) != (up.password is None):
            raise ConfigError(f"{where} ({up.name}): user and password go together")
        if up.wsse is not None and up.user is None:
            raise ConfigError(f"{where} ({up.name}): wsse needs a user and password")
        seen.add(up.name)


def upstream_to_json(spec: UpstreamSettings) -> dict[str, Any]:
    """The stored document of an upstream (durations in seconds)."""
    data: dict[str, Any] = {}
    for f in dataclasses.fields(spec):
        value = getattr(spec, f.name)
        data[f.name] = value.total_seconds() if isinstance(value, timedelta) else value
    return data


def upstream_from_json(data: dict[str, Any]) -> UpstreamSettings:
    """An upstream from its stored document or an admin request; :raises ConfigError:"""
    try:
        (spec,) = convert([data], list[UpstreamSettings])
    except InvalidValue as exc:
        raise ConfigError(str(exc)) from None
    assert isinstance(spec, UpstreamSettings)
    check_upstreams([spec], "upstream")
    return spec
