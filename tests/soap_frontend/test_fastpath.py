"""The WSGI fast path for POST /wsn/broker answers byte for byte what the Flask view does,
and steps aside whenever Flask's request handling could change the outcome."""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from typing import Any

import pytest
from flask import Flask, Response, request_started
from flask.testing import FlaskClient
from lxml import etree
from werkzeug.test import EnvironBuilder
from wsnmom.core import errors
from wsnmom.core.config import Settings
from wsnmom.core.model import CreatePullPointRequest, NotificationMessage
from wsnmom.soap_frontend import create_app
from wsnmom.soap_frontend.fastpath import SoapFastPath

from tests.soap_frontend.fake_service import FakeService
from tests.support.soap import SOAP12, content_type, envelope, notify_body, subscribe_body

_MESSAGE_ID = re.compile(rb"(MessageID>)urn:uuid:[0-9a-f-]+(<)")


def _app(service: FakeService) -> tuple[Flask, list[int]]:
    """An app and the list its Flask dispatches are counted in."""
    app = create_app(service, Settings(max_request_bytes=4096))
    flask_calls: list[int] = []
    original = app.full_dispatch_request

    def counting() -> Any:
        flask_calls.append(1)
        return original()

    app.full_dispatch_request = counting  # type: ignore[method-assign]
    return app, flask_calls


def _answer(client: FlaskClient, data: bytes, ctype: str | None, **kw: Any) -> tuple[Any, ...]:
    # the same request id on both paths, so that the answers can be compared
    kw["headers"] = {"X-Request-Id": "same-id", **kw.get("headers", {})}
    resp = client.post("/wsn/broker", data=data, content_type=ctype, **kw)
    headers = [(k, v) for k, v in resp.headers.items()]
    return resp.status, headers, _MESSAGE_ID.sub(rb"\1X\2", resp.data)


NOTIFY = notify_body(("tns:a", "<p:x xmlns:p='urn:p'>1</p:x>"))
REQUESTS: list[tuple[str, bytes, str | None]] = [
    ("notify 1.2", envelope(NOTIFY), content_type("1.2")),
    ("notify 1.1", envelope(NOTIFY, version="1.1"), content_type("1.1")),
    ("subscribe 1.2", envelope(subscribe_body("http://c/x"), message_id="urn:m:1"), None),
    ("subscribe 1.1", envelope(subscribe_body("http://c/x"), version="1.1"), content_type("1.1")),
    ("unknown op", envelope("<wsnt:Bogus/>"), content_type("1.2")),
    ("empty body", envelope(""), content_type("1.2")),
    ("not xml", b"<s:Envelope", content_type("1.2")),
    ("empty", b"", content_type("1.2")),
    ("not soap", b"<a/>", content_type("1.2")),
    ("wrong type", envelope(NOTIFY), "application/json"),
    ("no type", envelope(NOTIFY), None),
    ("resource op", envelope("<wsnt:PauseSubscription/>"), content_type("1.2")),
    ("too large", envelope("<wsnt:Notify>" + "x" * 5000 + "</wsnt:Notify>"), "text/xml"),
]


@pytest.mark.parametrize(("name", "data", "ctype"), REQUESTS, ids=[r[0] for r in REQUESTS])
def test_same_answer_as_flask(name: str, data: bytes, ctype: str | None) -> None:
    if name.startswith("subscribe 1.2"):
        ctype = content_type("1.2")
    fast_service, slow_service = FakeService(), FakeService()
    slow_service.now_value = fast_service.now_value
    fast, fast_calls = _app(fast_service)
    slow, slow_calls = _app(slow_service)
    slow.before_request(lambda: None)  # any request hook sends requests through Flask
    fast_answer = _answer(fast.test_client(), data, ctype)
    slow_answer = _answer(slow.test_client(), data, ctype)
    assert fast_answer == slow_answer
    assert slow_calls == [1]
    assert fast_calls == []  # a 413 too: werkzeug's exception, answered by Flask's handler
    assert len(fast_service.notified) == len(slow_service.notified)


def test_notify_reaches_the_service_without_flask() -> None:
    service = FakeService()
    app, flask_calls = _app(service)
    status, headers, body = _answer(app.test_client(), envelope(NOTIFY), content_type("1.2"))
    assert (status, body) == ("202 ACCEPTED", b"")
    assert headers == [
        ("Content-Type", "text/html; charset=utf-8"),
        ("Content-Length", "0"),
        ("X-Request-Id", "same-id"),
    ]
    assert flask_calls == []
    assert len(service.notified) == 1


def test_service_fault_is_a_soap_fault() -> None:
    service = FakeService()
    service.fail_with = errors.ResourceUnavailable("middleware down")
    app, flask_calls = _app(service)
    status, headers, body = _answer(
        app.test_client(), envelope(NOTIFY, version="1.1"), content_type("1.1")
    )
    assert status == "500 INTERNAL SERVER ERROR"
    assert headers[0] == ("Content-Type", "text/xml; charset=utf-8")
    assert b"ResourceUnavailableFault" in body
    assert flask_calls == []


@pytest.mark.parametrize(
    "hook",
    [
        lambda app: app.before_request(lambda: Response("denied", status=401)),
        lambda app: app.after_request(lambda r: r),
        lambda app: app.teardown_request(lambda e: None),
        lambda app: app.url_value_preprocessor(lambda endpoint, values: None),
        lambda app: setattr(app, "secret_key", "k"),
        lambda app: app.view_functions.__setitem__(
            "notification_broker.soap", lambda: Response("other")
        ),
    ],
)
def test_flask_hooks_make_it_step_aside(hook: Callable[[Flask], Any]) -> None:
    service = FakeService()
    app, flask_calls = _app(service)
    hook(app)
    _answer(app.test_client(), envelope(NOTIFY), content_type("1.2"))
    assert flask_calls == [1]


def test_authentication_hook_still_refuses() -> None:
    service = FakeService()
    app, _ = _app(service)
    app.before_request(lambda: Response("denied", status=401))
    status, _, body = _answer(app.test_client(), envelope(NOTIFY), content_type("1.2"))
    assert (status, body) == ("401 UNAUTHORIZED", b"denied")
    assert service.notified == []


def test_signal_receiver_makes_it_step_aside() -> None:
    service = FakeService()
    app, flask_calls = _app(service)
    seen: list[Any] = []

    def receiver(sender: Any, **kw: Any) -> None:
        seen.append(sender)

    request_started.connect(receiver, app)
    try:
        _answer(app.test_client(), envelope(NOTIFY), content_type("1.2"))
    finally:
        request_started.disconnect(receiver, app)
    assert flask_calls == [1] and seen == [app]


@pytest.mark.parametrize("late_change", ["session secret", "signal receiver"])
def test_changes_possible_after_the_first_request_are_still_seen(late_change: str) -> None:
    service = FakeService()
    app, flask_calls = _app(service)
    client = app.test_client()
    _answer(client, envelope(NOTIFY), content_type("1.2"))
    _answer(client, envelope(NOTIFY), content_type("1.2"))
    assert flask_calls == []  # the setup checks are now cached

    def receiver(sender: Any, **kw: Any) -> None:
        pass

    if late_change == "session secret":
        app.secret_key = "k"
    else:
        request_started.connect(receiver, app)
    try:
        _answer(client, envelope(NOTIFY), content_type("1.2"))
    finally:
        request_started.disconnect(receiver, app)
    assert flask_calls == [1]
    assert len(service.notified) == 3


def test_other_requests_go_through_flask() -> None:
    service = FakeService()
    app, flask_calls = _app(service)
    client = app.test_client()
    assert client.get("/wsn/broker?wsdl").status_code == 200
    assert client.post("/wsn/broker?x=1", data=envelope(NOTIFY)).status_code == 415
    assert client.get("/healthz").status_code == 200
    assert len(flask_calls) == 3


def test_first_request_ends_flask_setup() -> None:
    app, _ = _app(FakeService())
    _answer(app.test_client(), envelope(NOTIFY), content_type("1.2"))
    with pytest.raises(AssertionError):
        app.add_url_rule("/late", "late", lambda: "late")


def test_escaped_exception_gets_flask_error_handling(monkeypatch: pytest.MonkeyPatch) -> None:
    app, flask_calls = _app(FakeService())
    app.config["PROPAGATE_EXCEPTIONS"] = False

    def boom(*args: Any) -> Any:
        raise RuntimeError("bug")

    monkeypatch.setattr("wsnmom.soap_frontend.fastpath.soap_post", boom)
    resp = app.test_client().post(
        "/wsn/broker", data=envelope(NOTIFY), content_type=content_type("1.2")
    )
    assert resp.status_code == 500
    # a SOAP Receiver fault that says nothing about the exception
    fault = etree.fromstring(resp.data).find(f"{{{SOAP12}}}Body/{{{SOAP12}}}Fault")
    assert fault is not None
    assert fault.findtext(f"{{{SOAP12}}}Code/{{{SOAP12}}}Value") == "s:Receiver"
    assert b"bug" not in resp.data and b"internal error" in resp.data
    assert flask_calls == []


def test_client_disconnect_is_a_bad_request() -> None:
    app, _ = _app(FakeService())
    data = envelope(NOTIFY)
    builder = EnvironBuilder(
        path="/wsn/broker", method="POST", data=data[:20], content_type=content_type("1.2")
    )
    environ = builder.get_environ()
    environ["CONTENT_LENGTH"] = str(len(data))  # the client promised more than it sent
    statuses: list[str] = []
    body = b"".join(app(environ, lambda status, headers, exc=None: statuses.append(status)))
    assert statuses == ["400 BAD REQUEST"]
    fault = etree.fromstring(body).find(f"{{{SOAP12}}}Body/{{{SOAP12}}}Fault")
    assert fault is not None
    assert fault.findtext(f"{{{SOAP12}}}Code/{{{SOAP12}}}Value") == "s:Sender"
    assert isinstance(app.wsgi_app.app.app.app, SoapFastPath)  # type: ignore[attr-defined]


def test_server_name_makes_it_step_aside() -> None:
    service = FakeService()
    app, flask_calls = _app(service)
    app.config["SERVER_NAME"] = "broker.example"
    status, _, _ = _answer(app.test_client(), envelope(NOTIFY), content_type("1.2"))
    assert flask_calls == [1]
    assert status == "202 ACCEPTED"  # the test client uses the server name as host
    assert len(service.notified) == 1


class _Trickle(io.RawIOBase):
    """A request body stream that hands out at most ``step`` bytes per read, then fails
    or ends."""

    def __init__(self, data: bytes, step: int, fail: bool = False) -> None:
        self.data, self.step, self.fail = data, step, fail

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if not self.data and self.fail:
            raise OSError("connection reset")
        n = self.step if size < 0 else min(size, self.step)
        out, self.data = self.data[:n], self.data[n:]
        return out


def _waitress_environ(stream: Any, length: int, **extra: Any) -> dict[str, Any]:
    environ = EnvironBuilder(
        path="/wsn/broker", method="POST", content_type=content_type("1.2")
    ).get_environ()
    environ.update(
        {"wsgi.input": stream, "CONTENT_LENGTH": str(length), "wsgi.input_terminated": True}
    )
    environ.update(extra)
    return environ


def _call(app: Flask, environ: dict[str, Any]) -> tuple[str, bytes]:
    statuses: list[str] = []
    body = b"".join(app(environ, lambda status, headers, exc=None: statuses.append(status)))
    return statuses[0], _MESSAGE_ID.sub(rb"\1X\2", body)


@pytest.mark.parametrize("step", [1, 7, 1 << 20])
def test_body_read_in_pieces_is_read_whole(step: int) -> None:
    service = FakeService()
    app, flask_calls = _app(service)
    data = envelope(NOTIFY)
    status, _ = _call(app, _waitress_environ(_Trickle(data, step), len(data)))
    assert status == "202 ACCEPTED"
    assert len(service.notified) == 1 and flask_calls == []


def test_body_read_error_is_a_bad_request() -> None:
    app, _ = _app(FakeService())
    data = envelope(NOTIFY)
    status, body = _call(app, _waitress_environ(_Trickle(data[:50], 10, fail=True), len(data)))
    assert status == "400 BAD REQUEST" and b"<s:Value>s:Sender</s:Value>" in body


@pytest.mark.parametrize(
    "extra",
    [{}, {"HTTP_TRANSFER_ENCODING": "chunked"}, {"CONTENT_LENGTH": "+12"}],
    ids=["plain", "chunked", "odd length"],
)
@pytest.mark.parametrize("size", [100, 4096, 4097, 6000])
def test_body_limits_match_werkzeug(extra: dict[str, str], size: int) -> None:
    """The fast path's own read and werkzeug's give the same answers at and over the
    limit (4096 bytes here), whatever the headers say."""
    answers = []
    now = FakeService().now_value
    for hook in (False, True):
        service = FakeService()
        service.now_value = now  # the same fault Timestamp on both paths
        app, _ = _app(service)
        if hook:
            app.before_request(lambda: None)
        data = envelope(NOTIFY + "<!--" + "x" * max(0, size - len(envelope(NOTIFY)) - 7) + "-->")
        answers.append(
            (_call(app, _waitress_environ(io.BytesIO(data), len(data), **extra)), service.notified)
        )
    assert answers[0][0] == answers[1][0]
    assert len(answers[0][1]) == len(answers[1][1])


# --------------------------------------------------------------------------- resources

GET_MESSAGES = "<wsnt:GetMessages><wsnt:MaximumNumber>1</wsnt:MaximumNumber></wsnt:GetMessages>"


def _with_pull_point(service: FakeService) -> str:
    """An empty pull point (the same id in every FakeService)."""
    return service.create_pull_point(CreatePullPointRequest()).id


RESOURCE_REQUESTS: list[tuple[str, str, bytes]] = [
    ("get messages", "/wsn/pullpoints/{pp}", envelope(GET_MESSAGES)),
    ("get messages 1.1", "/wsn/pullpoints/{pp}", envelope(GET_MESSAGES, version="1.1")),
    ("unknown pull point", "/wsn/pullpoints/nope", envelope(GET_MESSAGES)),
    ("destroy pull point", "/wsn/pullpoints/{pp}", envelope("<wsnt:DestroyPullPoint/>")),
    ("broker op on a resource", "/wsn/pullpoints/{pp}", envelope(NOTIFY)),
    ("unknown subscription", "/wsn/subscriptions/s-x", envelope("<wsnt:PauseSubscription/>")),
    ("unknown registration", "/wsn/registrations/r-x", envelope("<wsnt:PauseSubscription/>")),
    ("not soap", "/wsn/pullpoints/{pp}", b"<a/>"),
]


@pytest.mark.parametrize(
    ("name", "path", "data"), RESOURCE_REQUESTS, ids=[r[0] for r in RESOURCE_REQUESTS]
)
def test_resource_endpoints_same_answer_as_flask(name: str, path: str, data: bytes) -> None:
    fast_service, slow_service = FakeService(), FakeService()
    slow_service.now_value = fast_service.now_value
    pp = _with_pull_point(fast_service)
    assert _with_pull_point(slow_service) == pp
    fast, fast_calls = _app(fast_service)
    slow, slow_calls = _app(slow_service)
    slow.before_request(lambda: None)
    answers = []
    for app in (fast, slow):
        resp = app.test_client().post(
            path.format(pp=pp),
            data=data,
            content_type=content_type("1.2"),
            headers={"X-Request-Id": "same-id"},
        )
        body = _MESSAGE_ID.sub(rb"\1X\2", resp.data)
        answers.append((resp.status, list(resp.headers.items()), body))
    assert answers[0] == answers[1]
    assert fast_calls == [] and slow_calls == [1]
    assert fast_service.pps.keys() == slow_service.pps.keys()


def test_get_messages_reaches_the_service_without_flask() -> None:
    service = FakeService()
    pp = _with_pull_point(service)
    service.pp_queues[pp] = [
        NotificationMessage("m1", b"<p:x xmlns:p='urn:p'>1</p:x>", None),
        NotificationMessage("m2", b"<p:x xmlns:p='urn:p'>2</p:x>", None),
    ]
    app, flask_calls = _app(service)
    resp = app.test_client().post(
        f"/wsn/pullpoints/{pp}", data=envelope(GET_MESSAGES), content_type=content_type("1.2")
    )
    assert resp.status_code == 200 and b"GetMessagesResponse" in resp.data
    assert resp.data.count(b"NotificationMessage>") == 2  # one element: open and close tag
    assert [m.message_id for m in service.pp_queues[pp]] == ["m2"]
    assert flask_calls == []


@pytest.mark.parametrize(
    "path",
    [
        "/wsn/pullpoints/p%C3%A9",  # not plain ASCII once decoded
        "/wsn/pullpoints/a b",
        "/wsn/pullpoints/p1/",  # trailing slash: Flask's routing decides
        "/wsn/pullpoints/",
        "/wsn/other/p1",
    ],
)
def test_unusual_resource_paths_go_through_flask(path: str) -> None:
    app, flask_calls = _app(FakeService())
    app.test_client().post(path, data=envelope(GET_MESSAGES), content_type=content_type("1.2"))
    assert flask_calls == [1]


def test_replaced_resource_view_makes_it_step_aside() -> None:
    app, flask_calls = _app(FakeService())
    app.view_functions["pull_point.soap"] = lambda resource_id: Response("mine")
    resp = app.test_client().post(
        "/wsn/pullpoints/p1", data=envelope(GET_MESSAGES), content_type=content_type("1.2")
    )
    assert resp.data == b"mine" and flask_calls == [1]
    # the broker endpoint steps aside too: the decision covers the whole application
    app.test_client().post("/wsn/broker", data=envelope(NOTIFY), content_type=content_type("1.2"))
    assert flask_calls == [1, 1]
