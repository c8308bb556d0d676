"""WSGI fast path for SOAP POSTs to the broker endpoint (``POST /wsn/broker``).

Flask's per-request machinery (request and app contexts, URL matching, signals, request
and response objects) cost about as much CPU as a whole one-message Notify does in the
broker.  :class:`SoapFastPath` wraps ``app.wsgi_app`` and answers a POST to
``/wsn/broker`` by calling :func:`.app.soap_post` directly, which is what the Flask view
calls too, and writes the same status line, headers and body Flask would.

It only does so while skipping Flask cannot change the outcome: no ``before_request`` /
``after_request`` / teardown functions or URL value preprocessors, no receivers on
Flask's signals, no session secret, the URL map still routes the request to the
broker view and the request has no query string.  Anything else -- GET, other paths,
plugin hooks (authentication) -- goes through Flask unchanged.  The body is read with
werkzeug's ``get_input_stream`` as Flask's ``request.get_data()`` does, so size limits
answer the same 413.  An exception that escapes the handler is handed to Flask's own error
handling inside a request context, as Flask's ``wsgi_app`` would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from flask import Flask, signals
from flask.sessions import SecureCookieSessionInterface
from werkzeug.exceptions import ClientDisconnected, NotFound
from werkzeug.http import HTTP_STATUS_CODES
from werkzeug.wsgi import get_input_stream

from .app import Frontend, Reply, Role, soap_post

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

BROKER_PATH = "/wsn/broker"
BROKER_ENDPOINT = "notification_broker.soap"

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

    def __init__(self, app: Flask, wsgi_app: WsgiApp, view: Callable[..., Any]) -> None:
        self.app = app
        self.wsgi_app = wsgi_app
        #: the broker view create_app registered; replaced = the fast path stays out
        self.view = view
        #: whether the URL map routes POST /wsn/broker to ``view`` (checked once: after the
        #: first request Flask refuses further setup such as new rules)
        self._routed: bool | None = None
        self._status: dict[int, str] = {}

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if (
            environ.get("PATH_INFO") != BROKER_PATH
            or environ.get("REQUEST_METHOD") != "POST"
            or environ.get("QUERY_STRING")
            or "werkzeug.debug.preserve_context" in environ
            or not self._plain_flask()
        ):
            return self.wsgi_app(environ, start_response)
        app = self.app
        # what Flask's full_dispatch_request does first: no setup methods after this
        app._got_first_request = True
        try:
            data = _request_body(environ, app.config.get("MAX_CONTENT_LENGTH"))
            fe: Frontend = app.extensions["wsnmom.soap"]
            reply = soap_post(
                fe,
                Role.BROKER,
                None,
                "POST",
                environ.get("CONTENT_TYPE"),
                data,
                BROKER_PATH,
                _NO_ARGS,
            )
        except Exception as exc:
            return self._flask_error(environ, start_response, exc)
        return self._respond(start_response, reply)

    def _respond(self, start_response: Callable[..., Any], reply: Reply) -> list[bytes]:
        status = self._status.get(reply.status)
        if status is None:
            status = self._status[reply.status] = _status_line(reply.status)
        body = reply.body
        start_response(
            status,
            [("Content-Type", reply.content_type), ("Content-Length", str(len(body)))],
        )
        return [body]

    def _plain_flask(self) -> bool:
        """True while Flask's request handling would add nothing to the SOAP view's."""
        app = self.app
        if (
            any(app.before_request_funcs.values())
            or any(app.after_request_funcs.values())
            or any(app.teardown_request_funcs.values())
            or any(app.url_value_preprocessors.values())
            or app.teardown_appcontext_funcs
            or app.view_functions.get(BROKER_ENDPOINT) is not self.view
            or app.secret_key
            or type(app.session_interface) is not SecureCookieSessionInterface
        ):
            return False
        for signal in _SIGNALS:
            if signal.receivers:
                return False
        routed = self._routed
        if routed is None:
            routed = self._routed = self._routes_here()
        return routed

    def _routes_here(self) -> bool:
        app = self.app
        if (
            app.config.get("SERVER_NAME")
            or app.url_map.host_matching
            or app.subdomain_matching
            or app.config.get("APPLICATION_ROOT", "/") != "/"
        ):
            return False
        try:
            endpoint, _ = app.url_map.bind("localhost").match(BROKER_PATH, method="POST")
        except NotFound:
            return False
        except Exception:
            return False
        return bool(endpoint == BROKER_ENDPOINT)

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
