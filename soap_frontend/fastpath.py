"""WSGI fast path for SOAP POSTs to the WS-N endpoints: ``POST /wsn/broker`` and
``POST /wsn/{subscriptions,pullpoints,registrations}/<id>``.

Flask's per-request machinery (request and app contexts, URL matching, signals, request
and response objects) cost about as much CPU as a whole one-message Notify does in the
broker.  :class:`SoapFastPath` wraps ``app.wsgi_app`` and answers such a POST by calling
:func:`.dispatch.soap_post` directly, which is what the Flask views call too, and writes the
same status line, headers and body Flask would.  A resource id is taken only when it is
plain ASCII (letters, digits, ``-._~``), which Flask's ``<resource_id>`` converter passes
unchanged; anything else goes through Flask.

It only does so while skipping Flask cannot change the outcome: no ``before_request`` /
``after_request`` / teardown functions or URL value preprocessors, no receivers on
Flask's signals, no session secret, the URL map still routes the request to the
broker view and the request has no query string.  Anything else -- GET, other paths,
plugin hooks -- goes through Flask unchanged.  Authentication needs no hook: it is part of
:func:`.dispatch.soap_post` (the WSGI environ is passed on), so both paths check it alike.
The body is read with werkzeug's ``get_input_stream`` as Flask's ``request.get_data()``
does, so size limits answer the same 413.  An exception that escapes the handler is handed
to Flask's own error handling inside a request context, as Flask's ``wsgi_app`` would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from flask import Flask, signals
from flask.sessions import SecureCookieSessionInterface
from werkzeug.exceptions import ClientDisconnected, NotFound
from werkzeug.http import HTTP_STATUS_CODES
from werkzeug.wsgi import get_input_stream
from wsnmom.core.addresses import BROKER_PATH, parse_resource_path, resource_path

from .broker_calls import Role
from .dispatch import Frontend, Posted, Reply, soap_post
from .settled_answers import SettlingBody

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

BROKER_ENDPOINT = "notification_broker.soap"
#: the Flask endpoint of each resource role's view (see ``create_app``)
RESOURCE_ENDPOINTS: Mapping[Role, str] = {
    Role.SUBSCRIPTION: "subscription_manager.soap",
    Role.PULL_POINT: "pull_point.soap",
    Role.REGISTRATION: "publisher_registration_manager.soap",
}

#: Flask's signals sent while it handles a request (a receiver makes the fast path step aside)
_SIGNALS = (
    signals.request_started,
    signals.request_finished,
    signals.request_tearing_down,
    signals.got_request_exception,
    signals.appcontext_pushed,
    signals.appcontext_popped,
    signals.appcontext_tearing_down,
)

_NO_ARGS: dict[str, str] = {}


def _request_body(environ: dict[str, Any], limit: int | None) -> bytes:
    """What Flask's ``request.get_data()`` reads: werkzeug's ``get_input_stream`` (the
    same 413 for a Content-Length over ``limit``, 400 for a body that ends early).

    The usual case under waitress -- ``wsgi.input_terminated`` (the server ends the body
    at its Content-Length), a plain Content-Length within ``limit`` -- is read here
    without werkzeug's stream wrapper, with its semantics: read up to ``limit`` bytes
    until the stream ends; a read error is a client disconnect.
    """
    length = environ.get("CONTENT_LENGTH")
    if (
        limit is None
        or "wsgi.input_terminated" not in environ
        or "HTTP_TRANSFER_ENCODING" in environ
        or not isinstance(length, str)
        or not length.isdigit()
        or not length.isascii()
        or int(length) > limit
    ):
        return bytes(get_input_stream(environ, max_content_length=limit).read())
    stream = environ["wsgi.input"]
    parts: list[bytes] = []
    got = 0
    while got < limit:
        try:
            chunk = stream.read(min(limit - got, _READ_SIZE))
        except (OSError, ValueError) as exc:
            raise ClientDisconnected() from exc
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


#: largest read of the request body at once (werkzeug's LimitedStream reads 64 KiB)
_READ_SIZE = 64 * 1024


def _status_line(code: int) -> str:
    # werkzeug's spelling ("202 ACCEPTED"), which Flask responses carry
    return f"{code} {HTTP_STATUS_CODES.get(code, 'UNKNOWN').upper()}"


class SoapFastPath:
    """WSGI middleware around ``app.wsgi_app``; see the module docstring."""

    def __init__(
        self,
        app: Flask,
        wsgi_app: WsgiApp,
        view: Callable[..., Any],
        resource_views: Mapping[Role, Callable[..., Any]] | None = None,
    ) -> None:
        self.app = app
        self.wsgi_app = wsgi_app
        #: the views create_app registered, by endpoint; one replaced = the fast path
        #: stays out
        self.views: dict[str, Callable[..., Any]] = {BROKER_ENDPOINT: view}
        for role, resource_view in (resource_views or {}).items():
            self.views[RESOURCE_ENDPOINTS[role]] = resource_view
        #: whether the application's setup (hooks, views, URL map) leaves the SOAP views
        #: alone; fixed once Flask handled its first request, when it refuses further
        #: setup methods (so it is computed on every request before that, once after)
        self._setup_plain: bool | None = None
        self._status: dict[int, str] = {}

    def _target(self, path: object) -> tuple[Role, str | None] | None:
        """(role, resource id) of a path the fast path serves, else None."""
        if path == BROKER_PATH:
            return Role.BROKER, None
        if not isinstance(path, str) or len(self.views) == 1:
            return None
        found = parse_resource_path(path)
        if found is None or path != resource_path(*found):  # exactly the resource's path
            return None
        role = Role.of(found[0])
        if RESOURCE_ENDPOINTS[role] not in self.views:
            return None
        return role, found[1]

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        path = environ.get("PATH_INFO")
        target = self._target(path)
        if (
            target is None
            or environ.get("REQUEST_METHOD") != "POST"
            or environ.get("QUERY_STRING")
            or "werkzeug.debug.preserve_context" in environ
            or not self._plain_flask()
        ):
            return self.wsgi_app(environ, start_response)
        role, resource_id = target
        app = self.app
        # what Flask's full_dispatch_request does first: no setup methods after this
        app._got_first_request = True
        try:
            data = _request_body(environ, app.config.get("MAX_CONTENT_LENGTH"))
            fe: Frontend = app.extensions["wsnmom.soap"]
            ctype = environ.get("CONTENT_TYPE")
            posted = Posted(role, resource_id, "POST", ctype, data, str(path), _NO_ARGS, environ)
            reply = soap_post(fe, posted)
        except Exception as exc:
            return self._flask_error(environ, start_response, exc)
        return self._respond(start_response, reply, environ)

    def _respond(
        self, start_response: Callable[..., Any], reply: Reply, environ: dict[str, Any]
    ) -> list[bytes] | SettlingBody:
        status = self._status.get(reply.status)
        if status is None:
            status = self._status[reply.status] = _status_line(reply.status)
        body = reply.body
        headers = [("Content-Type", reply.content_type), ("Content-Length", str(len(body)))]
        if reply.headers:
            headers.extend(reply.headers)
        start_response(status, headers)
        if reply.settlements is not None:  # settled once the server wrote it
            return SettlingBody(body, reply.settlements, environ)
        return [body]

    def _plain_flask(self) -> bool:
        """True while Flask's request handling would add nothing to the SOAP view's."""
        app = self.app
        setup = self._setup_plain
        if setup is None:
            setup = self._setup_adds_nothing() and self._routes_here()
            if app._got_first_request:
                # Flask refuses setup methods (hooks, rules, views) from now on
                self._setup_plain = setup
        if not setup:
            return False
        if app.secret_key or type(app.session_interface) is not SecureCookieSessionInterface:
            return False
        return all(not signal.receivers for signal in _SIGNALS)

    def _setup_adds_nothing(self) -> bool:
        """No request hook, URL value preprocessor or replaced view is registered."""
        app = self.app
        return not (
            any(app.before_request_funcs.values())
            or any(app.after_request_funcs.values())
            or any(app.teardown_request_funcs.values())
            or any(app.url_value_preprocessors.values())
            or app.teardown_appcontext_funcs
            or any(app.view_functions.get(ep) is not v for ep, v in self.views.items())
        )

    def _routes_here(self) -> bool:
        app = self.app
        if (
            app.config.get("SERVER_NAME")
            or app.url_map.host_matching
            or app.subdomain_matching
            or app.config.get("APPLICATION_ROOT", "/") != "/"
        ):
            return False
        adapter = app.url_map.bind("localhost")
        probes = {BROKER_ENDPOINT: BROKER_PATH}
        for role, endpoint in RESOURCE_ENDPOINTS.items():
            kind = role.kind
            if endpoint in self.views and kind is not None:
                probes[endpoint] = resource_path(kind, "probe-id")
        for endpoint, probe in probes.items():
            try:
                found, _ = adapter.match(probe, method="POST")
            except NotFound:
                return False
            except Exception:
                return False
            if found != endpoint:
                return False
        return True

    def _flask_error(
        self, environ: dict[str, Any], start_response: Callable[..., Any], exc: Exception
    ) -> Any:
        """Answer an exception that escaped the SOAP handler exactly as Flask's
        ``full_dispatch_request`` / ``wsgi_app`` would."""
        app = self.app
        ctx = app.request_context(environ)
        error: BaseException | None = None
        try:
            try:
                ctx.push()
                response = app.finalize_request(app.handle_user_exception(exc))
            except Exception as e:
                error = e
                response = app.handle_exception(e)
            return response(environ, start_response)
        finally:
            if error is not None and app.should_ignore_error(error):
                error = None
            ctx.pop(error)
