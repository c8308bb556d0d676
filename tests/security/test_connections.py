"""Issue 16, finding 3: about 100 slow connections took the gateway offline (waitress'
default connection limit; 200 clients sending headers a byte at a time for 30 s: 0 of 3
normal requests answered).  Now ``[connections]`` bounds the connections in all and per
client, and the time a request's headers, its body and an idle keep-alive connection may
take (``wsnmom.connections``).

The slow clients come from loopback addresses other than 127.0.0.1 (the normal requests'
address), as an attacker's would come from elsewhere than the users'.

Cost: two gateways, about 15 s (8 s of slow-client attack).
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Callable, Iterator

import pytest
import requests

from tests.fixtures.server import RunningServer
from tests.support.abuse import PROMPT, STARVED_HEADER_TIMEOUT, NormalTraffic, SlowClients
from tests.support.soap import notify_body
from tests.support.waiting import wait_until

from .conftest import post

pytestmark = pytest.mark.e2e

NOTIFY = notify_body(("tns:t", "<m/>"))


def metric(server: RunningServer, name: str, **labels: str) -> float:
    text = requests.get(f"{server.base_url}/metrics", timeout=5).text
    want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "")
    for line in text.splitlines():
        if line.startswith(want + " "):
            return float(line.split()[-1])
    return 0.0


def test_slow_header_clients_do_not_starve_normal_requests(
    gateway_factory: Callable[..., RunningServer],
) -> None:
    gateway = gateway_factory({"WSNMOM_CONNECTIONS__HEADER_TIMEOUT": str(STARVED_HEADER_TIMEOUT)})
    sources = [f"127.0.3.{i}" for i in range(1, 21)]
    with SlowClients("127.0.0.1", gateway.port, 200, sources, interval=0.5) as slow:
        wait_until(lambda: slow.connects >= 200, timeout=10, what="200 slow connections")
        time.sleep(1)  # they hold their connections now
        with (
            NormalTraffic(lambda s: s.get(f"{gateway.base_url}/healthz", timeout=5)) as health,
            NormalTraffic(lambda s: post(gateway.broker_url, NOTIFY, timeout=5)) as notify,
        ):
            time.sleep(6)
        # every slow client is cut off at the header deadline (and comes back)
        wait_until(
            lambda: slow.closed_by_server >= 200,
            timeout=STARVED_HEADER_TIMEOUT + 10,
            what="200 slow clients cut at the header deadline",
        )
    assert health.failures == [] and notify.failures == []
    assert health.answered >= 10 and notify.answered >= 10
    assert health.worst < PROMPT and notify.worst < PROMPT, (health.latencies, notify.latencies)
    assert metric(gateway, "wsnmom_connections_closed_total", reason="header_timeout") >= 200


@pytest.fixture(scope="module")
def limited() -> Iterator[RunningServer]:
    from .conftest import start_server, stop_server

    server = start_server(
        {
            "WSNMOM_CONNECTIONS__LIMIT": "12",
            "WSNMOM_CONNECTIONS__PER_CLIENT": "4",
            "WSNMOM_CONNECTIONS__RESERVE": "0",
            "WSNMOM_CONNECTIONS__IDLE_TIMEOUT": "1",
            "WSNMOM_CONNECTIONS__BODY_TIMEOUT": "1",
            "WSNMOM_CONNECTIONS__HEADER_TIMEOUT": "30",
        }
    )
    try:
        yield server
    finally:
        stop_server(server)


def connect(server: RunningServer, source: str) -> socket.socket:
    address = ("127.0.0.1", server.port)
    return socket.create_connection(address, timeout=5, source_address=(source, 0))


def answer_of(sock: socket.socket) -> bytes:
    """What the server sends before closing (b"" for a plain close)."""
    data = b""
    try:
        while chunk := sock.recv(4096):
            data += chunk
    except OSError:
        pass
    return data


def test_per_client_limit_answers_503_and_spares_other_clients(limited: RunningServer) -> None:
    held = [connect(limited, "127.0.4.1") for _ in range(4)]
    try:
        wait_until(lambda: metric(limited, "wsnmom_connections_open") >= 4, what="4 open")
        extra = connect(limited, "127.0.4.1")
        reply = answer_of(extra)
        assert reply.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), reply
        assert b"Retry-After: 1\r\n" in reply and b"connections.per_client" in reply
        # another client is served
        assert requests.get(f"{limited.base_url}/healthz", timeout=5).status_code == 200
        assert metric(limited, "wsnmom_connections_refused_total", reason="per_client") >= 1
    finally:
        for sock in held:
            sock.close()
    # closed connections free their places
    wait_until(
        lambda: answer_of_request(limited, "127.0.4.1").startswith(b"HTTP/1.1 200"),
        what="the client is admitted again",
    )


def answer_of_request(server: RunningServer, source: str) -> bytes:
    with connect(server, source) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return answer_of(sock)


def test_connection_limit_answers_503(limited: RunningServer) -> None:
    # 13 connections from 4 addresses (within the per-client limit): one is one too many
    socks = [connect(limited, f"127.0.5.{i // 4 + 1}") for i in range(13)]
    try:
        replies: dict[int, bytes] = {}
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            waiting = [s for s in socks if s.fileno() not in replies]
            ready, _, _ = select.select(waiting, [], [], max(0.0, deadline - time.monotonic()))
            for sock in ready:
                replies[sock.fileno()] = answer_of(sock)
        refused = [r for r in replies.values() if r]
        assert len(refused) == 1, replies
        assert refused[0].startswith(b"HTTP/1.1 503") and b"connections.limit" in refused[0]
    finally:
        for sock in socks:
            sock.close()
    wait_until(
        lambda: answer_of_request(limited, "127.0.6.1").startswith(b"HTTP/1.1 200"),
        what="admitted again",
    )


def test_idle_keep_alive_connection_is_closed(limited: RunningServer) -> None:
    with connect(limited, "127.0.7.1") as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        first = b""
        while not first.endswith(b"ok\n"):
            first += sock.recv(4096)
        assert first.startswith(b"HTTP/1.1 200")
        started = time.monotonic()
        rest = answer_of(sock)  # waits until the server closes
        waited = time.monotonic() - started
    assert rest == b""
    assert 0.8 <= waited < 4, waited


def test_slow_body_is_cut_off(limited: RunningServer) -> None:
    with connect(limited, "127.0.8.1") as sock:
        sock.sendall(
            b"POST /wsn/broker HTTP/1.1\r\nHost: x\r\nContent-Type: text/xml\r\n"
            b"Content-Length: 1000\r\n\r\n<s:Envelope"
        )
        started = time.monotonic()
        closed = False
        while time.monotonic() - started < 6:
            try:
                sock.sendall(b" ")
                time.sleep(0.1)
            except OSError:
                closed = True
                break
            if sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                closed = True
                break
    assert closed
    assert time.monotonic() - started < 4
    assert metric(limited, "wsnmom_connections_closed_total", reason="body_timeout") >= 1
