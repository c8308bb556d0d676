"""Who calls the admin page and API, and what they may do there.

Two rules, both checked in each admin view (a ``before_request`` hook would take every
SOAP request off the WSGI fast path, :mod:`.fastpath`):

*Reading* (the page's data, ``GET /wsn/admin/api/...``) is for clients connected straight
from a loopback address (no ``Forwarded`` / ``X-Forwarded-For``: a proxy on the same host
relays others) and for admins.  Subscription ids are capabilities -- whoever knows one can
Unsubscribe it over WS-N -- so a listing is never shown to anyone else.

*Acting* (pause, resume, unsubscribe, purge: ``POST`` only, never ``GET``) is for admins,
wherever they connect from; a loopback client is not an admin by being local.  A browser
that signed in carries a session cookie (``HttpOnly``, ``SameSite=Strict``), which a
browser would also send with a request another site forges, so each action from a session
must also come from the page's own origin (``Origin``, else ``Referer``) and carry the
session's CSRF token (header ``X-CSRF-Token``).  A program that sends the admin token itself
(``Authorization: Bearer ...``) needs neither: nothing ambient authenticates it.

Who is an admin is the :class:`Identity`'s business.  :class:`TokenIdentity`, the one used
until the gateway has user identities, knows one secret, ``admin.token``: sending it as a
bearer token, or signing in with it on the page (a server-side session of
``admin.session``), makes the caller an admin.  Tokens are compared in constant time and
failed sign-ins are throttled.  Without a token nobody is an admin and the page is
read-only.  Another identity (user accounts with an admin role) replaces it through
``create_app(..., identity=...)``.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

from werkzeug.http import parse_cookie

from .public_base import forwarded_base, is_trusted

__all__ = [
    "ANONYMOUS",
    "CSRF_HEADER",
    "SESSION_COOKIE",
    "Caller",
    "Identity",
    "SignInRefused",
    "TokenIdentity",
    "browser_origin",
    "from_loopback",
    "same_origin",
]

#: the sign-in cookie of :class:`TokenIdentity`
SESSION_COOKIE = "wsnmom_admin"
#: the request header an action from a session carries its CSRF token in
CSRF_HEADER = "X-CSRF-Token"


@dataclass(frozen=True, slots=True)
class Caller:
    """Who sent a request, as far as the admin pages care."""

    #: for logs and the page ("admin", "anonymous", a user name)
    name: str
    admin: bool
    #: how the caller proved it: "session" (a browser's sign-in cookie: actions need the
    #: CSRF token and the page's origin), "bearer" (a credential sent by a program), or
    #: None (nothing proved)
    via: str | None = None
    #: the session a "session" caller signed in with (binds its CSRF token)
    session: str | None = None


ANONYMOUS = Caller("anonymous", admin=False)


class Identity(Protocol):
    """Tells who calls; what the admin views need from an authentication scheme."""

    def caller(self, environ: Mapping[str, Any]) -> Caller:
        """The caller of the request ``environ`` (``ANONYMOUS`` when nothing is proved)."""
        ...

    def csrf_token(self, caller: Caller) -> str | None:
        """The CSRF token a "session" caller's actions must carry (None otherwise)."""
        ...


class SignInRefused(Exception):
    """A sign-in with a wrong token, or too many failed ones lately (``throttled``)."""

    def __init__(self, message: str, *, throttled: bool = False) -> None:
        super().__init__(message)
        self.throttled = throttled


class TokenIdentity:
    """Admins are those who know ``admin.token`` (see the module docstring)."""

    #: failed sign-ins allowed per minute, over all clients
    MAX_FAILURES_PER_MINUTE = 10

    def __init__(
        self,
        token: str | None,
        session_lifetime: float = 8 * 3600.0,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._token = token.encode() if token else None
        self._lifetime = session_lifetime
        self._clock = clock
        #: signs CSRF tokens; sessions end with the process anyway
        self._key = secrets.token_bytes(32)
        self._lock = threading.Lock()
        self._sessions: dict[str, float] = {}
        self._failures: deque[float] = deque()

    @property
    def enabled(self) -> bool:
        """Whether anyone can be an admin (a token is configured)."""
        return self._token is not None

    def _matches(self, presented: str) -> bool:
        if self._token is None:
            return False
        return hmac.compare_digest(presented.encode(), self._token)

    # -- Identity ------------------------------------------------------------------------
    def caller(self, environ: Mapping[str, Any]) -> Caller:
        if self._token is None:
            return ANONYMOUS
        auth = str(environ.get("HTTP_AUTHORIZATION") or "")
        scheme, _, credential = auth.partition(" ")
        if scheme.lower() == "bearer" and self._matches(credential.strip()):
            return Caller("admin", admin=True, via="bearer")
        session = parse_cookie(str(environ.get("HTTP_COOKIE") or "")).get(SESSION_COOKIE)
        if session and self._live(session):
            return Caller("admin", admin=True, via="session", session=session)
        return ANONYMOUS

    def csrf_token(self, caller: Caller) -> str | None:
        if caller.via != "session" or caller.session is None:
            return None
        return hmac.new(self._key, caller.session.encode(), hashlib.sha256).hexdigest()

    # -- sessions ------------------------------------------------------------------------
    def sign_in(self, token: str) -> str:
        """A new session for the right ``token``.  :raises SignInRefused: wrong token or
        throttled."""
        now = self._clock()
        with self._lock:
            while self._failures and self._failures[0] < now - 60:
                self._failures.popleft()
            if len(self._failures) >= self.MAX_FAILURES_PER_MINUTE:
                raise SignInRefused("too many failed sign-ins; wait a minute", throttled=True)
            if not self._matches(token):
                self._failures.append(now)
                raise SignInRefused("wrong admin token")
            for sid in [s for s, until in self._sessions.items() if until <= now]:
                del self._sessions[sid]
            session = secrets.token_urlsafe(32)
            self._sessions[session] = now + self._lifetime
            return session

    def sign_out(self, session: str | None) -> None:
        """End ``session`` (no-op when unknown)."""
        if session:
            with self._lock:
                self._sessions.pop(session, None)

    @property
    def session_lifetime(self) -> float:
        """Seconds a sign-in lasts."""
        return self._lifetime

    def _live(self, session: str) -> bool:
        now = self._clock()
        with self._lock:
            until = self._sessions.get(session)
            if until is None:
                return False
            if until <= now:
                del self._sessions[session]
                return False
            return True


# --- where a request comes from -------------------------------------------------------------
def from_loopback(environ: Mapping[str, Any]) -> bool:
    """Whether the request comes straight from a loopback address (not relayed)."""
    if environ.get("HTTP_FORWARDED") or environ.get("HTTP_X_FORWARDED_FOR"):
        return False
    try:
        remote = str(environ.get("REMOTE_ADDR") or "").split("%", 1)[0]
        return ipaddress.ip_address(remote).is_loopback
    except ValueError:
        return False


def _origin(url: str) -> str | None:
    """``scheme://host[:port]`` of ``url`` (default ports left out), lower case."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    default = {"http": 80, "https": 443}[parts.scheme]
    return f"{parts.scheme}://{host}" + (f":{port}" if port not in (None, default) else "")


def browser_origin(settings: Any, environ: Mapping[str, Any], request_base: str) -> str:
    """The origin the browser used: what a trusted proxy forwarded, else the request's."""
    trusted = getattr(settings, "trusted_proxies", None) or ()
    if trusted and is_trusted(environ.get("REMOTE_ADDR"), trusted):
        forwarded = forwarded_base(environ, request_base)
        if forwarded:
            return _origin(forwarded) or request_base
    return _origin(request_base) or request_base


def same_origin(settings: Any, environ: Mapping[str, Any], request_base: str) -> bool:
    """Whether the request's ``Origin`` (else ``Referer``) is the page's own origin: the one
    the browser used, or ``public_url``'s."""
    claimed = environ.get("HTTP_ORIGIN") or environ.get("HTTP_REFERER")
    if not claimed or claimed == "null":
        return False
    origin = _origin(str(claimed))
    if origin is None:
        return False
    allowed = {browser_origin(settings, environ, request_base)}
    public = getattr(settings, "public_url", None)
    if public:
        allowed.add(_origin(str(public)) or "")
    return origin in allowed
