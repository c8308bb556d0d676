"""GetMessages through the gateway's WSGI application, in process, with the server's part
played here: an answer written whole (iterated to its end, then closed), or one whose
body was made but whose write never returned (its chunk taken, then closed: a client
gone, a server stopped), as ``soap_frontend.settled_answers`` tells them apart; or one
held on its way (``held_answer``) while the test does what it must meet."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from lxml import etree
from werkzeug.test import EnvironBuilder
from wsnmom.core.config import Settings
from wsnmom.core.ports import BrokerPort
from wsnmom.core.service import BrokerService
from wsnmom.soap_frontend import create_app

from tests.support.soap import content_type, envelope
from tests.support.waiting import wait_until

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
        headers=[("Host", "127.0.0.1")],
    ).get_environ()
    started: list[str] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc: Any = None) -> None:
        started.append(status)

    body = app(environ, start_response)
    return started[0], body


def pulled(service: BrokerService, pull_point_id: str, n: int) -> list[bytes]:
    """The payloads of at least ``n`` messages GetMessages (through the service) hands
    out from the pull point: all it handed out until then."""
    got: list[bytes] = []

    def enough() -> bool:
        got.extend(m.payload for m in service.get_messages(pull_point_id, None))
        return len(got) >= n

    wait_until(enough, 10, what=f"{n} message(s) from the pull point")
    return got


def pulled_until_sentinel(service: BrokerService, pull_point_id: str) -> list[bytes]:
    """Every payload GetMessages (through the service) hands out from the pull point until
    one holding ``sentinel`` (a barrier)."""
    got: list[bytes] = []

    def seen() -> bool:
        got.extend(m.payload for m in service.get_messages(pull_point_id, None))
        return any(b"sentinel" in p for p in got)

    wait_until(seen, 10, what="the sentinel")
    return got


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


def written_up_to(app: Wsgi, pull_point_id: str, text: str, timeout: float = 20) -> list[str]:
    """The payloads written answers hand out, one after another, up to the answer that
    holds the payload ``text`` (a sentinel)."""
    got: list[str] = []

    def seen() -> bool:
        got.extend(written(app, pull_point_id))
        return text in got

    wait_until(seen, timeout, what=f"the payload {text!r}")
    return got


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


class HeldAnswer:
    """A GetMessages answer on its way: its messages taken and its body made, not yet
    sent (unsettled).  ``write`` sends it whole, ``cut`` takes its first chunk only (the
    server's write never returned); ``status`` and ``data``: what the server got."""

    def __init__(self, app: Wsgi, pull_point_id: str) -> None:
        self.status, self._body = start_get_messages(app, pull_point_id)
        self.data = b""

    def write(self) -> bytes:
        self.data = b"".join(self._body)
        return self.data

    def cut(self) -> bytes:
        self.data = next(iter(self._body))
        return self.data

    def settle(self, how: str) -> bytes:
        """``how``: "written" or "cut"."""
        assert how in ("written", "cut"), how
        return self.write() if how == "written" else self.cut()

    def holds(self, text: bytes) -> bool:
        """Whether the answer was a 200 whose data (as far as sent) holds ``text``."""
        return self.status.startswith("200") and text in self.data


@contextmanager
def held_answer(app: Wsgi, pull_point_id: str) -> Iterator[HeldAnswer]:
    """Start a GetMessages answer and hold it on its way for the block; closed at its
    end (settled as written if written whole, else as cut)."""
    answer = HeldAnswer(app, pull_point_id)
    try:
        yield answer
    finally:
        answer._body.close()
