"""The base URL the WSDL's ``soap:address`` and ``schemaLocation`` values start with.

In order:

1. ``public_url`` when it is set: the base of every endpoint reference the gateway hands
   out, so the WSDL and the EPRs agree (behind TLS termination both say https);
2. when the request comes from a trusted proxy (``trusted_proxies``: addresses, networks
   or ``*``): the scheme and host it forwarded, from ``Forwarded`` (RFC 7239; the last
   element, the one the nearest proxy added) or ``X-Forwarded-Proto`` /
   ``X-Forwarded-Host`` / ``X-Forwarded-Port`` (their last values); headers from anyone
   else are ignored;
3. ``http://host:port`` of the settings (the EPRs' base) unless the gateway listens on
   all addresses, where that base is no address a client can use;
4. the request's own scheme and ``Host``.

Forwarded values are checked (scheme http/https, a host name or address with an optional
port); a malformed value is ignored, so a header cannot put arbitrary text into the WSDL.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from typing import Any

from wsnmom.core.config import Settings

__all__ = ["forwarded_base", "is_trusted", "public_base"]

_WILDCARD_HOSTS = {"0.0.0.0", "::", "[::]", ""}
_HOST = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.?)+(?::\d{1,5})?")
_IPV6_HOST = re.compile(r"\[[0-9A-Fa-f:.]+\](?::\d{1,5})?")
_PORT = re.compile(r"\d{1,5}")


def public_base(settings: Settings | None, environ: Mapping[str, Any], request_base: str) -> str:
    """The base URL for a WSDL answered to the request of ``environ`` (see the module
    docstring); ``request_base`` is the request's own ``scheme://host[:port]``.  Without
    settings (an application made for tests) it is the request's base."""
    if settings is None:
        return request_base.rstrip("/")
    if settings.public_url:
        return settings.public_url.rstrip("/")
    trusted = settings.trusted_proxies
    if trusted and is_trusted(environ.get("REMOTE_ADDR"), trusted):
        forwarded = forwarded_base(environ, request_base)
        if forwarded:
            return forwarded
    if settings.host.strip() not in _WILDCARD_HOSTS:
        return settings.base_url.rstrip("/")
    return request_base.rstrip("/")


def is_trusted(remote: object, trusted: Sequence[str]) -> bool:
    """Whether the peer address ``remote`` is one of ``trusted`` (addresses, networks, *)."""
    if "*" in trusted:
        return True
    if not isinstance(remote, str):
        return False
    try:
        address = ipaddress.ip_address(remote.split("%", 1)[0])
    except ValueError:
        return False
    for entry in trusted:
        try:
            if address in ipaddress.ip_network(entry.strip(), strict=False):
                return True
        except ValueError:
            continue
    return False


def client_address(environ: Mapping[str, Any], trusted: Sequence[str]) -> str:
    """The client's address: the peer's, or when the peer is one of ``trusted`` the
    address it forwarded (the last ``Forwarded: for=``, else ``X-Forwarded-For``)."""
    peer = str(environ.get("REMOTE_ADDR") or "")
    if not trusted or not is_trusted(peer, trusted):
        return peer
    forwarded = _last_forwarded(environ.get("HTTP_FORWARDED")).get("for")
    claimed = forwarded or _last(environ.get("HTTP_X_FORWARDED_FOR"))
    if not claimed:
        return peer
    claimed = claimed.strip('"').strip()
    if claimed.startswith("["):  # RFC 7239: "[2001:db8::1]:port"
        claimed = claimed[1:].partition("]")[0]
    return claimed[:64] or peer


def forwarded_base(environ: Mapping[str, Any], request_base: str) -> str | None:
    """``scheme://host`` from the forwarding headers of ``environ``, or None when they give
    neither a usable scheme nor a usable host."""
    params = _last_forwarded(environ.get("HTTP_FORWARDED"))
    proto = _scheme(params.get("proto")) or _scheme(_last(environ.get("HTTP_X_FORWARDED_PROTO")))
    host = _host(params.get("host")) or _host(_last(environ.get("HTTP_X_FORWARDED_HOST")))
    if proto is None and host is None:
        return None
    own_scheme, _, own_host = request_base.partition("://")
    scheme = proto or own_scheme
    if host is None:
        host = own_host.rstrip("/")
    port = _last(environ.get("HTTP_X_FORWARDED_PORT"))
    default_port = (scheme, port) in (("http", "80"), ("https", "443"))
    if port and _PORT.fullmatch(port) and not _has_port(host) and not default_port:
        host = f"{host}:{port}"
    return f"{scheme}://{host}"


def _last(value: object) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return None
    return value.rsplit(",", 1)[-1].strip()


def _last_forwarded(value: object) -> dict[str, str]:
    """The parameters of the last element of an RFC 7239 ``Forwarded`` header."""
    element = _last(value)
    params: dict[str, str] = {}
    if element is None:
        return params
    for pair in element.split(";"):
        key, sep, raw = pair.partition("=")
        if sep:
            params[key.strip().lower()] = raw.strip().strip('"')
    return params


def _scheme(value: str | None) -> str | None:
    if value is None:
        return None
    scheme = value.strip().lower()
    return scheme if scheme in ("http", "https") else None


def _host(value: str | None) -> str | None:
    if value is None:
        return None
    host = value.strip()
    if _HOST.fullmatch(host) or _IPV6_HOST.fullmatch(host):
        return host
    return None


def _has_port(host: str) -> bool:
    if host.startswith("["):
        return "]:" in host
    return ":" in host
