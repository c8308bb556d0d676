"""Flask application factory: one blueprint per WS-N role, SOAP dispatch, metadata.

Endpoints
    ``POST /wsn/broker``                 NotificationBroker: Notify, Subscribe, GetCurrentMessage,
                                        RegisterPublisher, CreatePullPoint, WS-RP reads
    ``POST /wsn/subscriptions/<id>``     SubscriptionManager (pausable) + GetResourceProperty
    ``POST /wsn/pullpoints/<id>``        PullPoint: GetMessages, DestroyPullPoint, Notify + RP
    ``POST /wsn/registrations/<id>``     PublisherRegistrationManager + RP (Notify accepted too:
                                        the registration's ConsumerReference is the broker)
    ``GET  /wsn/broker?wsdl``, ``/wsn/wsdl``   the WSDL (addresses: ``public_url``, trusted
                                        forwarding headers, or the listen address)
    ``GET  /wsn/schemas/<name>``         the OASIS XSDs the WSDL imports
    ``GET  /wsn/policy``                 the broker policy document
    ``GET  /healthz`` ``/readyz`` ``/metrics``
    ``GET  /wsn/admin/api/subscriptions[/<id>]``  read-only JSON list (loopback clients only,
                                        see :mod:`.admin_api`)

Every response carries ``X-Request-Id`` (the client's, or a new one), which log records
emitted while handling the request carry too (:mod:`.request_ids`).

Dispatch is on the QName of the Body's first child; ``wsa:Action`` is not required and not
checked.  A resource operation finds its resource from the URL path, else from ``wsa:To``
(an address of the resource kind), else from the ``wsnmom:ResourceId`` reference parameter
echoed as a header; with none of these it answers ResourceUnknownFault.
"""

from __future__ import annotations

import enum
import logging
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, urlsplit

from flask import Blueprint, Flask, Response, current_app, request
from lxml import etree
from werkzeug.exceptions import HTTPException
from wsnmom.core import errors
from wsnmom.core.model import EndpointReference

from . import codec
from .codec import Op
from .envelope import (
    HttpError,
    SoapProtocolErrorWithContext,
    SoapRequest,
    content_type_for,
    envelope_bytes,
    parse_request,
    version_for_media_type,
)
from .faults import (
    BaseFaultError,
    count_fault,
    count_request,
    fault_for_error,
    invalid_log,
    transport_fault,
)
from .metadata import SCHEMA_FILES, render_wsdl, schema_bytes
from .public_base import public_base
from .splice import Spliced
from .xml import WSNMOM, WSRF_RL, qname, text_of

log = logging.getLogger("wsnmom.soap")

DEFAULT_MAX_REQUEST_BYTES = 10 * 1024 * 1024


class Role(enum.Enum):
    """Which endpoint a request was posted to."""

    BROKER = "broker"
    SUBSCRIPTION = "subscriptions"
    PULL_POINT = "pullpoints"
    REGISTRATION = "registrations"


#: operations that act on one resource, and the resource kind they need
RESOURCE_OPS: dict[Op, Role] = {
    Op.RENEW: Role.SUBSCRIPTION,
    Op.UNSUBSCRIBE: Role.SUBSCRIPTION,
    Op.PAUSE: Role.SUBSCRIPTION,
    Op.RESUME: Role.SUBSCRIPTION,
    Op.GET_MESSAGES: Role.PULL_POINT,
    Op.DESTROY_PULL_POINT: Role.PULL_POINT,
    Op.DESTROY_REGISTRATION: Role.REGISTRATION,
}
#: operations of the broker endpoint only
BROKER_OPS = frozenset(
    {Op.SUBSCRIBE, Op.GET_CURRENT_MESSAGE, Op.CREATE_PULL_POINT, Op.REGISTER_PUBLISHER}
)
RP_OPS = frozenset(
    {
        Op.GET_RESOURCE_PROPERTY,
        Op.GET_MULTIPLE_RESOURCE_PROPERTIES,
        Op.GET_RESOURCE_PROPERTY_DOCUMENT,
    }
)

_PATH_RE = re.compile(r"/wsn/(subscriptions|pullpoints|registrations)/([A-Za-z0-9_.~-]+)/?$")


@dataclass(slots=True)
class Frontend:
    """What the blueprints need, kept in ``app.extensions["wsnmom.soap"]``."""

    service: Any
    settings: Any


def _setting(settings: Any, names: tuple[str, ...], default: Any) -> Any:
    for name in names:
        value = getattr(settings, name, None) if settings is not None else None
        if value is not None:
            return value
    return default


def create_app(service: Any, settings: Any = None) -> Flask:
    """Create the WSGI application serving the WS-N endpoints for ``service``."""
    app = Flask("wsnmom.soap_frontend")
    app.config["MAX_CONTENT_LENGTH"] = int(
        _setting(
            settings,
            ("max_request_bytes", "max_request_size", "max_content_length"),
            DEFAULT_MAX_REQUEST_BYTES,
        )
    )
    app.extensions["wsnmom.soap"] = Frontend(service, settings)
    app.register_error_handler(HTTPException, _http_error)

    broker = Blueprint("notification_broker", __name__)

    def broker_view() -> Response:
        return _endpoint(Role.BROKER, None)

    broker.add_url_rule("/wsn/broker", "soap", broker_view, methods=["GET", "POST"])
    app.register_blueprint(broker)
    resource_views: dict[Role, Callable[[str], Response]] = {}
    for role, name in (
        (Role.SUBSCRIPTION, "subscription_manager"),
        (Role.PULL_POINT, "pull_point"),
        (Role.REGISTRATION, "publisher_registration_manager"),
    ):
        bp = Blueprint(name, __name__)
        view = resource_views[role] = _make_view(role)
        bp.add_url_rule(f"/wsn/{role.value}/<resource_id>", "soap", view, methods=["GET", "POST"])
        app.register_blueprint(bp)

    meta = Blueprint("metadata", __name__)
    meta.add_url_rule("/wsn/wsdl", "wsdl", _wsdl_view)
    meta.add_url_rule("/wsn/schemas/<name>", "schema", _schema_view)
    meta.add_url_rule("/wsn/policy", "policy", _policy_view)
    meta.add_url_rule("/healthz", "healthz", lambda: Response("ok\n", mimetype="text/plain"))
    meta.add_url_rule("/readyz", "readyz", _readyz_view)
    meta.add_url_rule("/metrics", "metrics", _metrics_view)
    app.register_blueprint(meta)

    from .admin_api import admin_api

    app.register_blueprint(admin_api)

    from .fastpath import SoapFastPath
    from .request_ids import RequestIds

    app.wsgi_app = RequestIds(  # type: ignore[method-assign]
        SoapFastPath(app, app.wsgi_app, broker_view, resource_views)
    )
    return app


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
        ready = bool(_frontend().service.ready())
    except Exception:
        log.warning("readiness check failed", exc_info=True)
        ready = False
    if ready:
        return Response("ready\n", mimetype="text/plain")
    return Response("not ready\n", status=503, mimetype="text/plain")


def _metrics_view() -> Response:
    try:
        from wsnmom.core.metrics import render
    except ImportError:  # pragma: no cover - core without metrics
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(), content_type=CONTENT_TYPE_LATEST)
    body, ctype = render()
    return Response(body, content_type=ctype)


# --- SOAP endpoint ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Reply:
    """The HTTP answer to a SOAP POST: status, body, the full Content-Type value and any
    other headers."""

    status: int
    body: bytes
    content_type: str
    headers: tuple[tuple[str, str], ...] = ()


#: Flask's default Content-Type of a Response without one (the body-less 202 of one-ways)
_DEFAULT_CONTENT_TYPE = "text/html; charset=utf-8"


def _endpoint(role: Role, resource_id: str | None) -> Response:
    if request.method == "GET":
        if "wsdl" in {k.lower() for k in request.args}:
            return _wsdl_response()
        return _reply_response(
            _transport_reply(
                _frontend(),
                HttpError(405, "this is a SOAP endpoint: POST a SOAP envelope (?wsdl: the WSDL)"),
                request.headers.get("Accept"),
            )
        )
    fe = _frontend()
    reply = soap_post(
        fe,
        role,
        resource_id,
        request.method,
        request.content_type,
        request.get_data(cache=False),
        request.path,
        request.args,
    )
    return _reply_response(reply)


def _reply_response(reply: Reply) -> Response:
    return Response(
        reply.body, status=reply.status, content_type=reply.content_type, headers=reply.headers
    )


def _soap_bound() -> bool:
    """Whether the current request is meant for a SOAP endpoint, so that an HTTP error is
    answered with a SOAP fault: a SOAP content type, or anything but a read under
    ``/wsn/`` (the admin API excepted)."""
    if version_for_media_type(request.content_type) is not None:
        return True
    path = request.path
    return (
        request.method not in ("GET", "HEAD", "OPTIONS")
        and path.startswith("/wsn/")
        and not path.startswith("/wsn/admin/")
    )


def _http_error(exc: HTTPException) -> Response | HTTPException:
    """Werkzeug's HTTP errors (unknown path, method not allowed, body too large, body
    ended early) on SOAP-bound requests as SOAP faults with the same status."""
    if not _soap_bound() or exc.code is None or exc.code < 400:
        return exc
    message = {
        404: f"no SOAP endpoint at {request.path} (the broker is /wsn/broker; subscriptions, "
        "pull points and registrations are /wsn/<kind>/<id>)",
        405: f"{request.method} is not allowed here: POST a SOAP envelope",
        413: "the request is larger than max_request_bytes",
        500: "the broker could not process the request (internal error)",
    }.get(exc.code, exc.description or exc.name)
    invalid_log.info("rejected request to %s: %s", request.path, message)
    error = HttpError(exc.code, message, code="Receiver" if exc.code >= 500 else "Sender")
    try:
        fe: Frontend | None = _frontend()
    except Exception:
        fe = None
    response = _reply_response(_transport_reply(fe, error, request.content_type))
    if exc.code == 405:
        allowed = exc.get_headers()
        response.headers.extend([(k, v) for k, v in allowed if k == "Allow"])
        if "Allow" not in response.headers:
            response.headers["Allow"] = "GET, POST"
    return response


def soap_post(
    fe: Frontend,
    role: Role,
    resource_id: str | None,
    method: str,
    content_type: str | None,
    data: bytes,
    path: str,
    args: Mapping[str, str],
) -> Reply:
    """Handle one SOAP request posted to ``path`` (the endpoint of ``role``); ``args`` is
    the query string.  Independent of Flask's request context, so that the WSGI fast path
    (:mod:`.fastpath`) and the Flask view give the same answers."""
    try:
        req = parse_request(method, content_type, data)
    except HttpError as exc:
        invalid_log.info("rejected request to %s: %s", path, exc.message)
        return _transport_reply(fe, exc, content_type)
    except SoapProtocolErrorWithContext as exc:
        invalid_log.info("unusable SOAP request to %s: %s", path, exc)
        return _fault(fe, BaseFaultError(str(exc)), exc.version, exc.addressing.message_id)
    op = codec.OPERATIONS.get(req.operation)
    count_request(op.local if op else "unknown")
    try:
        if op is None:
            raise BaseFaultError(f"unsupported operation {req.operation}")
        result = _dispatch(fe.service, role, resource_id, op, req, args)
    except Exception as exc:
        if isinstance(exc, errors.WsnError):
            invalid_log.info("%s on %s: %s", exc.fault_name, req.operation, exc.description)
        return _fault(fe, exc, req.version, req.addressing.message_id)
    if result is None:  # one-way
        return Reply(202, b"", _DEFAULT_CONTENT_TYPE)
    action = codec.response_action(op)
    data = envelope_bytes(req.version, result, action=action, relates_to=req.addressing.message_id)
    return Reply(200, data, content_type_for(req.version, action))


def _transport_reply(fe: Frontend | None, exc: HttpError, content_type: str | None) -> Reply:
    """A request refused before SOAP processing: its HTTP status with a SOAP fault."""
    now, originator = _fault_context(fe)
    answer = transport_fault(exc, content_type, now=now, originator=originator)
    return Reply(answer.status, answer.body, answer.content_type, answer.headers)


def _fault_context(fe: Frontend | None) -> tuple[datetime, EndpointReference | None]:
    """The Timestamp and Originator of a fault."""
    try:
        assert fe is not None
        return fe.service.now(), EndpointReference(_broker_address(fe.service))
    except Exception:
        return datetime.now(UTC), None


def _fault(fe: Frontend, exc: BaseException, version: Any, relates_to: str | None) -> Reply:
    now, originator = _fault_context(fe)
    fault, action, rendered = fault_for_error(exc, version, now=now, originator=originator)
    count_fault(rendered.fault_name)
    data = envelope_bytes(version, fault, action=action, relates_to=relates_to)
    retry_after = getattr(exc, "retry_after", None)
    if isinstance(exc, errors.ResourceUnavailable) and retry_after is not None:
        # temporary (the middleware is unreachable): 503 tells HTTP clients to come back
        seconds = str(max(1, math.ceil(retry_after)))
        return Reply(503, data, content_type_for(version, action), (("Retry-After", seconds),))
    return Reply(500, data, content_type_for(version, action))


def _broker_address(service: Any) -> str:
    addr = service.broker_address
    return str(addr() if callable(addr) else addr)


def _resolve(
    role: Role, resource_id: str | None, kind: Role, req: SoapRequest, args: Mapping[str, str]
) -> str:
    """The id of the ``kind`` resource a request targets (path, wsa:To, ResourceId)."""
    if role is kind and resource_id:
        return resource_id
    to = req.addressing.to
    if to:
        parts = urlsplit(to)
        m = _PATH_RE.search(parts.path)
        if m and m.group(1) == kind.value:
            return m.group(2)
        if kind is Role.SUBSCRIPTION:  # OKSE style ...?wsn-subscriberkey=<id>
            key = parse_qs(parts.query).get("wsn-subscriberkey")
            if key:
                return key[0]
    header_id = _resource_id_header(req)
    if header_id:
        return header_id
    if kind is Role.SUBSCRIPTION and args.get("wsn-subscriberkey"):
        return str(args["wsn-subscriberkey"])
    raise errors.ResourceUnknown(
        f"no {kind.value[:-1]} is addressed by this request (use the EPR returned when it was "
        "created: its address, or echo its reference parameters)"
    )


def _resource_id_header(req: SoapRequest) -> str | None:
    for block in req.addressing.other_headers:
        if block.tag == f"{{{WSNMOM}}}ResourceId":
            value = text_of(block)
            if value:
                return value
    return None


def _dispatch(
    service: Any,
    role: Role,
    resource_id: str | None,
    op: Op,
    req: SoapRequest,
    args: Mapping[str, str],
) -> Any:
    body = req.body
    now = service.now
    if op in BROKER_OPS and role is not Role.BROKER:
        raise BaseFaultError(f"{op.local} is not an operation of this endpoint; use the broker")
    if op is Op.NOTIFY:
        messages = codec.parse_notify(body)
        if role is Role.PULL_POINT:
            service.notify_pull_point(
                _resolve(role, resource_id, Role.PULL_POINT, req, args), messages
            )
        elif role is Role.SUBSCRIPTION:
            raise BaseFaultError("a subscription manager does not accept Notify")
        else:
            service.notify(messages)
        return None
    if op is Op.SUBSCRIBE:
        sub = service.subscribe(codec.parse_subscribe(body, req.version))
        return codec.subscribe_response(sub, service.subscription_address(sub.id), now())
    if op is Op.GET_CURRENT_MESSAGE:
        message = service.get_current_message(codec.parse_get_current_message(body))
        return codec.get_current_message_response(message)
    if op is Op.CREATE_PULL_POINT:
        pp = service.create_pull_point(codec.parse_create_pull_point(body))
        return codec.create_pull_point_response(pp, service.pull_point_address(pp.id), now())
    if op is Op.REGISTER_PUBLISHER:
        reg = service.register_publisher(codec.parse_register_publisher(body))
        return codec.register_publisher_response(
            reg, service.registration_address(reg.id), _broker_address(service)
        )
    if op in RESOURCE_OPS:
        rid = _resolve(role, resource_id, RESOURCE_OPS[op], req, args)
        return _resource_op(service, op, rid, body)
    if op in RP_OPS:
        return _resource_properties(service, role, resource_id, op, req)
    if op is Op.DESTROY:
        return _wsrl_destroy(service, role, resource_id, req)
    raise BaseFaultError(f"unsupported operation {op.local}")  # pragma: no cover


def _wsrl_destroy(
    service: Any, role: Role, resource_id: str | None, req: SoapRequest
) -> etree._Element:
    """WS-ResourceLifetime immediate termination (``wsrf-rl:Destroy``) of a subscription,
    pull point or publisher registration: the resources expose WS-RP properties, so they
    must support it (checklist RP-02, PP-03, PRM-02).  The broker itself is not
    destroyable."""
    target, rid = role, resource_id
    if role is Role.BROKER:
        match = _PATH_RE.search(urlsplit(req.addressing.to or "").path)
        if match is None:
            raise errors.ResourceUnknown(
                "wsrf-rl:Destroy needs a subscription, pull point or "
                "registration; the broker cannot be destroyed"
            )
        target, rid = Role(match.group(1)), match.group(2)
    if rid is None:  # pragma: no cover - resource endpoints always carry an id
        raise errors.ResourceUnknown("no resource addressed")
    if target is Role.SUBSCRIPTION:
        service.unsubscribe(rid)
    elif target is Role.PULL_POINT:
        service.destroy_pull_point(rid)
    else:
        service.destroy_registration(rid)
    return codec.empty_response(qname(WSRF_RL, "DestroyResponse"))


def _resource_op(service: Any, op: Op, rid: str, body: etree._Element) -> etree._Element | Spliced:
    T = codec.T
    if op is Op.RENEW:
        value, invalid = codec.parse_renew(body)
        sub = service.renew(rid, value, invalid=invalid)
        return codec.renew_response(sub, service.now())
    if op is Op.UNSUBSCRIBE:
        service.unsubscribe(rid)
        return codec.empty_response(T("UnsubscribeResponse"))
    if op is Op.PAUSE:
        service.pause(rid)
        return codec.empty_response(T("PauseSubscriptionResponse"))
    if op is Op.RESUME:
        service.resume(rid)
        return codec.empty_response(T("ResumeSubscriptionResponse"))
    if op is Op.GET_MESSAGES:
        maximum = codec.parse_get_messages(body)
        return codec.get_messages_response(service.get_messages(rid, maximum))
    if op is Op.DESTROY_PULL_POINT:
        service.destroy_pull_point(rid)
        return codec.empty_response(T("DestroyPullPointResponse"))
    if op is Op.DESTROY_REGISTRATION:
        service.destroy_registration(rid)
        return codec.empty_response(codec.BR("DestroyRegistrationResponse"))
    raise BaseFaultError(f"unsupported operation {op.local}")  # pragma: no cover


def _property_table(
    service: Any, role: Role, resource_id: str | None, req: SoapRequest
) -> tuple[dict[str, codec.PropertyRenderer], str]:
    now = service.now()
    target_role, rid = role, resource_id
    if role is Role.BROKER:
        # a resource's properties asked at the broker URL: find it from the headers
        to_match = _PATH_RE.search(urlsplit(req.addressing.to or "").path)
        if to_match:
            target_role, rid = Role(to_match.group(1)), to_match.group(2)
        elif (header_id := _resource_id_header(req)) is not None:
            for candidate in (Role.SUBSCRIPTION, Role.PULL_POINT, Role.REGISTRATION):
                try:
                    _lookup(service, candidate, header_id)
                except errors.ResourceUnknown:
                    continue
                target_role, rid = candidate, header_id
                break
            else:
                raise errors.ResourceUnknown(f"no resource {header_id}")
    if target_role is Role.BROKER or rid is None:
        return codec.broker_properties(service), codec.BR("NotificationBrokerRP")
    obj = _lookup(service, target_role, rid)
    if target_role is Role.SUBSCRIPTION:
        return codec.subscription_properties(obj, now), codec.T("SubscriptionManagerRP")
    if target_role is Role.PULL_POINT:
        return codec.pull_point_properties(obj, now), f"{{{WSNMOM}}}PullPointRP"
    return codec.registration_properties(obj, now), codec.BR("PublisherRegistrationRP")


def _lookup(service: Any, role: Role, rid: str) -> Any:
    if role is Role.SUBSCRIPTION:
        return service.get_subscription(rid)
    if role is Role.PULL_POINT:
        return service.get_pull_point(rid)
    return service.get_registration(rid)


def _resource_properties(
    service: Any, role: Role, resource_id: str | None, op: Op, req: SoapRequest
) -> etree._Element:
    if op is Op.GET_RESOURCE_PROPERTY:
        name = codec.parse_get_resource_property(req.body)
        table, _ = _property_table(service, role, resource_id, req)
        return codec.get_resource_property_response(table, [name])
    if op is Op.GET_MULTIPLE_RESOURCE_PROPERTIES:
        names = codec.parse_get_multiple_resource_properties(req.body)
        table, _ = _property_table(service, role, resource_id, req)
        return codec.get_resource_property_response(table, names, multiple=True)
    table, doc_tag = _property_table(service, role, resource_id, req)
    return codec.resource_property_document(table, doc_tag)
