"""Who is calling, and may they administer the gateway: the one interface every HTTP view
uses (SOAP endpoints, the admin JSON API, the admin page).

A caller is a :class:`~wsnmom.core.access.Principal` (alias :data:`Caller`): ``name``
(None for anonymous), ``admin``, its topic ACLs and quotas.  Inside a Flask view::

    from wsnmom.soap_frontend import identity

    @bp.post("/admin/purge")
    def purge() -> Response:
        if (refused := identity.admin_refusal()) is not None:
            return refused            # 401 with a challenge, or 403
        caller = identity.current_caller()   # an admin here
        ...

* :func:`current_caller` -- the caller of the current Flask request, from its HTTP
  credentials (Basic, bearer token, TLS client certificate, a trusted proxy's identity
  header).  A WS-Security UsernameToken lives in a SOAP envelope and is only seen by the
  SOAP endpoints.  Raises :class:`AuthenticationFailed` for credentials that are given
  but wrong.
* :func:`is_admin` -- whether the current request may administer the gateway: an
  authenticated admin identity; or, while authentication is off, a client connected
  straight from a loopback address (no ``Forwarded`` / ``X-Forwarded-For``).
* :func:`admin_refusal` -- None when :func:`is_admin`, else the response to send: 401
  with ``WWW-Authenticate`` (no or wrong credentials) or 403 (an identity that is not an
  admin).
* :func:`caller_of` -- the same as :func:`current_caller` for a WSGI ``environ`` outside
  Flask.

The answer is computed once per request and cached in the environ
(``wsnmom.caller``).  The credentials themselves are checked by
:class:`~wsnmom.soap_frontend.auth.Authenticator` (``app.extensions["wsnmom.auth"]``).
"""

from __future__ import annotations

import ipaddress
import json
from typing import TYPE_CHECKING, Any

from flask import Response, current_app, request
from wsnmom.core.access import ANONYMOUS, Principal

if TYPE_CHECKING:
    from .auth import Authenticator

__all__ = [
    "ANONYMOUS",
    "AuthenticationFailed",
    "Caller",
    "admin_refusal",
    "authenticator",
    "caller_of",
    "current_caller",
    "is_admin",
]

#: the identity of a request (core's :class:`~wsnmom.core.access.Principal`)
Caller = Principal

#: where a request's caller is cached
ENVIRON_KEY = "wsnmom.caller"


class AuthenticationFailed(Exception):
    """Credentials were presented but are not valid (answered 401; the message is for the
    log only, never for the client)."""


def authenticator(app: Any = None) -> Authenticator:
    """The application's authenticator (the current Flask app's by default)."""
    target = app if app is not None else current_app
    auth: Authenticator = target.extensions["wsnmom.auth"]
    return auth


def caller_of(environ: dict[str, Any], app: Any = None) -> Principal:
    """The HTTP-level caller of the WSGI request ``environ`` (cached in it).

    :raises AuthenticationFailed: credentials were given but are wrong.
    """
    cached = environ.get(ENVIRON_KEY)
    if isinstance(cached, Principal):
        return cached
    principal = authenticator(app).http_caller(environ)
    environ[ENVIRON_KEY] = principal
    return principal


def current_caller() -> Principal:
    """The caller of the current Flask request (see :func:`caller_of`)."""
    return caller_of(request.environ)


def _direct_loopback(environ: dict[str, Any]) -> bool:
    if environ.get("HTTP_FORWARDED") or environ.get("HTTP_X_FORWARDED_FOR"):
        return False
    try:
        remote = str(environ.get("REMOTE_ADDR") or "").split("%", 1)[0]
        return ipaddress.ip_address(remote).is_loopback
    except ValueError:
        return False


def is_admin() -> bool:
    """Whether the current request may administer the gateway (see the module docstring);
    wrong credentials are not an admin."""
    auth = authenticator()
    try:
        caller = current_caller()
    except AuthenticationFailed:
        return False
    if caller.admin:
        return True
    return not auth.enabled and caller.anonymous and _direct_loopback(request.environ)


def admin_refusal() -> Response | None:
    """None when the current request may administer the gateway, else a JSON refusal:
    401 with the ``WWW-Authenticate`` challenge when it has no or wrong credentials, 403
    for an identity that is not an admin."""
    if is_admin():
        return None
    auth = authenticator()
    try:
        caller = current_caller()
    except AuthenticationFailed:
        caller = ANONYMOUS
    if not auth.enabled:
        message = "the admin interface answers loopback clients only"
        return _json({"error": message}, 403)
    if caller.anonymous:
        return _json({"error": "authentication required"}, 401, headers=auth.challenge_headers())
    return _json({"error": "an admin identity is required"}, 403)


def _json(data: dict[str, Any], status: int, headers: Any = ()) -> Response:
    return Response(
        json.dumps(data) + "\n", status=status, mimetype="application/json", headers=list(headers)
    )
