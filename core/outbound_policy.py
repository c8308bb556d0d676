"""Which addresses the broker may call: consumers (push delivery) and demand-based
publishers.  Consumer and publisher addresses come from strangers, so every one is checked
against the ``[outbound]`` settings before the broker accepts it.
"""

from __future__ import annotations

import ipaddress
from fnmatch import fnmatch
from urllib.parse import urlsplit

from wsnmom.core.config import Settings

__all__ = ["address_refusal"]


def address_refusal(address: str, settings: Settings) -> str | None:
    """Why the broker may not call ``address`` (outbound policy), or None when allowed.

    Literal IP addresses are checked against loopback / link-local rules and CIDR entries;
    host names against fnmatch patterns (``localhost`` counts as loopback).  Host names are
    not resolved here.
    """
    out = settings.outbound
    try:
        parts = urlsplit(address)
        parts.port  # noqa: B018 - raises ValueError for a port that is no number or too large
    except ValueError as exc:
        return f"not a URL ({exc})"
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
