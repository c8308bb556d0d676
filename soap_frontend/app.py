"""Flask application factory: one blueprint per WS-N role, metadata, health and metrics.

Endpoints
    ``POST /wsn/broker``                 NotificationBroker: Notify, Subscribe, GetCurrentMessage,
                                        RegisterPublisher, CreatePullPoint, WS-RP reads
    ``POST /wsn/subscriptions/<id>``     SubscriptionManager (pausable) + GetResourceProperty
    ``POST /wsn/pullpoints/<id>``        PullPoint: GetMessages, DestroyPullPoint, Notify + RP
    ``POST /wsn/upstream/<key>``         Notify from an upstream producer (wsnmom.upstreams)
    ``POST /wsn/registrations/<id>``     PublisherRegistrationManager + RP (Notify accepted too:
                                        the registration's ConsumerReference is the broker)
    ``GET  /wsn/broker?wsdl``, ``/wsn/wsdl``   the WSDL (addresses: ``public_url``, trusted
                                        forwarding headers, or the listen address)
    ``GET  /wsn/schemas/<name>``         the OASIS XSDs the WSDL imports
    ``GET  /wsn/policy``                 the broker policy document
    ``POST /onvif/event_service``        the ONVIF event service, and its pull-point
    ``POST /onvif/subscriptions/<id>``   subscriptions (:mod:`.onvif`)
    ``GET  /healthz`` ``/readyz`` ``/metrics``
    ``GET  /admin``                      the admin page (:mod:`.admin_page`)
    ``GET  /wsn/admin/api/...``          its JSON API; ``POST`` for operators' actions
                                        (who reads and who acts: :mod:`.admin_auth`)

Requests that act or read private state must name the gateway in ``Host`` (DNS
rebinding, :mod:`.hosts`).  Every response carries ``X-Request-Id`` (the client's, or a
new one), which log records emitted while handling the request carry too
(:mod:`.request_ids`).

SOAP POSTs are handled by :func:`.dispatch.soap_post` (how a request finds its operation
and resource is described there and in :mod:`.broker_calls`), called from the Flask views
here and from the WSGI fast path (:mod:`.fastpath`), which the application is wrapped in.
The broker is reached through ``core.ports.BrokerPort``; the paths come from
``core.addresses``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from flask import Blueprint, Flask, Response, current_app, request
from lxml import etree
from werkzeug.exceptions import HTTPException
from wsnmom.core.addresses import BROKER_PATH, UPSTREAM_PATH, resource_path
from wsnmom.core.config import Settings
from wsnmom.core.model import WireVersion
from wsnmom.core.ports import BrokerPort

from . import (
    admin_actions,  # noqa: F401  (its routes join the admin blueprint)
    admin_dead_letters,  # noqa: F401  (its routes join the admin blueprint)
    admin_reads,  # noqa: F401  (its routes join the admin blueprint)
    admin_upstreams,  # noqa: F401  (its routes join the admin blueprint)
    codec,
)
from .admin_api import admin_api
from .admin_auth import AdminSessions
from .admin_forward import EXTENSION as ADMIN_FORWARD
from .admin_page import admin_page
from .auth import Authenticator
from .broker_calls import Role
from .dispatch import Frontend, Posted, Reply, SoapHandler, soap_post, transport_reply
from .envelope import HttpError, version_for_media_type
from .fastpath import SoapFastPath
from .faults import invalid_requests
from .hosts import HostCheck
from .legacy import version_named
from .legacy_wsdl import render_legacy_wsdl
from .long_poll import RESUMED, Poll
from .metadata import SCHEMA_FILES, render_wsdl, schema_bytes
from .onvif import EVENT_SERVICE_PATH, SUBSCRIPTIONS_PATH, EventService
from .public_base import public_base
from .pull_forward import PullForward
from .ratelimit import RateLimiter
from .request_ids import RequestIds
from .settled_answers import SettlingBody

log = logging.getLogger("wsnmom.soap")

DEFAULT_MAX_REQUEST_BYTES = 10 * 1024 * 1024


def create_app(service: BrokerPort, settings: Settings | None = None) -> Flask:
    """Create the WSGI application serving the WS-N endpoints for ``service``; without
    ``settings`` the defaults apply (a 10 MiB request limit, WSDL addresses from the
    request)."""
    app = Flask("wsnmom.soap_frontend")
    limit = settings.max_request_bytes if settings is not None else DEFAULT_MAX_REQUEST_BYTES
    app.config["MAX_CONTENT_LENGTH"] = int(limit)
    auth = Authenticator(settings)
    identity_rates = any(
        i.principal.quotas.rate is not None for i in auth.credentials.identities.values()
    )
    limiter = RateLimiter(settings.quotas if settings is not None else None, identity_rates)
    app.extensions["wsnmom.soap"] = Frontend(service, settings, auth, limiter)
    app.extensions["wsnmom.auth"] = auth
    app.register_error_handler(HTTPException, _http_error)

    broker = Blueprint("notification_broker", __name__)

    def broker_view() -> Response:
        return _endpoint(Role.BROKER, None)

    broker.add_url_rule(BROKER_PATH, "soap", broker_view, methods=["GET", "POST"])
    app.register_blueprint(broker)
    resource_views: dict[Role, Callable[[str], Response]] = {}
    for role, name in (
        (Role.SUBSCRIPTION, "subscription_manager"),
        (Role.PULL_POINT, "pull_point"),
        (Role.REGISTRATION, "publisher_registration_manager"),
    ):
        bp = Blueprint(name, __name__)
        view = resource_views[role] = _make_view(role)
        kind = role.kind
        assert kind is not None
        rule = resource_path(kind, "<resource_id>")
        bp.add_url_rule(rule, "soap", view, methods=["GET", "POST"])
        app.register_blueprint(bp)

    _register_fixed_endpoints(app)

    lifetime = settings.admin.session.total_seconds() if settings is not None else 8 * 3600.0
    app.extensions["wsnmom.admin"] = AdminSessions(lifetime)
    app.register_blueprint(admin_api)
    app.register_blueprint(admin_page)
    forward = app.extensions[ADMIN_FORWARD] = PullForward(
        SoapFastPath(app, app.wsgi_app, broker_view, resource_views),
        getattr(service, "pull_owners", None),
        app.config.get("MAX_CONTENT_LENGTH"),
        functools.partial(_identity_of, auth),
    )
    app.wsgi_app = RequestIds(  # type: ignore[method-assign]
        HostCheck(
            forward,
            settings,
            app.config,
        ),
        instance=getattr(service, "instance_id", ""),
    )
    return app


def _register_fixed_endpoints(app: Flask) -> None:
    """The endpoints at fixed paths: the ONVIF event service and its subscriptions, the
    upstream consumer, and the metadata, health and metrics views."""
    onvif = Blueprint("onvif_events", __name__)
    onvif.add_url_rule(EVENT_SERVICE_PATH, "service", _onvif_view, methods=["GET", "POST"])
    onvif.add_url_rule(
        f"{SUBSCRIPTIONS_PATH}/<subscription_id>",
        "subscription",
        _onvif_view,
        methods=["GET", "POST"],
    )
    app.register_blueprint(onvif)

    upstream = Blueprint("upstream_consumer", __name__)
    upstream.add_url_rule(
        f"{UPSTREAM_PATH}/<resource_id>", "soap", _make_view(Role.UPSTREAM), methods=["POST"]
    )
    app.register_blueprint(upstream)

    meta = Blueprint("metadata", __name__)
    meta.add_url_rule("/wsn/wsdl", "wsdl", _wsdl_view)
    meta.add_url_rule("/wsn/schemas/<name>", "schema", _schema_view)
    meta.add_url_rule("/wsn/policy", "policy", _policy_view)
    meta.add_url_rule("/healthz", "healthz", lambda: Response("ok\n", mimetype="text/plain"))
    meta.add_url_rule("/readyz", "readyz", _readyz_view)
    meta.add_url_rule("/metrics", "metrics", _metrics_view)
    app.register_blueprint(meta)


def _identity_of(auth: Authenticator, environ: dict[str, Any]) -> tuple[str, str] | None:
    """The identity of a client without an Authorization header (its TLS certificate, a
    trusted proxy's header) that a forwarded request names (``pull_forward``).

    :raises AuthenticationFailed: a proxy names an identity with a secret."""
    if not auth.enabled:
        return None
    caller = auth.http_caller(environ)
    return None if caller.name is None else (caller.name, caller.method)


def _make_view(role: Role) -> Callable[[str], Response]:
    def view(resource_id: str) -> Response:
        return _endpoint(role, resource_id)

    return view


def _frontend() -> Frontend:
    fe: Frontend = current_app.extensions["wsnmom.soap"]
    return fe


# --- metadata views --------------------------------------------------------------------
def _base_url() -> str:
    """The base of the WSDL's addresses: the EPRs' base (:mod:`.public_base`)."""
    return public_base(_frontend().settings, request.environ, request.host_url)


def _wsdl_response() -> Response:
    """The WSDL; ``?version=1.0`` / ``1.2-draft``: that older wire format's
    (:mod:`.legacy_wsdl`), ``1.3`` or none: the current one."""
    named = request.args.get("version")
    if named is not None:
        version = version_named(named)
        if version is None:
            return Response(
                f"unknown WS-Notification version {named!r} (1.3, 1.2-draft or 1.0)\n",
                status=404,
                mimetype="text/plain",
            )
        if version is not WireVersion.WSN_13:
            return Response(render_legacy_wsdl(version, _base_url()), mimetype="text/xml")
    fe = _frontend()
    policy = None
    try:
        policy = codec.policy_element(fe.service.policy())
    except Exception:  # the WSDL must stay available even if the policy is not
        log.warning("could not render the broker policy for the WSDL", exc_info=True)
    return Response(render_wsdl(_base_url(), policy), mimetype="text/xml")


def _wsdl_view() -> Response:
    return _wsdl_response()


def _schema_view(name: str) -> Response:
    if name not in SCHEMA_FILES:
        return Response("unknown schema\n", status=404, mimetype="text/plain")
    return Response(schema_bytes(name), mimetype="text/xml")


def _policy_view() -> Response:
    el = codec.policy_element(_frontend().service.policy())
    return Response(
        etree.tostring(el, encoding="utf-8", xml_declaration=True, pretty_print=True),
        mimetype="application/xml",
    )


def _readyz_view() -> Response:
    try:
        reason = _frontend().service.unready_reason()
    except Exception:
        log.warning("readiness check failed", exc_info=True)
        reason = "the readiness check failed (see the log)"
    if not reason:
        return Response("ready\n", mimetype="text/plain")
    return Response(f"not ready: {reason}\n", status=503, mimetype="text/plain")


def _metrics_view() -> Response:
    try:
        from wsnmom.core.metrics import render
    except ImportError:  # pragma: no cover - core without metrics
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(), content_type=CONTENT_TYPE_LATEST)
    body, ctype = render()
    return Response(body, content_type=ctype)


# --- SOAP endpoint ---------------------------------------------------------------------
def _endpoint(role: Role, resource_id: str | None) -> Response:
    if request.method == "GET":
        if "wsdl" in {k.lower() for k in request.args}:
            return _wsdl_response()
        return _reply_response(
            transport_reply(
                _frontend(),
                HttpError(405, "this is a SOAP endpoint: POST a SOAP envelope (?wsdl: the WSDL)"),
                request.headers.get("Accept"),
            )
        )
    return _reply_response(soap_post(_frontend(), _posted(role, resource_id)))


def _posted(role: Role, resource_id: str | None, handler: SoapHandler | None = None) -> Posted:
    """The SOAP request of Flask's request context."""
    return Posted(
        role,
        resource_id,
        request.method,
        request.content_type,
        request.get_data(cache=False),
        request.path,
        request.args,
        request.environ,
        handler,
    )


def _onvif_view(subscription_id: str | None = None) -> Response:
    """The ONVIF event service (:mod:`.onvif`); a long poll the server parked comes back
    here with its answer (:mod:`.long_poll`)."""
    resumed: Poll[Reply] | None = request.environ.get(RESUMED)
    if resumed is not None and resumed.reply is not None:
        return _reply_response(resumed.reply)
    fe = _frontend()
    if request.method == "GET":
        return _reply_response(
            transport_reply(
                fe,
                HttpError(405, "this is a SOAP endpoint: POST a SOAP envelope"),
                request.headers.get("Accept"),
            )
        )
    cap = fe.settings.limits.get_messages_cap if fe.settings is not None else 1000
    handler = EventService(fe.service, subscription_id, _base_url(), cap)
    return _reply_response(soap_post(fe, _posted(Role.BROKER, None, handler)))


def _reply_response(reply: Reply) -> Response:
    if reply.settlements is not None:  # settled once the server wrote it
        response = Response(
            SettlingBody(reply.body, reply.settlements, request.environ),
            status=reply.status,
            content_type=reply.content_type,
        )
        # as the fast path orders them; else a streamed body would go chunked
        response.headers["Content-Length"] = str(len(reply.body))
        response.headers.extend(reply.headers)
        return response
    return Response(
        reply.body, status=reply.status, content_type=reply.content_type, headers=reply.headers
    )


def _soap_bound(code: int) -> bool:
    """Whether the current request is meant for a SOAP endpoint, so that an HTTP error
    ``code`` is answered with a SOAP fault: under ``/wsn/`` (the admin API excepted),
    anything but a plain read; elsewhere, a SOAP message to a path that does not exist
    (the other endpoints, ``/healthz`` and the like, keep their plain answers)."""
    path = request.path
    soap_type = version_for_media_type(request.content_type) is not None
    if path.startswith(("/wsn/", "/onvif/")):
        if path.startswith("/wsn/admin/"):
            return False
        return soap_type or request.method not in ("GET", "HEAD", "OPTIONS")
    return code == 404 and soap_type


def _http_error(exc: HTTPException) -> Response | HTTPException:
    """Werkzeug's HTTP errors (unknown path, method not allowed, body too large, body
    ended early, an exception escaping a view) on SOAP-bound requests as SOAP faults with
    the same status."""
    if exc.code is None or exc.code < 400 or not _soap_bound(exc.code):
        return exc
    message = {
        404: f"no SOAP endpoint at {request.path} (the broker is /wsn/broker; subscriptions, "
        "pull points and registrations are /wsn/<kind>/<id>)",
        405: f"{request.method} is not allowed here: POST a SOAP envelope",
        413: "the request is larger than max_request_bytes",
        500: "the broker could not process the request (internal error)",
    }.get(exc.code, exc.description or exc.name)
    invalid_requests.info(
        f"rejected {exc.code}", "rejected request to %s: %s", request.path, message
    )
    error = HttpError(exc.code, message, code="Receiver" if exc.code >= 500 else "Sender")
    try:
        fe: Frontend | None = _frontend()
    except Exception:
        fe = None
    response = _reply_response(transport_reply(fe, error, request.content_type))
    if exc.code == 405:
        allowed = exc.get_headers()
        response.headers.extend([(k, v) for k, v in allowed if k == "Allow"])
        if "Allow" not in response.headers:
            response.headers["Allow"] = "GET, POST"
    return response
