"""The admin JSON API (``/wsn/admin/api/...``): what the admin page (``/admin``) and
``wsnmom subscriptions list`` read, and the operators' actions.

WS-N has no way to list subscriptions: the broker's resource properties name topics and
dialects, not subscribers.  Who may read and who may act: :mod:`.admin_auth`.

Reading::

    GET /wsn/admin/api/overview[?limit=N]   everything the page shows: health, totals,
                                            subscriptions, pull points, registrations,
                                            topics (:func:`.admin_json.overview_json`),
                                            upstreams (:mod:`.admin_upstreams`)
    GET /wsn/admin/api/subscriptions        {"count": n, "subscriptions": [...]}; searched,
                                            sorted and paged with ?q=&sort=&order=
                                            &offset=&limit= (:mod:`.admin_query`)
    GET /wsn/admin/api/subscriptions/<id>   one subscription ("pending": its backlog)
    GET /wsn/admin/api/subscriptions/<id>/peek?count=N
                                            the first N messages of its backlog, not
                                            consumed (:func:`.admin_json.peek_json`)
    GET /wsn/admin/api/pullpoints           {"count": n, "pull_points": [...]}
    GET /wsn/admin/api/pullpoints/<id>      one pull point
    GET /wsn/admin/api/pullpoints/<id>/peek?count=N
                                            the first N messages GetMessages would hand
                                            out, not consumed
    GET /wsn/admin/api/registrations        {"count": n, "registrations": [...]}
    GET /wsn/admin/api/topics               {"count": n, "topics": [...]}: messages, rate
    GET /wsn/admin/api/cluster              this instance and every instance on its store
                                            (:mod:`.admin_cluster`)
    GET /wsn/admin/api/session              who the caller is (answered to anyone)

Acting (authenticated admins; ``POST``, never ``GET``)::

    POST /wsn/admin/api/subscriptions/<id>/(pause|resume|unsubscribe|purge)
    POST /wsn/admin/api/pullpoints/<id>/purge
    POST /wsn/admin/api/notify              publish {"topic", "payload", "content_type"}
    POST /wsn/admin/api/session             sign in: {"token": ...} or {"user", "password"}
    POST /wsn/admin/api/session/end         sign out

Dead letters (``/wsn/admin/api/dead-letters...``): :mod:`.admin_dead_letters`.

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
import time
from collections.abc import Callable, Mapping
from typing import Any

from flask import Blueprint, Response, current_app, request
from lxml import etree
from wsnmom.core import errors
from wsnmom.core.access import PRINCIPAL
from wsnmom.core.app_headers import HeaderRefused, validated
from wsnmom.core.codec import wrap_native
from wsnmom.core.config import Settings
from wsnmom.core.model import ExpressionSource, InboundNotification
from wsnmom.core.peek import MAX_PEEK, PeekResult
from wsnmom.core.ports import BrokerPort
from wsnmom.core.safe_xml import hardened_parser
from wsnmom.topic_mapping.dialects import CONCRETE

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
from .admin_charts import chart_svg
from .admin_cluster import cluster_json
from .admin_forward import elsewhere
from .admin_json import (
    attempts_json,
    history_json,
    overview_json,
    peek_json,
    pull_point_json,
    registration_json,
    status_json,
    subscription_json,
    topic_json,
)
from .admin_node import node_json
from .admin_query import QueryError, query_subscriptions
from .auth import listens_on_loopback_only
from .public_base import client_address

__all__ = ["ADMIN_API_PREFIX", "PAGE_HEADER", "admin_api", "subscription_json"]

ADMIN_API_PREFIX = "/wsn/admin/api"
#: most entries per list of the overview by default
DEFAULT_LIMIT = 500
#: messages a peek shows unless ``?count=`` says otherwise
DEFAULT_PEEK = 10
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


def _upstream_states() -> list[dict[str, Any]]:
    """Each upstream's state (``wsnmom.upstreams``; none on an app without the relay)."""
    relay = current_app.extensions.get("wsnmom.upstreams")
    return list(relay.states()) if relay is not None else []


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


# --- reading ------------------------------------------------------------------------------------
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


def page_view() -> tuple[dict[str, Any], str] | None:
    """For the page itself (:mod:`.admin_page`): the overview and the caller's role
    (``admin``, ``local operator``, ``read-only``) when the caller may read, else None."""
    caller = _caller()
    if _refused_reading(caller) is not None or not isinstance(caller, AdminCaller):
        return None
    service = _service()
    data = overview_json(service.overview(), service.broker_address, DEFAULT_LIMIT)
    data["node"] = node_json(_settings())
    data["upstreams"] = _upstream_states()
    detail_id = request.args.get("subscription")
    if detail_id:
        data["detail"] = _detail(service, detail_id)
        data["detail_id"] = detail_id
    peek = _page_peek(service, detail_id, str(caller.principal))
    if peek is not None:
        data["peek"] = peek
    role = "admin" if caller.authenticated_admin else "read-only"
    if role == "read-only" and _local_operator():
        role = "local operator"
    return data, role


#: messages the page's peek shows (as its script asks)
PAGE_PEEK = 20


def _page_peek(
    service: BrokerPort, subscription_id: str | None, admin: str
) -> dict[str, Any] | None:
    """The page's peek (``?subscription=``, ``?pull_point=`` or ``?peek=dead-letters``):
    its title and the API's answer, or an ``error``; None when the page shows none.  A
    backlog another instance holds is peeked there (:mod:`.admin_forward`)."""
    pull_point_id = request.args.get("pull_point")
    try:
        if subscription_id:
            title = f"Waiting messages of subscription {subscription_id}"
            answer = _peeked_elsewhere("subscription", subscription_id, admin) or peek_json(
                service.peek_subscription(subscription_id, PAGE_PEEK)
            )
        elif pull_point_id:
            title = f"Waiting messages of pull point {pull_point_id}"
            answer = _peeked_elsewhere("pull point", pull_point_id, admin) or peek_json(
                service.peek_pull_point(pull_point_id, PAGE_PEEK)
            )
        elif request.args.get("peek") == "dead-letters":
            title = "Dead letters' messages"
            letters = service.dead_letters()[:PAGE_PEEK]
            answer = {"complete": True, "note": None, "dead_letters": [
                letter.summary() | {"body": letter.body.decode("utf-8", "replace")}
                for letter in letters
            ]}  # fmt: skip
        else:
            return None
    except errors.ResourceUnknown as exc:
        return {"title": "Waiting messages", "error": exc.description}
    except errors.WsnError as exc:
        return {"title": "Waiting messages", "error": f"{exc.fault_name}: {exc.description}"}
    return {"title": title, **answer}


def _peeked_elsewhere(kind: str, resource_id: str, admin: str) -> dict[str, Any] | None:
    """The page's peek of a backlog another instance holds, as that instance's API
    answered it; None when this instance holds it."""
    segment = "pullpoints" if kind == "pull point" else "subscriptions"
    sent = elsewhere(
        kind,
        resource_id,
        admin,
        api_path=f"{ADMIN_API_PREFIX}/{segment}/{resource_id}/peek",
        query=f"count={PAGE_PEEK}",
    )
    if sent is None:
        return None
    if sent.status_code == 404:
        raise errors.ResourceUnknown(f"no {kind} {resource_id!r}")
    try:
        data = json.loads(sent.get_data())
    except ValueError:  # not the API's answer (a limit of the instance's own): its text
        data = {"error": sent.get_data(as_text=True).strip()}
    if sent.status_code != 200 or not isinstance(data, dict):
        error = data.get("error") if isinstance(data, dict) else None
        raise errors.ResourceUnavailable(str(error or f"HTTP {sent.status_code}"))
    answer: dict[str, Any] = data
    return answer


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
    data = overview_json(service.overview(), service.broker_address, limit)
    data["node"] = node_json(_settings())
    data["cluster"] = cluster_json(service.cluster_status())
    data["upstreams"] = _upstream_states()
    return _json(data)


@admin_api.get("/cluster")
def cluster() -> Response:
    """This instance and every instance sharing its store: shards, leases, heartbeats."""
    if (refused := _refused_reading(_caller())) is not None:
        return refused
    return _json(cluster_json(_service().cluster_status()))


@admin_api.get("/subscriptions")
def list_subscriptions() -> Response:
    """The live subscriptions that match the query, one page of them (:mod:`.admin_query`).
    The backlogs come from the middleware for the page only, unless the list is sorted
    by backlog: searching and sorting 10,000 subscriptions then asks it nothing."""
    if (refused := _refused_reading(_caller())) is not None:
        return refused
    service = _service()
    by_backlog = request.args.get("sort") == "backlog"
    statuses = service.subscription_statuses(depths=by_backlog)
    try:
        matched, offset, limit, page = query_subscriptions(statuses, request.args)
    except QueryError as exc:
        return _error(str(exc), 400)
    if not by_backlog and page:
        page = service.subscription_statuses([s.record.id for s in page])
    return _json(
        {
            "count": matched,
            "total": len(statuses),
            "offset": offset,
            "limit": limit,
            "subscriptions": [status_json(s) for s in page],
        }
    )


def _detail(service: BrokerPort, subscription_id: str) -> dict[str, Any] | None:
    """One subscription's page data (None: there is no such subscription)."""
    try:
        status = service.subscription_status(subscription_id)
    except errors.ResourceUnknown:
        return None
    data = status_json(status)
    data["pending"] = status.backlog
    data["attempts"] = attempts_json(status.delivery)
    try:
        letters = service.dead_letters()
    except errors.WsnError:  # the middleware does not answer: the rest of the page does
        letters = []
    data["dead_letters"] = [d.summary() for d in letters if d.subscription_id == subscription_id]
    return data


@admin_api.get("/subscriptions/<subscription_id>")
def show_subscription(subscription_id: str) -> Response:
    """One subscription with its backlog, delivery state and last delivery attempts."""
    if (refused := _refused_reading(_caller())) is not None:
        return refused
    data = _detail(_service(), subscription_id)
    if data is None:
        return _error(f"no subscription {subscription_id!r}", 404)
    return _json(data)


def peek_count() -> int:
    """``?count=`` of a peek (:data:`DEFAULT_PEEK`); ValueError for anything but a
    number from 1 to ``core.peek.MAX_PEEK``."""
    text = request.args.get("count") or str(DEFAULT_PEEK)
    try:
        count = int(text)
    except ValueError:
        raise ValueError("count must be a number") from None
    if not 1 <= count <= MAX_PEEK:
        raise ValueError(f"count must be from 1 to {MAX_PEEK}")
    return count


def _peek(kind: str, resource_id: str, read: Callable[[int], PeekResult]) -> Response:
    """A peek's answer: 200 with the messages (``complete`` False and a ``note`` where
    the middleware cannot show its part), 400, 404 or 503."""
    caller = _caller()
    if (refused := _refused_reading(caller)) is not None:
        return refused
    assert isinstance(caller, AdminCaller)
    if (sent := elsewhere(kind, resource_id, str(caller.principal))) is not None:
        return sent
    try:
        result = read(peek_count())
    except ValueError as exc:
        return _error(str(exc), 400)
    except errors.ResourceUnknown:
        return _error(f"no {kind} {resource_id!r}", 404)
    except errors.ResourceUnavailable as exc:
        retry = exc.retry_after
        headers = (("Retry-After", str(max(1, round(retry)))),) if retry else ()
        return _error(exc.description, 503, headers)
    return _json(peek_json(result))


@admin_api.get("/subscriptions/<subscription_id>/peek")
def peek_subscription(subscription_id: str) -> Response:
    """The first messages of a subscription's backlog, left where they are."""
    service = _service()
    return _peek(
        "subscription",
        subscription_id,
        lambda n: service.peek_subscription(subscription_id, n),
    )


@admin_api.get("/pullpoints/<pull_point_id>/peek")
def peek_pull_point(pull_point_id: str) -> Response:
    """The first messages waiting in a pull point, left where they are."""
    service = _service()
    return _peek("pull point", pull_point_id, lambda n: service.peek_pull_point(pull_point_id, n))


@admin_api.get("/pullpoints")
def list_pull_points() -> Response:
    """Every live pull point with the messages waiting in it, oldest first."""
    if (refused := _refused_reading(_caller())) is not None:
        return refused
    items = [pull_point_json(p) for p in _service().overview().pull_points]
    return _json({"count": len(items), "pull_points": items})


@admin_api.get("/pullpoints/<pull_point_id>")
def show_pull_point(pull_point_id: str) -> Response:
    """One pull point."""
    if (refused := _refused_reading(_caller())) is not None:
        return refused
    for status in _service().overview().pull_points:
        if status.record.id == pull_point_id:
            return _json(pull_point_json(status))
    return _error(f"no pull point {pull_point_id!r}", 404)


@admin_api.get("/registrations")
def list_registrations() -> Response:
    """Every live publisher registration, oldest first."""
    if (refused := _refused_reading(_caller())) is not None:
        return refused
    items = [registration_json(r) for r in _service().overview().registrations]
    return _json({"count": len(items), "registrations": items})


@admin_api.get("/history")
def history() -> Response:
    """The last hour of traffic: per-second rates and the backlog, oldest first."""
    if (refused := _refused_reading(_caller())) is not None:
        return refused
    return _json(history_json(_service().rate_history()))


@admin_api.get("/charts/<any(notifications, deliveries, failures, backlog):series>.svg")
def chart(series: str) -> Response:
    """One series of the last hour as an SVG image (the admin page's charts).  Refused
    without an authentication challenge: the page loads these as images, and a challenge
    would make the browser open its own password dialog over the page's sign-in."""
    if (refused := _refused_reading(_caller())) is not None:
        return _error("not allowed to read the charts", refused.status_code)
    image = chart_svg(_service().rate_history(), series, time.time())
    return Response(image, content_type="image/svg+xml", headers={"Cache-Control": "no-store"})


@admin_api.get("/topics")
def list_topics() -> Response:
    """Every topic the gateway published on since it started, with counts and rates."""
    if (refused := _refused_reading(_caller())) is not None:
        return refused
    view = _service().overview()
    items = [topic_json(t) for t in view.topics]
    return _json({"count": len(items), "topics": items, "forgotten": view.topics_forgotten})


# --- acting -------------------------------------------------------------------------------------
def _act(
    kind: str,
    resource_id: str,
    action: str,
    run: Callable[[], Any],
    *,
    forward: bool = False,
) -> Response:
    """Run an admin action for an authorised caller; ``forward``: at the instance that
    holds the resource's backlog (:mod:`.admin_forward`)."""
    caller = _caller()
    if (refused := _refused_acting(caller)) is not None:
        who = caller.principal if isinstance(caller, AdminCaller) else "wrong credentials"
        audit.warning(
            "admin: refused %s of %s %s from %s (%s)",
            action,
            kind,
            resource_id,
            request.remote_addr,
            who,
        )
        return refused
    assert isinstance(caller, AdminCaller)
    if forward and (sent := elsewhere(kind, resource_id, str(caller.principal))) is not None:
        audit.warning(
            "admin: %s of %s %s by %s from %s sent to the instance holding it (HTTP %s)",
            action,
            kind,
            resource_id,
            caller.principal,
            request.remote_addr,
            sent.status_code,
        )
        return sent
    bound = PRINCIPAL.set(caller.principal)  # core acts as this admin
    try:
        result = run()
    except errors.ResourceUnknown:
        return _error(f"no {kind} {resource_id!r}", 404)
    except errors.ResourceUnavailable as exc:
        retry = exc.retry_after
        headers = (("Retry-After", str(max(1, round(retry)))),) if retry else ()
        return _error(exc.description, 503, headers)
    except NotImplementedError as exc:
        return _error(f"the middleware cannot {action}: {exc}", 501)
    except errors.WsnError as exc:
        return _error(f"{exc.fault_name}: {exc.description}", 409)
    finally:
        PRINCIPAL.reset(bound)
    audit.warning(
        "admin: %s %s %s by %s from %s%s",
        action,
        kind,
        resource_id,
        caller.principal,
        request.remote_addr,
        f" ({result} message(s) dropped)" if action == "purge" else "",
    )
    body: dict[str, Any] = {"ok": True, "action": action, kind.replace(" ", "_"): resource_id}
    if action == "purge":
        body["purged"] = result
    elif action == "replay":
        body["delivered_to"] = result
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
    return _act(
        "subscription",
        subscription_id,
        action,
        lambda: run(service, subscription_id),
        forward=action == "purge",
    )


@admin_api.post("/pullpoints/<pull_point_id>/purge")
def pull_point_purge(pull_point_id: str) -> Response:
    """Purge a pull point."""
    service = _service()
    return _act(
        "pull point",
        pull_point_id,
        "purge",
        lambda: service.purge_pull_point(pull_point_id),
        forward=True,
    )


@admin_api.post("/notify")
def publish() -> Response:
    """Publish one notification (the page's *Publish* form): ``{"topic": "{uri}path",
    "payload": "...", "content_type": null, "headers": {"name": "value"}}`` (headers:
    application headers, ``core.app_headers``); a payload that is one XML element is sent
    as it is (unless ``content_type`` is not XML), anything else wrapped with
    ``content_type`` (default ``text/plain``), as the gateway wraps native messages."""
    form = request.get_json(silent=True)
    if not isinstance(form, dict):
        return _error('expected a JSON object {"topic", "payload", "content_type"}', 400)
    topic, text = str(form.get("topic") or ""), str(form.get("payload") or "")
    content_type = form.get("content_type") or None
    namespace, brace, path = topic.removeprefix("{").partition("}")
    if not topic.startswith("{") or not brace or not path:
        return _error("topic must be {namespace URI}path, e.g. {urn:example}sensors/t1", 400)
    data = text.encode("utf-8")
    payload: bytes | None = None
    if content_type is None or str(content_type).endswith("xml"):
        try:
            element = etree.fromstring(data, parser=hardened_parser())
            payload = etree.tostring(element)
        except etree.XMLSyntaxError as exc:
            if content_type is not None:
                return _error(f"the payload is not one XML element: {exc}", 400)
    if payload is None:
        payload = wrap_native(data, str(content_type or "text/plain"))
    raw_headers = form.get("headers") or {}
    if not isinstance(raw_headers, dict):
        return _error('headers must be an object {"name": "value"}', 400)
    try:
        headers = validated((str(k), str(v)) for k, v in raw_headers.items())
    except HeaderRefused as exc:
        return _error(str(exc), 400)
    message = InboundNotification(
        payload=payload,
        topic=ExpressionSource(CONCRETE, f"tns:{path}", {"tns": namespace}),
        headers=headers,
    )
    service = _service()
    return _act("topic", topic, "publish", lambda: service.notify([message]))


# --- signing in -----------------------------------------------------------------------------
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
