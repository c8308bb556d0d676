"""Who may read the admin page and API, who may act there, and the page's sign-in.

Who the caller is comes from :mod:`.identity` (HTTP credentials: Basic, bearer token,
TLS client certificate, a trusted proxy's identity header), plus one source of this
module: the admin page's *session* (below).  Two rules, checked in each admin view (a
``before_request`` hook would take every SOAP request off the WSGI fast path,
:mod:`.fastpath`):

*Reading* (``GET /wsn/admin/api/...``) is for :func:`.identity.is_admin` callers: an
authenticated admin; or, while authentication is off, a client connected straight from a
loopback address.  Subscription ids are capabilities, so nobody else gets a listing.

*Acting* (pause, resume, unsubscribe, purge: ``POST`` only, never ``GET``) is for an
*authenticated* admin identity, and, while authentication is off and the gateway listens
on a loopback address only, for the *local operator* (as RabbitMQ's ``guest`` user on
localhost): a client connected straight from a loopback address that names the gateway
by a loopback host (``127.0.0.1``, ``[::1]``, ``localhost``: a DNS name rebound to
127.0.0.1 by a web page is not one).  On any other listener, actions need an
authenticated admin.  Credentials a browser sends by
itself -- the session cookie, a remembered Basic password, a client certificate, a proxy's
header -- would also go with a request another site forges, so an action from a browser
must come from the page's own origin (``Origin``, else ``Referer``: the address the
browser used, or ``public_url``), and an action from a session must also carry the
session's CSRF token (header ``X-CSRF-Token``).  A program that sends no ``Origin`` or
``Referer`` (curl, a script) is judged by its credentials alone; a bearer token, which a
browser never sends by itself, needs nothing more.

The page's session: signing in (``POST /wsn/admin/api/session`` with the admin token, or a
name and password) checks the credentials with the gateway's authenticator, exactly as if
they came in an ``Authorization`` header, and keeps the admin identity it proved under a
random session id in the gateway's memory (:class:`AdminSessions`; ``admin.session``
long).  The browser holds the id in an ``HttpOnly``, ``SameSite=Strict`` cookie.  Failed
sign-ins are limited per client address: 10 a minute for one identity (a name, or "a
token"), 30 a minute in all.  A client that guesses wrong is refused further tries;
another client, the right one included, is not: one guesser cannot lock an admin out.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from werkzeug.http import parse_cookie
from wsnmom.core.access import ANONYMOUS, Principal

from .auth import FORWARDED_ADMIN_KEY
from .hashing import PasswordChecksBusy
from .identity import AuthenticationFailed, caller_of
from .public_base import forwarded_base, is_trusted

__all__ = [
    "CSRF_HEADER",
    "SESSION_COOKIE",
    "AdminCaller",
    "AdminSessions",
    "SignInRefused",
    "browser_origin",
    "from_browser",
    "same_origin",
]

#: the admin page's session cookie
SESSION_COOKIE = "wsnmom_admin"
#: the request header an action from a session carries its CSRF token in
CSRF_HEADER = "X-CSRF-Token"


@dataclass(frozen=True, slots=True)
class AdminCaller:
    """The caller of an admin view: its identity and, when it came through the page's
    sign-in, the session."""

    principal: Principal
    #: the session id when the identity comes from the session cookie
    session: str | None = None

    @property
    def authenticated_admin(self) -> bool:
        """An admin identity that proved itself (never a merely local client)."""
        return self.principal.admin and not self.principal.anonymous


class SignInRefused(Exception):
    """A sign-in with wrong or non-admin credentials, or too many failed ones lately."""

    def __init__(self, message: str, *, status: int = 403) -> None:
        super().__init__(message)
        self.status = status


class AdminSessions:
    """The admin page's sign-ins (see the module docstring).  Thread-safe."""

    #: failed sign-ins allowed per minute from one client address for one identity
    MAX_FAILURES_PER_MINUTE = 10
    #: failed sign-ins allowed per minute from one client address, whatever identity
    MAX_CLIENT_FAILURES_PER_MINUTE = 30
    #: client addresses (and identities) whose failures are tracked at most
    MAX_TRACKED = 10_000

    def __init__(
        self, lifetime: float = 8 * 3600.0, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.lifetime = lifetime
        self._clock = clock
        #: signs CSRF tokens (sessions end with the process anyway)
        self._key = secrets.token_bytes(32)
        self._lock = threading.Lock()
        self._sessions: dict[str, tuple[Principal, float]] = {}
        #: failure times by (client, identity) and by (client, "")
        self._failures: dict[tuple[str, str], deque[float]] = {}

    def sign_in(
        self,
        check: Callable[[Mapping[str, Any]], Principal],
        authorization: str,
        client: str = "",
    ) -> tuple[str, Principal]:
        """A new session for the admin whose ``Authorization`` header value
        ``authorization`` passes ``check`` (the authenticator); ``client`` is the
        address it comes from.

        :raises SignInRefused: wrong credentials (403), an identity that is no admin (403),
            or too many failed sign-ins from ``client`` in the last minute (429)."""
        now = self._clock()
        keys = ((client, _claimed(authorization)), (client, ""))
        limits = (self.MAX_FAILURES_PER_MINUTE, self.MAX_CLIENT_FAILURES_PER_MINUTE)
        with self._lock:
            for key, limit in zip(keys, limits, strict=True):
                if len(self._recent(key, now)) >= limit:
                    raise SignInRefused("too many failed sign-ins; wait a minute", status=429)
        try:
            principal = check({"HTTP_AUTHORIZATION": authorization})
        except PasswordChecksBusy:  # no verdict: not a failure
            raise SignInRefused("too many password checks in flight; retry", status=503) from None
        except AuthenticationFailed:
            principal = ANONYMOUS
        with self._lock:
            if principal.anonymous or not principal.admin:
                self._failed(keys, now)
                if principal.anonymous:
                    raise SignInRefused("wrong credentials")
                raise SignInRefused(f"{principal} is not an admin")
            for sid in [s for s, (_, until) in self._sessions.items() if until <= now]:
                del self._sessions[sid]
            session = secrets.token_urlsafe(32)
            self._sessions[session] = (principal, now + self.lifetime)
            return session, principal

    def _recent(self, key: tuple[str, str], now: float) -> deque[float]:
        """The failures of ``key`` in the last minute (older ones dropped)."""
        times = self._failures.get(key)
        if times is None:
            return deque()
        while times and times[0] < now - 60:
            times.popleft()
        return times

    def _failed(self, keys: tuple[tuple[str, str], ...], now: float) -> None:
        if len(self._failures) >= self.MAX_TRACKED:
            for key in [k for k in self._failures if not self._recent(k, now)]:
                del self._failures[key]
            if len(self._failures) >= self.MAX_TRACKED:
                self._failures.clear()  # a flood from many addresses: start over
        for key in keys:
            self._failures.setdefault(key, deque()).append(now)

    def sign_out(self, session: str | None) -> None:
        """End ``session`` (no-op when unknown)."""
        if session:
            with self._lock:
                self._sessions.pop(session, None)

    def principal(self, session: str) -> Principal | None:
        """The identity of a live session, else None."""
        now = self._clock()
        with self._lock:
            entry = self._sessions.get(session)
            if entry is None:
                return None
            if entry[1] <= now:
                del self._sessions[session]
                return None
            return entry[0]

    def csrf_token(self, session: str) -> str:
        """The token the session's actions carry."""
        return hmac.new(self._key, session.encode(), hashlib.sha256).hexdigest()

    def caller(self, environ: dict[str, Any], app: Any = None) -> AdminCaller:
        """The caller of an admin request: the session's identity when the cookie names a
        live session, else the HTTP caller (:func:`.identity.caller_of`).

        :raises AuthenticationFailed: HTTP credentials were given but are wrong."""
        forwarded = environ.get(FORWARDED_ADMIN_KEY)
        if isinstance(forwarded, str) and forwarded:
            # another instance authorised this admin and forwarded the action, signed
            # (``pull_forward``, ``admin_forward``): its identity, without a session
            return AdminCaller(Principal(name=forwarded, admin=True, method="forwarded"))
        session = parse_cookie(str(environ.get("HTTP_COOKIE") or "")).get(SESSION_COOKIE)
        if session:
            principal = self.principal(session)
            if principal is not None:
                return AdminCaller(principal, session)
        return AdminCaller(caller_of(environ, app))


def _claimed(authorization: str) -> str:
    """The identity an ``Authorization`` value claims: the Basic name, or "a token"."""
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() == "basic":
        try:
            return "basic:" + base64.b64decode(value, validate=True).decode().partition(":")[0]
        except ValueError:
            return "basic:"
    return "a token"


def authorization_value(token: str | None, user: str | None, password: str | None) -> str:
    """The ``Authorization`` header value for a sign-in form: Basic for a name and
    password, else Bearer for a token."""
    if user:
        pair = f"{user}:{password or ''}".encode()
        return "Basic " + base64.b64encode(pair).decode("ascii")
    return f"Bearer {token or ''}"


# --- where a request comes from -------------------------------------------------------------
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


def from_browser(environ: Mapping[str, Any]) -> bool:
    """Whether the request says where it comes from (``Origin`` or ``Referer``), as
    browsers do for every POST."""
    return bool(environ.get("HTTP_ORIGIN") or environ.get("HTTP_REFERER"))


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


def loopback_name(host: str) -> bool:
    """Whether a ``Host`` header's host (port and brackets allowed) is a loopback address
    or ``localhost`` (:func:`.auth.listens_on_loopback_only` after the port)."""
    from .auth import listens_on_loopback_only

    name = host.strip()
    if name.startswith("["):
        name = name[1 : name.find("]")] if "]" in name else name[1:]
    elif name.count(":") == 1:
        name = name.split(":", 1)[0]
    return listens_on_loopback_only(name.lower().rstrip("."))
