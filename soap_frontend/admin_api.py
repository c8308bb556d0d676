"""Read-only JSON view of the broker's live subscriptions (``/wsn/admin/api/...``).

WS-N itself has no way to list subscriptions: the broker's resource properties name topics
and dialects, not subscribers.  Operators (``wsnmom subscriptions list``, the admin page)
read them here:

``GET /wsn/admin/api/subscriptions``        ``{"count": n, "subscriptions": [...]}``
``GET /wsn/admin/api/subscriptions/<id>``   one subscription, with its backlog (``pending``)

Each subscription is ``{"id", "address", "consumer", "state" ("active" | "paused"),
"created", "terminates" (null: no scheduled termination), "topic", "message_content",
"producer_properties" ({"dialect", "text", "namespaces"} or null), "use_raw",
"pull_point" (the pull point it feeds, or null), "soap_version"}``.

Subscription ids are capabilities (whoever knows one can unsubscribe it), so the API
answers only requests that come straight from a loopback address; a request relayed by a
proxy (``Forwarded`` / ``X-Forwarded-For``) or from elsewhere gets 403.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from flask import Blueprint, Response, current_app, request
from wsnmom.core import errors
from wsnmom.core.model import ExpressionSource, Subscription, SubscriptionState
from wsnmom.core.ports import BrokerPort
from wsnmom.core.redaction import redact_url

from .faults import xsd_datetime

__all__ = ["ADMIN_API_PREFIX", "admin_api", "subscription_json"]

ADMIN_API_PREFIX = "/wsn/admin/api"

admin_api = Blueprint("admin_api", __name__, url_prefix=ADMIN_API_PREFIX)

_PREFIX_USE = re.compile(r"(?<![\w.-])([A-Za-z_][\w.-]*):")


def _expression(expr: ExpressionSource | None) -> dict[str, Any] | None:
    if expr is None:
        return None
    used = set(_PREFIX_USE.findall(expr.text))
    return {
        "dialect": expr.dialect,
        "text": expr.text,
        "namespaces": {str(p): u for p, u in expr.namespaces.items() if p in used},
    }


def _time(value: datetime | None) -> str | None:
    return None if value is None or value.year >= 9999 else xsd_datetime(value)


def subscription_json(sub: Subscription, address: str) -> dict[str, Any]:
    """The JSON form of one subscription (see the module docstring)."""
    return {
        "id": sub.id,
        "address": address,
        "consumer": redact_url(sub.consumer.address),
        "state": "paused" if sub.state is SubscriptionState.PAUSED else "active",
        "created": _time(sub.creation_time),
        "terminates": _time(sub.termination_time),
        "topic": _expression(sub.topic),
        "message_content": _expression(sub.message_content),
        "producer_properties": _expression(sub.producer_properties),
        "use_raw": sub.use_raw,
        "pull_point": sub.pull_point_id,
        "soap_version": "1.1" if sub.soap_version.name == "SOAP11" else "1.2",
    }


def _json(data: Mapping[str, Any], status: int = 200) -> Response:
    return Response(json.dumps(data, indent=2) + "\n", status=status, mimetype="application/json")


def _from_loopback() -> bool:
    if request.headers.get("Forwarded") or request.headers.get("X-Forwarded-For"):
        return False
    try:
        return ipaddress.ip_address((request.remote_addr or "").split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def _refused() -> Response | None:
    """403 for a client that is not on the gateway's host.  Checked in each view: a
    ``before_request`` hook, even a blueprint's, would take every SOAP request off the
    WSGI fast path (:mod:`.fastpath`)."""
    if not _from_loopback():
        return _json({"error": "the admin API answers loopback clients only"}, 403)
    return None


def _service() -> BrokerPort:
    service: BrokerPort = current_app.extensions["wsnmom.soap"].service
    return service


@admin_api.get("/subscriptions")
def list_subscriptions() -> Response:
    """Every live subscription, oldest first."""
    if (refused := _refused()) is not None:
        return refused
    service = _service()
    subs = sorted(service.live_subscriptions(), key=lambda s: (s.creation_time, s.id))
    items = [subscription_json(s, service.subscription_address(s.id)) for s in subs]
    return _json({"count": len(items), "subscriptions": items})


@admin_api.get("/subscriptions/<subscription_id>")
def show_subscription(subscription_id: str) -> Response:
    """One subscription with the number of notifications waiting for it."""
    if (refused := _refused()) is not None:
        return refused
    service = _service()
    try:
        sub = service.get_subscription(subscription_id)
        pending = service.backlog(subscription_id)
    except errors.ResourceUnknown:
        return _json({"error": f"no subscription {subscription_id!r}"}, 404)
    except errors.WsnError as exc:  # the broker is not serving yet
        return _json({"error": exc.description}, 503)
    data = subscription_json(sub, service.subscription_address(subscription_id))
    data["pending"] = pending
    return _json(data)
