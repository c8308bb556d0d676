"""GetMessages through the gateway's WSGI application, in process, with the server's part
played here: an answer written whole (iterated to its end, then closed), or one whose
body was made but whose write never returned (its chunk taken, then closed: a client
gone, a server stopped), as ``soap_frontend.settled_answers`` tells them apart."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lxml import etree
from werkzeug.test import EnvironBuilder
from wsnmom.core.config import Settings
from wsnmom.core.ports import BrokerPort
from wsnmom.soap_frontend import create_app

from tests.support.soap import content_type, envelope

Wsgi = Callable[[dict[str, Any], Callable[..., Any]], Any]


def wsgi_app(service: BrokerPort) -> Wsgi:
    """The gateway's application over ``service`` (no authentication)."""
    settings = Settings(max_request_bytes=64 * 1024, host="127.0.0.1")
    settings.auth.required = "false"
    app: Wsgi = create_app(service, settings)
    return app


def start_get_messages(app: Wsgi, pull_point_id: str) -> tuple[str, Any]:
    """Start a GetMessages answer: its status and its unread body (a WSGI iterable)."""
    environ = EnvironBuilder(
        path=f"/wsn/pullpoints/{pull_point_id}",
        method="POST",
        data=envelope("<wsnt:GetMessages/>"),
        content_type=content_type("1.2"),
        headers={"Host": "127.0.0.1"},
    ).get_environ()
    started: list[str] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc: Any = None) -> None:
        started.append(status)

    body = app(environ, start_response)
    return started[0], body


def payloads(data: bytes) -> list[str]:
    """The texts of the ``<m>`` payloads of an answer, in order."""
    return [el.text or "" for el in etree.fromstring(data).iter("m")]


def written(app: Wsgi, pull_point_id: str) -> list[str]:
    """A GetMessages answer the server writes whole; its payloads."""
    status, body = start_get_messages(app, pull_point_id)
    try:
        data = b"".join(body)
    finally:
        body.close()
    assert status.startswith("200"), data
    return payloads(data)


def cut(app: Wsgi, pull_point_id: str) -> list[str]:
    """A GetMessages answer whose body was made and taken by the server, and whose write
    never returned (closed before the server asked for more); its payloads."""
    status, body = start_get_messages(app, pull_point_id)
    try:
        data = next(iter(body))
    finally:
        body.close()
    assert status.startswith("200"), data
    return payloads(data)
