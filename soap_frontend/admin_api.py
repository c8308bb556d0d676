"""The admin JSON API (``/wsn/admin/api/...``): its blueprint, who may read and who may act
(the checks every endpoint makes), the JSON answers, and signing in and out.

The endpoints join the blueprint from modules of their own: reading in
:mod:`.admin_reads` (what the admin page (``/admin``) and ``wsnmom subscriptions list``
read), the operators' actions in :mod:`.admin_actions`, dead letters in
:mod:`.admin_dead_letters`, upstreams in :mod:`.admin_upstreams`.  WS-N has no way to list
subscriptions: the broker's resource properties name topics and dialects, not subscribers.
Who may read and who may act: :mod:`.admin_auth`.

The session::

    GET  /wsn/admin/api/session             who the caller is (answered to anyone)
    POST /wsn/admin/api/session             sign in: {"token": ...} or {"user", "password"}
    POST /wsn/admin/api/session/end         sign out

Each action and each refused one is logged (logger ``wsnmom.admin``) with the caller and
the client address.  Errors are ``{"error": "..."}``: 401 (no or wrong credentials; with
the ``WWW-Authenticate`` challenge unless the admin page asked, ``X-Requested-With:
wsnmom-admin``, which signs in its own way), 403 (not allowed), 404 (unknown resource),
501 (the middleware cannot purge), 503 (middleware unreachable; ``Retry-After``).
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Mapping
from typing import Any

from flask import Blueprint, Response, current_app, request
from wsnmom.core.config import Settings
from wsnmom.core.ports import BrokerPort

from . import identity
from .admin_auth import (
    CSRF_HEADER,
    SESSION_COOKIE,
    AdminCaller,
    AdminSessions,
    SignInRefused,
    authorization_value,
    browser_origin,
    from_browser,
    loopback_name,
    same_origin,
)
from .auth import listens_on_loopback_only
from .public_base import client_address

__all__ = ["ADMIN_API_PREFIX", "PAGE_HEADER", "admin_api", "audit"]

ADMIN_API_PREFIX = "/wsn/admin/api"
#: ``X-Requested-With`` value of the admin page's own requests
PAGE_HEADER = "wsnmom-admin"

admin_api = Blueprint("admin_api", __name__, url_prefix=ADMIN_API_PREFIX)
audit = logging.getLogger("wsnmom.admin")


def _sessions() -> AdminSessions:
    sessions: AdminSessions = current_app.extensions["wsnmom.admin"]
    return sessions


def _service() -> BrokerPort:
    service: BrokerPort = current_app.extensions["wsnmom.soap"].service
    return service


def _settings() -> Settings | None:
    settings: Settings | None = current_app.extensions["wsnmom.soap"].settings
    return settings


def _json(
    data: Mapping[str, Any], status: int = 200, headers: tuple[tuple[str, str], ...] = ()
) -> Response:
    resp = Response(json.dumps(data, indent=2) + "\n", status=status, mimetype="application/json")
    resp.headers["Cache-Control"] = "no-store"
    for name, value in headers:
        resp.headers.add(name, value)
    return resp


def _error(message: str, status: int, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    return _json({"error": message}, status, headers)


def _unauthorized(message: str) -> Response:
    """401; with the challenge, except for the admin page (a browser would pop up its own
    password dialog over the page's sign-in)."""
    challenge = identity.authenticator().challenge_headers()
    from_page = request.headers.get("X-Requested-With") == PAGE_HEADER
    return _error(message, 401, () if from_page else challenge)


def _caller() -> AdminCaller | Response:
    """The caller, or the 401 for wrong credentials."""
    try:
        return _sessions().caller(request.environ)
    except identity.AuthenticationFailed:
        return _unauthorized("wrong credentials")


def _may_read(caller: AdminCaller) -> bool:
    return caller.authenticated_admin or identity.is_admin()


def _refused_reading(caller: AdminCaller | Response) -> Response | None:
    """None when the caller may read (:mod:`.admin_auth`), else 401 or 403."""
    if isinstance(caller, Response):
        return caller
    if _may_read(caller):
        return None
    if identity.authenticator().enabled:
        if caller.principal.anonymous:
            return _unauthorized("authentication required")
        return _error("an admin identity is required", 403)
    return _error("the admin interface answers loopback clients only", 403)


def _local_operator() -> bool:
    """Without authentication, on a loopback-only listener: a client straight from a
    loopback address that named the gateway by a loopback host (:mod:`.admin_auth`)."""
    settings = _settings()
    if settings is None or identity.authenticator().enabled:
        return False
    if not listens_on_loopback_only(settings.host) or not identity.is_admin():
        return False
    return loopback_name(request.host)


def _refused_acting(caller: AdminCaller | Response) -> Response | None:
    """None when an authenticated admin (or the local operator) sent the action from where
    it may (module docstring of :mod:`.admin_auth`), else 401 or 403."""
    if isinstance(caller, Response):
        return caller
    if not caller.authenticated_admin and not _local_operator():
        if identity.authenticator().enabled and caller.principal.anonymous:
            return _unauthorized("authentication required")
        if not identity.authenticator().enabled:
            return _error(
                "actions need an authenticated admin (turn authentication on: "
                "auth.admin_token, and sign in), or, on a gateway listening on a loopback "
                "address only, a client on its host",
                403,
            )
        return _error("an admin identity is required", 403)
    environ = request.environ
    cross_site = from_browser(environ) and not same_origin(_settings(), environ, request.host_url)
    if cross_site or (caller.session is not None and not from_browser(environ)):
        return _error("refused: the request does not come from the admin page", 403)
    if caller.session is not None:
        expected = _sessions().csrf_token(caller.session)
        if not hmac.compare_digest(request.headers.get(CSRF_HEADER, ""), expected):
            return _error(f"refused: missing or wrong {CSRF_HEADER}", 403)
    return None


# --- the session ---------------------------------------------------------------------------
@admin_api.get("/session")
def session() -> Response:
    """Who the caller is (answered to anyone; reveals nothing but that)."""
    caller = _caller()
    if isinstance(caller, Response):
        return caller
    principal = caller.principal
    return _json(
        {
            "admin": caller.authenticated_admin,
            "act": caller.authenticated_admin or _local_operator(),
            "caller": str(principal),
            "read": _may_read(caller),
            "sign_in": identity.authenticator().enabled,
            "csrf": _sessions().csrf_token(caller.session) if caller.session else None,
        }
    )


@admin_api.post("/session")
def sign_in() -> Response:
    """Sign in with an admin's credentials: a session cookie and the CSRF token its actions
    need."""
    auth = identity.authenticator()
    if not auth.enabled:
        return _error(
            "signing in needs authentication: set auth.admin_token (WSNMOM_AUTH__ADMIN_TOKEN) "
            "or auth.users_file",
            403,
        )
    settings = _settings()
    if not same_origin(settings, request.environ, request.host_url):
        return _error("refused: the request does not come from the admin page", 403)
    payload = request.get_json(silent=True)
    form: Mapping[str, Any] = payload if isinstance(payload, dict) else request.form
    value = authorization_value(form.get("token"), form.get("user"), form.get("password"))
    sessions = _sessions()
    try:
        trusted = settings.trusted_proxies if settings is not None else []
        client = client_address(request.environ, trusted)
        session_id, principal = sessions.sign_in(auth.http_caller, value, client)
    except SignInRefused as exc:
        audit.warning("admin: sign-in refused from %s: %s", request.remote_addr, exc)
        return _error(str(exc), exc.status)
    audit.warning("admin: %s signed in from %s", principal, request.remote_addr)
    resp = _json({"admin": True, "caller": str(principal), "csrf": sessions.csrf_token(session_id)})
    secure = browser_origin(settings, request.environ, request.host_url).startswith("https:")
    resp.set_cookie(
        SESSION_COOKIE,
        session_id,
        max_age=int(sessions.lifetime),
        path="/",
        secure=secure,
        httponly=True,
        samesite="Strict",
    )
    return resp


@admin_api.post("/session/end")
def sign_out() -> Response:
    """End the caller's session (same origin only: a forged sign-out is a nuisance too)."""
    if not same_origin(_settings(), request.environ, request.host_url):
        return _error("refused: the request does not come from the admin page", 403)
    caller = _caller()
    if isinstance(caller, AdminCaller):
        _sessions().sign_out(caller.session)
    resp = _json({"admin": False})
    resp.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="Strict")
    return resp
