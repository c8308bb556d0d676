"""The admin JSON API (``/wsn/admin/api/...``): what the admin page (``/admin``) and
``wsnmom subscriptions list`` read, and the operators' actions.

WS-N has no way to list subscriptions: the broker's resource properties name topics and
dialects, not subscribers.  Reading (loopback clients and admins, :mod:`.admin_auth`):

``GET /wsn/admin/api/overview[?limit=N]``    everything the page shows: health, totals,
                                             subscriptions, pull points, registrations,
                                             topics (:func:`.admin_json.overview_json`)
``GET /wsn/admin/api/subscriptions``         ``{"count": n, "subscriptions": [...]}``
``GET /wsn/admin/api/subscriptions/<id>``    one subscription (``pending``: its backlog)
``GET /wsn/admin/api/session``               who the caller is: ``{"admin", "read",
                                             "sign_in", "csrf"}`` (answered to anyone)

Acting (admins only; ``POST``, never ``GET``; from a browser session also the page's
origin and its CSRF token)::

    POST /wsn/admin/api/subscriptions/<id>/(pause|resume|unsubscribe|purge)
    POST /wsn/admin/api/pullpoints/<id>/purge
    POST /wsn/admin/api/session            {"token": "..."}: sign in (sets the cookie)
    POST /wsn/admin/api/session/end        sign out

Each action is logged (logger ``wsnmom.admin``) with the caller and the client address.
Errors are ``{"error": "..."}`` with 403 (not allowed), 404 (unknown resource), 501 (the
middleware cannot purge), 503 (middleware unreachable; ``Retry-After``).
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from flask import Blueprint, Response, current_app, request
from wsnmom.core import errors

from .admin_auth import (
    CSRF_HEADER,
    SESSION_COOKIE,
    Caller,
    Identity,
    SignInRefused,
    TokenIdentity,
    browser_origin,
    from_loopback,
    same_origin,
)
from .admin_json import overview_json, status_json, subscription_json

__all__ = ["ADMIN_API_PREFIX", "AdminState", "admin_api", "subscription_json"]

ADMIN_API_PREFIX = "/wsn/admin/api"
#: most entries per list of the overview by default
DEFAULT_LIMIT = 500

admin_api = Blueprint("admin_api", __name__, url_prefix=ADMIN_API_PREFIX)
audit = logging.getLogger("wsnmom.admin")


@dataclass(slots=True)
class AdminState:
    """What the admin views share (``app.extensions["wsnmom.admin"]``)."""

    identity: Identity


def _state() -> AdminState:
    state: AdminState = current_app.extensions["wsnmom.admin"]
    return state


def _service() -> Any:
    return current_app.extensions["wsnmom.soap"].service


def _settings() -> Any:
    return current_app.extensions["wsnmom.soap"].settings


def _json(data: Mapping[str, Any], status: int = 200, **headers: str) -> Response:
    resp = Response(json.dumps(data, indent=2) + "\n", status=status, mimetype="application/json")
    resp.headers["Cache-Control"] = "no-store"
    for name, value in headers.items():
        resp.headers[name.replace("_", "-")] = value
    return resp


def _error(message: str, status: int, **headers: str) -> Response:
    return _json({"error": message}, status, **headers)


def _caller() -> Caller:
    return _state().identity.caller(request.environ)


def _refused_reading(caller: Caller) -> Response | None:
    """403 unless the client is on the gateway's host or an admin (module docstring)."""
    if caller.admin or from_loopback(request.environ):
        return None
    return _error("the admin API answers loopback clients and signed-in admins only", 403)


def _refused_acting(caller: Caller) -> Response | None:
    """403 unless an admin sent it; from a session, also its origin and CSRF token."""
    if not caller.admin:
        return _error("this needs an admin: sign in on the admin page", 403)
    if caller.via == "session":
        if not same_origin(_settings(), request.environ, request.host_url):
            return _error("refused: the request does not come from the admin page", 403)
        expected = _state().identity.csrf_token(caller)
        presented = request.headers.get(CSRF_HEADER, "")
        if expected is None or not hmac.compare_digest(presented, expected):
            return _error(f"refused: missing or wrong {CSRF_HEADER}", 403)
    return None


# --- reading ------------------------------------------------------------------------------------
@admin_api.get("/session")
def session() -> Response:
    """Who the caller is (answered to anyone; reveals nothing but that)."""
    state = _state()
    caller = _caller()
    identity = state.identity
    return _json(
        {
            "admin": caller.admin,
            "caller": caller.name,
            "read": caller.admin or from_loopback(request.environ),
            "sign_in": bool(getattr(identity, "enabled", False)),
            "csrf": identity.csrf_token(caller),
        }
    )


@admin_api.get("/overview")
def overview() -> Response:
    """Everything the admin page shows."""
    if (refused := _refused_reading(_caller())) is not None:
        return refused
    try:
        limit = max(1, int(request.args.get("limit", DEFAULT_LIMIT)))
    except ValueError:
        return _error("limit must be a number", 400)
    service = _service()
    return _json(overview_json(service.overview(), service.broker_address, limit))


@admin_api.get("/subscriptions")
def list_subscriptions() -> Response:
    """Every live subscription, oldest first."""
    if (refused := _refused_reading(_caller())) is not None:
        return refused
    items = [status_json(s) for s in _service().subscription_statuses()]
    return _json({"count": len(items), "subscriptions": items})


@admin_api.get("/subscriptions/<subscription_id>")
def show_subscription(subscription_id: str) -> Response:
    """One subscription with its backlog and delivery state."""
    if (refused := _refused_reading(_caller())) is not None:
        return refused
    try:
        status = _service().subscription_status(subscription_id)
    except errors.ResourceUnknown:
        return _error(f"no subscription {subscription_id!r}", 404)
    data = status_json(status)
    data["pending"] = status.backlog
    return _json(data)


# --- acting -------------------------------------------------------------------------------------
def _act(kind: str, resource_id: str, action: str, run: Callable[[], Any]) -> Response:
    caller = _caller()
    if (refused := _refused_acting(caller)) is not None:
        audit.warning(
            "admin: refused %s of %s %s from %s (%s)",
            action,
            kind,
            resource_id,
            request.remote_addr,
            caller.name,
        )
        return refused
    try:
        result = run()
    except errors.ResourceUnknown:
        return _error(f"no {kind} {resource_id!r}", 404)
    except errors.ResourceUnavailable as exc:
        retry = exc.retry_after
        headers = {"Retry_After": str(round(retry))} if retry else {}
        return _error(exc.description, 503, **headers)
    except NotImplementedError as exc:
        return _error(f"the middleware cannot {action}: {exc}", 501)
    except errors.WsnError as exc:
        return _error(f"{exc.fault_name}: {exc.description}", 409)
    audit.warning(
        "admin: %s %s %s by %s from %s%s",
        action,
        kind,
        resource_id,
        caller.name,
        request.remote_addr,
        f" ({result} message(s) dropped)" if action == "purge" else "",
    )
    body: dict[str, Any] = {"ok": True, "action": action, kind.replace(" ", "_"): resource_id}
    if action == "purge":
        body["purged"] = result
    return _json(body)


_SUBSCRIPTION_ACTIONS: dict[str, Callable[[Any, str], Any]] = {
    "pause": lambda service, rid: service.pause(rid),
    "resume": lambda service, rid: service.resume(rid),
    "unsubscribe": lambda service, rid: service.unsubscribe(rid),
    "purge": lambda service, rid: service.purge_subscription(rid),
}


@admin_api.post("/subscriptions/<subscription_id>/<action>")
def subscription_action(subscription_id: str, action: str) -> Response:
    """Pause, resume, unsubscribe or purge a subscription."""
    run = _SUBSCRIPTION_ACTIONS.get(action)
    if run is None:
        return _error(f"unknown action {action!r}", 404)
    service = _service()
    return _act("subscription", subscription_id, action, lambda: run(service, subscription_id))


@admin_api.post("/pullpoints/<pull_point_id>/purge")
def pull_point_purge(pull_point_id: str) -> Response:
    """Purge a pull point."""
    service = _service()
    return _act(
        "pull point", pull_point_id, "purge", lambda: service.purge_pull_point(pull_point_id)
    )


# --- signing in -----------------------------------------------------------------------------
@admin_api.post("/session")
def sign_in() -> Response:
    """Sign in with the admin token: a session cookie and the CSRF token its actions need."""
    identity = _state().identity
    if not isinstance(identity, TokenIdentity) or not identity.enabled:
        return _error("signing in is not enabled: set admin.token (WSNMOM_ADMIN__TOKEN)", 403)
    settings = _settings()
    if not same_origin(settings, request.environ, request.host_url):
        return _error("refused: the request does not come from the admin page", 403)
    payload = request.get_json(silent=True)
    token = payload.get("token") if isinstance(payload, dict) else request.form.get("token")
    try:
        session_id = identity.sign_in(str(token or ""))
    except SignInRefused as exc:
        audit.warning("admin: sign-in refused from %s: %s", request.remote_addr, exc)
        return _error(str(exc), 429 if exc.throttled else 403)
    audit.warning("admin: signed in from %s", request.remote_addr)
    caller = Caller("admin", admin=True, via="session", session=session_id)
    resp = _json({"admin": True, "caller": caller.name, "csrf": identity.csrf_token(caller)})
    secure = browser_origin(settings, request.environ, request.host_url).startswith("https:")
    resp.set_cookie(
        SESSION_COOKIE,
        session_id,
        max_age=int(identity.session_lifetime),
        path="/",
        secure=secure,
        httponly=True,
        samesite="Strict",
    )
    return resp


@admin_api.post("/session/end")
def sign_out() -> Response:
    """End the caller's session (same origin only: a forged sign-out is a nuisance too)."""
    identity = _state().identity
    if not same_origin(_settings(), request.environ, request.host_url):
        return _error("refused: the request does not come from the admin page", 403)
    caller = identity.caller(request.environ)
    if isinstance(identity, TokenIdentity):
        identity.sign_out(caller.session)
    resp = _json({"admin": False})
    resp.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="Strict")
    return resp
