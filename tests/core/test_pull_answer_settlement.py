"""GetMessages through the WSGI application (real core on the embedded adapter): the
messages of an answer are settled only once the server took the whole body; an answer the
server never wrote (the client went away, the server closed it first) is handed out
again, first, by the next GetMessages; a written one never comes again
(``core.pull_handout``, ``soap_frontend.settled_answers``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lxml import etree
from werkzeug.test import EnvironBuilder
from wsnmom.core.config import Settings
from wsnmom.core.model import CreatePullPointRequest
from wsnmom.core.service import BrokerService
from wsnmom.soap_frontend import create_app

from tests.support.soap import content_type, envelope

from .conftest import note

Wsgi = Callable[[dict[str, Any], Callable[..., Any]], Any]


def _app(service: BrokerService) -> Wsgi:
    settings = Settings(max_request_bytes=64 * 1024, host="127.0.0.1")
    settings.auth.required = "false"
    app: Wsgi = create_app(service, settings)
    return app


def _get_messages(app: Wsgi, pull_point_id: str) -> tuple[str, Any]:
    """Start a GetMessages answer; its status and its unread body (a WSGI iterable)."""
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


def _payloads(data: bytes) -> list[str]:
    root = etree.fromstring(data)
    return [el.text or "" for el in root.iter("m")]


def _written(app: Wsgi, pull_point_id: str) -> list[str]:
    """A GetMessages answer the server writes whole (iterated to its end, then closed)."""
    status, body = _get_messages(app, pull_point_id)
    try:
        data = b"".join(body)
    finally:
        body.close()
    assert status.startswith("200"), data
    return _payloads(data)


def test_an_answer_never_written_is_handed_out_again_first(service: BrokerService) -> None:
    app = _app(service)
    pp = service.create_pull_point(CreatePullPointRequest())
    service.notify_pull_point(pp.id, [note(f"<m>{i}</m>") for i in range(3)])
    status, body = _get_messages(app, pp.id)
    assert status.startswith("200")
    # the server closes the answer before writing its body (the client went away)
    body.close()
    service.notify_pull_point(pp.id, [note("<m>3</m>")])
    assert _written(app, pp.id) == ["0", "1", "2", "3"]
    # written whole: settled, never handed out again
    assert _written(app, pp.id) == []


def test_an_answer_cut_after_its_body_was_taken_is_settled(service: BrokerService) -> None:
    app = _app(service)
    pp = service.create_pull_point(CreatePullPointRequest())
    service.notify_pull_point(pp.id, [note("<m>0</m>")])
    _, body = _get_messages(app, pp.id)
    chunks = iter(body)
    assert _payloads(next(chunks)) == ["0"]
    # the server's write returned and it asked for more: the answer is settled
    assert list(chunks) == []
    body.close()
    service.notify_pull_point(pp.id, [note("<m>1</m>")])
    assert _written(app, pp.id) == ["1"]
