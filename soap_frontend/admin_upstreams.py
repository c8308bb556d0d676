"""The admin API's upstream endpoints (``wsnmom.upstreams``), on the admin blueprint.

Reading::

    GET  /wsn/admin/api/upstreams            {"count": n, "upstreams": [...]}: each one's
                                             settings (never its secrets), state
                                             (idle, subscribing, subscribed, retrying,
                                             standby, stopped), last error and counters

Acting (authenticated admins)::

    POST /wsn/admin/api/upstreams            add one: the keys of ``[[upstream]]``
                                             (docs/federation.md); kept in the store
    POST /wsn/admin/api/upstreams/<name>/remove   end its subscription and forget it

Errors as the rest of the admin API: 400 an unusable upstream (the message says why),
404 unknown upstream, 409 the name is taken or the upstream is in the configuration file,
501 a gateway without upstream relaying (an application built without ``build_runtime``).
"""

from __future__ import annotations

from typing import Any, Protocol

from flask import Response, current_app, request
from wsnmom.core import errors
from wsnmom.core.config import ConfigError, UpstreamSettings, upstream_from_json

from .admin_actions import _act
from .admin_api import _caller, _error, _json, _refused_reading, admin_api

__all__ = ["UpstreamsPort"]


class UpstreamsPort(Protocol):
    """What the admin API needs of the upstream relay."""

    def states(self) -> list[dict[str, Any]]: ...

    def add(self, spec: UpstreamSettings) -> None: ...

    def remove(self, name: str) -> None: ...


def _relay() -> UpstreamsPort | None:
    relay: UpstreamsPort | None = current_app.extensions.get("wsnmom.upstreams")
    return relay


@admin_api.get("/upstreams")
def list_upstreams() -> Response:
    """Every upstream and its state."""
    if (refused := _refused_reading(_caller())) is not None:
        return refused
    relay = _relay()
    items = relay.states() if relay is not None else []
    return _json({"count": len(items), "upstreams": items})


@admin_api.post("/upstreams")
def add_upstream() -> Response:
    """Add an upstream (the body: a JSON object with the keys of ``[[upstream]]``)."""
    form = request.get_json(silent=True)
    if not isinstance(form, dict):
        return _error('expected a JSON object: {"name": ..., "url": ..., ...}', 400)
    relay = _relay()
    name = str(form.get("name") or "")
    if relay is None:
        return _error("this gateway does not relay upstreams", 501)
    try:
        spec = upstream_from_json(form)
    except ConfigError as exc:
        return _error(str(exc), 400)

    def run() -> str:
        try:
            relay.add(spec)
        except ConfigError as exc:
            raise errors.WsnError(str(exc)) from None
        return spec.name

    return _act("upstream", name, "add", run)


@admin_api.post("/upstreams/<name>/remove")
def remove_upstream(name: str) -> Response:
    """End the upstream's subscription and forget it."""
    relay = _relay()
    if relay is None:
        return _error("this gateway does not relay upstreams", 501)

    def run() -> str:
        try:
            relay.remove(name)
        except ConfigError as exc:
            raise errors.WsnError(str(exc)) from None
        return name

    return _act("upstream", name, "remove", run)
