"""The admin API's action endpoints, on the admin blueprint (:mod:`.admin_api`), and the
one way every admin action runs (:func:`_act`: the caller checked, the action forwarded
to the instance holding the resource where needed, run as the admin, logged).

Acting (authenticated admins; ``POST``, never ``GET``)::

    POST /wsn/admin/api/subscriptions/<id>/(pause|resume|unsubscribe|purge)
    POST /wsn/admin/api/pullpoints/<id>/purge
    POST /wsn/admin/api/notify              publish {"topic", "payload", "content_type"}

Each action and each refused one is logged (logger ``wsnmom.admin``) with the caller and
the client address.  Errors as the rest of the admin API: 404 (unknown resource), 409 (the
broker refused), 501 (the middleware cannot purge), 503 (middleware unreachable;
``Retry-After``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flask import Response, request
from lxml import etree
from wsnmom.core import errors
from wsnmom.core.access import PRINCIPAL
from wsnmom.core.app_headers import HeaderRefused, validated
from wsnmom.core.codec import wrap_native
from wsnmom.core.model import ExpressionSource, InboundNotification
from wsnmom.core.safe_xml import hardened_parser
from wsnmom.topic_mapping.dialects import CONCRETE

from .admin_api import _caller, _error, _json, _refused_acting, _service, admin_api, audit
from .admin_auth import AdminCaller
from .admin_forward import elsewhere

__all__ = ["publish", "pull_point_purge", "subscription_action"]


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
