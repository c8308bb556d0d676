"""``PullForward`` (soap_frontend/pull_forward.py) over real HTTP: a request to a pull
point another instance reads is sent there with a signature and its answer relayed with
the reader's ``WSNMOM-Instance``; a forwarding header that does not verify is refused
(403); with no live reader, or one that cannot be reached, the answer is
ResourceUnavailableFault with 503 and ``Retry-After``.  The cluster's two instances are
two WSGI stacks in this process, the reader served by a real HTTP server."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest
import requests
from wsnmom.core.coordination import InstanceInfo, shard_of
from wsnmom.core.pull_owners import PullOwners
from wsnmom.soap_frontend.pull_forward import FORWARD_HEADER, WINDOW, PullForward, sign
from wsnmom.soap_frontend.request_ids import RequestIds

from tests.support.ports import closed_port
from tests.support.soap import content_type, envelope, fault_name
from wsnmom.testing.gateway import free_port

SECRET = "s" * 64
PP = "pp-1"
PATH = f"/wsn/pullpoints/{PP}"
BODY = envelope("<wsnt:GetMessages/>")


class Quiet(WSGIRequestHandler):
    def log_message(self, *args: Any) -> None:
        return None


def readers(
    instance: str, *, here: bool, table: list[InstanceInfo], secret: str = SECRET
) -> PullOwners:
    return PullOwners(
        active=True,
        instance=instance,
        shards=4,
        lease=3.0,
        delivers=lambda _id: here,
        instances=lambda: table,
        retry_after=5.0,
        secret=lambda: secret,
    )


def owner_info(url: str, *, age: float = 0.1) -> InstanceInfo:
    return InstanceInfo("g1", url, "v", age, ((shard_of(PP, 4), 1),), 2.0)


class Reader:
    """The reading instance: records what reached its application."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, bytes, dict[str, str]]] = []
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        stack = RequestIds(
            PullForward(self._app, readers("g1", here=True, table=[]), 1 << 20), instance="g1"
        )
        self.server: WSGIServer = make_server("127.0.0.1", port, stack, handler_class=Quiet)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _app(self, environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length)
        headers = {k: str(v) for k, v in environ.items() if k.startswith("HTTP_")}
        self.seen.append((str(environ["PATH_INFO"]), body, headers))
        start("200 OK", [("Content-Type", "application/soap+xml"), ("X-Read", "yes")])
        return [b"<answer/>"]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def reader() -> Iterator[Reader]:
    r = Reader()
    try:
        yield r
    finally:
        r.close()


def front(table: list[InstanceInfo]) -> tuple[str, Callable[[], None]]:
    """The instance a client asks (g0, not the reader), served over HTTP."""

    def local(environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
        start("200 OK", [("Content-Type", "text/plain")])
        return [b"answered here"]

    port = free_port()
    stack = RequestIds(PullForward(local, readers("g0", here=False, table=table), 1 << 20), "g0")
    server = make_server("127.0.0.1", port, stack, handler_class=Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def close() -> None:
        server.shutdown()
        server.server_close()

    return f"http://127.0.0.1:{port}", close


def post(url: str, path: str = PATH, **headers: str) -> requests.Response:
    return requests.post(
        url + path, data=BODY, headers={"Content-Type": content_type(), **headers}, timeout=10
    )


def test_a_request_for_a_pull_point_read_elsewhere_is_forwarded_and_relayed(
    reader: Reader,
) -> None:
    url, close = front([owner_info(reader.url)])
    try:
        r = post(url, Authorization="Basic dTpw", **{"X-Request-Id": "req-1"})
        assert r.status_code == 200 and r.content == b"<answer/>"
        # the answer names the instance that read, once; the request id stays the client's
        assert r.headers["WSNMOM-Instance"] == "g1" and r.headers["X-Read"] == "yes"
        assert r.headers["X-Request-Id"] == "req-1"
        [(path, body, headers)] = reader.seen
        assert path == PATH and body == BODY
        # the client's credentials go along; the signature verifies
        assert headers["HTTP_AUTHORIZATION"] == "Basic dTpw"
        assert headers["HTTP_X_REQUEST_ID"] == "req-1"
        assert headers["HTTP_WSNMOM_FORWARDED"].startswith("g0 ")
        # other paths are answered where they arrive
        assert post(url, "/wsn/broker").content == b"answered here"
    finally:
        close()


def test_a_forwarding_header_that_does_not_verify_is_refused(reader: Reader) -> None:
    now = int(time.time())
    good = sign(SECRET, "g0", now, PATH, BODY)
    refused = {
        "made up": f"g0 {now} {'0' * 64}",
        "another secret": sign("x" * 64, "g0", now, PATH, BODY),
        "another path": sign(SECRET, "g0", now, "/wsn/pullpoints/other", BODY),
        "another body": sign(SECRET, "g0", now, PATH, BODY + b" "),
        "too old": sign(SECRET, "g0", now - int(WINDOW) - 5, PATH, BODY),
        "malformed": "g0",
    }
    for why, value in refused.items():
        r = post(reader.url, **{FORWARD_HEADER: value})
        assert r.status_code == 403, why
        assert "Fault" in r.text, why
    assert reader.seen == []  # nothing reached the application
    assert post(reader.url, **{FORWARD_HEADER: good}).status_code == 200


def test_no_live_reader_or_an_unreachable_one_answers_try_again() -> None:
    with closed_port() as port:
        tables = {
            "nobody holds the shard": [],
            "its heartbeat is older than the lease": [owner_info("http://127.0.0.1:1", age=5)],
            "it cannot be reached": [owner_info(f"http://127.0.0.1:{port}")],
        }
        for why, table in tables.items():
            url, close = front(table)
            try:
                r = post(url)
            finally:
                close()
            assert r.status_code == 503, why
            assert r.headers["Retry-After"] == "5", why
            assert fault_name(r.content) == "ResourceUnavailableFault", why
            assert r.headers["WSNMOM-Instance"] == "g0", why
