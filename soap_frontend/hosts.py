"""The ``Host`` header check that stops DNS rebinding (WSGI middleware).

A web page the gateway's user visits can make a name of its own (``evil.example``)
resolve to ``127.0.0.1`` and then call the gateway from the browser as its own origin:
every answer is readable to the page, including the admin API, which answers loopback
clients without credentials while authentication is off.  The browser still sends the
page's name in ``Host``, so requests that act or read private state are refused with
``421 Misdirected Request`` unless their ``Host`` names the gateway:

* an IP address (any: a rebinding page needs a name of its own);
* ``localhost`` or a name under ``.localhost``;
* the host of ``public_url``, the listen host when it is a name, and, on a wildcard
  listen address (``0.0.0.0``, ``::``), this machine's name;
* a name matching one of ``allowed_hosts`` (fnmatch patterns; ``*`` turns the check off).

The port is not compared (a proxy may change it).  Checked are the requests that can act
or see private state: every method but GET, HEAD and OPTIONS (SOAP POSTs, admin
actions), and everything under ``/admin`` and ``/wsn/admin/``.  The public documents
(WSDL, schemas, ``/wsn/policy``, ``/healthz``, ``/readyz``, ``/metrics``) answer any
``Host``.  Not checked: requests from ``trusted_proxies`` (the proxy chose the virtual
host), and a gateway on a wildcard address without ``public_url``, whose WSDL follows the
request's ``Host`` by design (the start-up warning asks for ``public_url``, which turns
the check on).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable
from fnmatch import fnmatch
from typing import Any

from .dispatch import transport_reply
from .envelope import HttpError, version_for_media_type
from .faults import invalid_requests
from .public_base import is_trusted

__all__ = ["HostCheck", "allowed_host_names"]

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

_WILDCARDS = ("", "0.0.0.0", "::")
_READS = ("GET", "HEAD", "OPTIONS")
_PRIVATE_PREFIXES = ("/admin", "/wsn/admin/")


def _bare(host: str) -> str:
    """A ``Host`` value without port and brackets, lower case, no trailing dot."""
    text = host.strip().lower()
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:
        text = text.partition(":")[0]
    return text.rstrip(".")


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    return True


def allowed_host_names(settings: Any) -> frozenset[str] | None:
    """The names a ``Host`` may carry (IP addresses and localhost names always may), or
    None when the check is off (a wildcard listen address without ``public_url``)."""
    listen = _bare(str(getattr(settings, "host", "127.0.0.1") or ""))
    public = getattr(settings, "public_url", None)
    if listen in _WILDCARDS and not public:
        return None
    names = set()
    if public:
        from urllib.parse import urlsplit

        names.add((urlsplit(str(public)).hostname or "").rstrip("."))
    if listen in _WILDCARDS:
        machine = socket.gethostname().lower()
        names |= {machine, machine.partition(".")[0]}
    elif not _is_address(listen):
        names.add(listen)
    names.discard("")
    return frozenset(names)


class HostCheck:
    """Wraps a WSGI application (see the module docstring)."""

    def __init__(self, app: WsgiApp, settings: Any, config: Any = None) -> None:
        """``config``: the Flask app's config, whose ``SERVER_NAME`` is a name too."""
        self.app = app
        self.names = allowed_host_names(settings) if settings is not None else None
        self.trusted: list[str] = list(getattr(settings, "trusted_proxies", []) or [])
        self.config = config if config is not None else {}
        self.patterns = [
            p.strip().lower().rstrip(".") for p in getattr(settings, "allowed_hosts", None) or ()
        ]
        if "*" in self.patterns:
            self.names = None

    def allowed(self, host: str) -> bool:
        """Whether ``host`` (a ``Host`` value) names this gateway."""
        name = _bare(host)
        if not name or _is_address(name) or name == "localhost" or name.endswith(".localhost"):
            return True
        server_name = self.config.get("SERVER_NAME")
        if server_name and name == _bare(str(server_name)):
            return True
        if self.names is None or name in self.names:
            return True
        return any(fnmatch(name, pattern) for pattern in self.patterns)

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Any:
        if self.names is None or (
            environ.get("REQUEST_METHOD") in _READS
            and not str(environ.get("PATH_INFO") or "").startswith(_PRIVATE_PREFIXES)
        ):
            return self.app(environ, start_response)
        host = str(environ.get("HTTP_HOST") or "")
        if self.allowed(host) or (
            self.trusted and is_trusted(environ.get("REMOTE_ADDR"), self.trusted)
        ):
            return self.app(environ, start_response)
        return self._refuse(environ, start_response, host)

    @staticmethod
    def _refuse(environ: dict[str, Any], start_response: StartResponse, host: str) -> list[bytes]:
        message = (
            f"this gateway does not answer for the host {host[:100]!r}: use its address, "
            "localhost or the host of public_url"
        )
        invalid_requests.info(
            "refused host", "refused request to %s: %s", environ.get("PATH_INFO"), message
        )
        content_type = environ.get("CONTENT_TYPE")
        path = str(environ.get("PATH_INFO") or "")
        if (
            path.startswith("/wsn/")
            and not path.startswith("/wsn/admin/")
            and (version_for_media_type(content_type) is not None)
        ):
            reply = transport_reply(None, HttpError(421, message), content_type)
            body, ctype, extra = reply.body, reply.content_type, list(reply.headers)
        else:
            body, ctype, extra = (message + "\n").encode(), "text/plain; charset=utf-8", []
        start_response(
            "421 Misdirected Request",
            [("Content-Type", ctype), ("Content-Length", str(len(body))), *extra],
        )
        return [body]
