"""The bench's set-up requests honour the overload fault: a request answered 503 is sent
again after the Retry-After its fault gives, and the refusal is counted
(``bench.scenarios.base._run_retrying``; the fan-out scenario's ``*_setup_refusals_N``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench import client
from bench.scenarios import base
from tests.support.threads import serve

FAULT = (
    b'<s:Envelope xmlns:s="http://www.w3.org/2003/05/soap-envelope"><s:Body><s:Fault>'
    b"<s:Reason><s:Text>the middleware is overloaded (connected, but slow to answer); "
    b"retry in 1 s</s:Text></s:Reason></s:Fault></s:Body></s:Envelope>"
)


class Gateway(ThreadingHTTPServer):
    """Refuses the first ``refuse`` POSTs as overloaded, then answers with an address."""

    daemon_threads = True

    def __init__(self, refuse: int) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.refuse = refuse
        self.lock = threading.Lock()
        self.posts: list[float] = []


class Handler(BaseHTTPRequestHandler):
    server: Gateway

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with self.server.lock:
            self.server.posts.append(time.monotonic())
            refused = len(self.server.posts) <= self.server.refuse
        if refused:
            status, body = 503, FAULT
        else:
            status, body = 200, b"<wsa:Address>http://127.0.0.1/sub/1</wsa:Address>"
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass


@pytest.fixture
def gateway_of() -> Iterator[Callable[[int], Gateway]]:
    started: list[Gateway] = []

    def make(refuse: int) -> Gateway:
        server = Gateway(refuse)
        serve(server)
        started.append(server)
        return server

    yield make
    for server in started:
        server.shutdown()
        server.server_close()


def _requests(server: Gateway, n: int) -> list[client.Request]:
    url = f"http://127.0.0.1:{server.server_address[1]}/broker"
    return [client.Request(url, b"<subscribe/>") for _ in range(n)]


def test_refused_requests_are_sent_again_after_the_retry_after(
    gateway_of: Callable[[int], Gateway],
) -> None:
    server = gateway_of(3)
    refusals: list[str] = []
    answers, _secs = base._run_retrying(_requests(server, 5), refusals)
    assert [status for status, _ in answers] == [200] * 5
    assert len(refusals) == 3 and all("retry in 1 s" in r for r in refusals)
    assert len(server.posts) == 8
    # the three were sent again only after the fault's Retry-After (1 s)
    assert sorted(server.posts)[5] - sorted(server.posts)[2] >= 0.9


def test_without_a_refusals_list_nothing_is_sent_again(
    gateway_of: Callable[[int], Gateway],
) -> None:
    server = gateway_of(2)
    answers, _ = base._run_retrying(_requests(server, 4), None)
    assert sorted(status for status, _ in answers) == [200, 200, 503, 503]
    assert len(server.posts) == 4
