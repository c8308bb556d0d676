"""The ``[connections]`` limits and deadlines on the HTTPS listener (``tls.certfile``,
served by cheroot): slow TLS clients cannot starve normal requests, the per-client and
total limits refuse (closing: a plain-text 503 is no TLS record), and the header, body and
idle deadlines cut connections, as on plain HTTP (``test_connections.py``).

Before ``wsnmom.tls_ingress``, cheroot served each connection on one of its ``threads``
workers from the accept on: a handful of clients trickling their headers held every
worker and normal requests waited for them.

Cost: two HTTPS gateways, about 15 s (6 s of slow-client attack).
"""

from __future__ import annotations

import shutil
import socket
import ssl
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.fixtures.server import free_port, serving
from tests.support.abuse import PROMPT, STARVED_HEADER_TIMEOUT, NormalTraffic, SlowClients
from tests.support.soap import content_type, envelope, notify_body
from tests.support.tls import Certificates, TlsGateway
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

NOTIFY = notify_body(("tns:t", "<m/>"))


@pytest.fixture(scope="module")
def certs() -> Iterator[Certificates]:
    folder = Path(tempfile.mkdtemp(prefix="wsnmom-https-certs-"))
    try:
        yield Certificates(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _gateway(certs: Certificates, env: dict[str, str]) -> Iterator[TlsGateway]:
    data_dir = Path(tempfile.mkdtemp(prefix="wsnmom-https-"))
    server = TlsGateway(
        "embedded",
        f"embedded://{data_dir / 'mw'}",
        data_dir,
        free_port(),
        extra_env=env,
        certs=certs,
        mutual=False,
    )
    with serving(server):
        yield server


@pytest.fixture(scope="module")
def slow_target(certs: Certificates) -> Iterator[TlsGateway]:
    # few workers, so that holding them would show at once
    yield from _gateway(
        certs,
        {"WSNMOM_CONNECTIONS__HEADER_TIMEOUT": str(STARVED_HEADER_TIMEOUT), "WSNMOM_THREADS": "4"},
    )


@pytest.fixture(scope="module")
def limited(certs: Certificates) -> Iterator[TlsGateway]:
    yield from _gateway(
        certs,
        {
            "WSNMOM_CONNECTIONS__LIMIT": "12",
            "WSNMOM_CONNECTIONS__PER_CLIENT": "4",
            "WSNMOM_CONNECTIONS__RESERVE": "0",
            "WSNMOM_CONNECTIONS__IDLE_TIMEOUT": "1",
            "WSNMOM_CONNECTIONS__BODY_TIMEOUT": "1",
            "WSNMOM_CONNECTIONS__HEADER_TIMEOUT": "30",
        },
    )


def client_context(gateway: TlsGateway) -> ssl.SSLContext:
    assert gateway.certs is not None
    return ssl.create_default_context(cafile=gateway.certs.path("ca"))


def metric(gateway: TlsGateway, name: str, **labels: str) -> float:
    assert gateway.certs is not None
    text = requests.get(
        f"{gateway.base_url}/metrics", verify=gateway.certs.path("ca"), timeout=5
    ).text
    want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "")
    for line in text.splitlines():
        if line.startswith(want + " "):
            return float(line.split()[-1])
    return 0.0


def connect(gateway: TlsGateway, source: str = "127.0.0.1") -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", gateway.port), 5, source_address=(source, 0))
    return client_context(gateway).wrap_socket(raw, server_hostname="127.0.0.1")


def read_all(sock: socket.socket, timeout: float = 5.0) -> bytes:
    """What the server sends until it closes (or ``timeout``)."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except OSError:
        pass
    return data


def soap_request(body: bytes, *, extra: str = "", close: bool = False) -> bytes:
    head = (
        "POST /wsn/broker HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: {content_type()}\r\nContent-Length: {len(body)}\r\n{extra}"
        + ("Connection: close\r\n" if close else "")
        + "\r\n"
    )
    return head.encode() + body


def test_slow_tls_clients_do_not_starve_normal_requests(slow_target: TlsGateway) -> None:
    """200 clients that complete the handshake and then trickle their headers, and 50 that
    connect and never start the handshake, against 4 worker threads."""
    gateway = slow_target
    assert gateway.certs is not None
    ca = gateway.certs.path("ca")
    sources = [f"127.0.7.{i}" for i in range(1, 21)]
    silent = [
        socket.create_connection(("127.0.0.1", gateway.port), 5, source_address=("127.0.8.1", 0))
        for _ in range(50)
    ]
    try:
        with SlowClients(
            "127.0.0.1", gateway.port, 200, sources, interval=0.5, tls=client_context(gateway)
        ) as slow:
            wait_until(lambda: slow.connects >= 200, timeout=20, what="200 slow TLS connections")
            time.sleep(1)
            with (
                NormalTraffic(
                    lambda s: s.get(f"{gateway.base_url}/healthz", verify=ca, timeout=5)
                ) as health,
                NormalTraffic(
                    lambda s: s.post(
                        gateway.broker_url,
                        data=envelope(NOTIFY),
                        headers={"Content-Type": content_type()},
                        verify=ca,
                        timeout=5,
                    )
                ) as notify,
            ):
                time.sleep(5)
            # every slow client is cut off at the header deadline (and comes back); so
            # are the silent ones (the handshake is part of the first request's head)
            wait_until(
                lambda: slow.closed_by_server >= 200,
                timeout=STARVED_HEADER_TIMEOUT + 10,
                what="200 slow TLS clients cut at the header deadline",
            )
        assert health.failures == [] and notify.failures == []
        assert health.answered >= 8 and notify.answered >= 8
        assert health.worst < PROMPT and notify.worst < PROMPT, (
            health.latencies,
            notify.latencies,
        )
        for sock in silent:
            assert read_all(sock, timeout=1) == b""
        assert metric(gateway, "wsnmom_connections_closed_total", reason="header_timeout") >= 250
    finally:
        for sock in silent:
            sock.close()


def test_per_client_limit_closes_and_spares_other_clients(limited: TlsGateway) -> None:
    held = [connect(limited, "127.0.9.1") for _ in range(4)]
    try:
        wait_until(lambda: metric(limited, "wsnmom_connections_open") >= 4, what="4 open")
        raw = socket.create_connection(
            ("127.0.0.1", limited.port), 5, source_address=("127.0.9.1", 0)
        )
        assert read_all(raw) == b""  # closed without a word: no plain text on a TLS port
        raw.close()
        with pytest.raises(OSError):  # the handshake finds the connection closed
            connect(limited, "127.0.9.1").close()
        assert metric(limited, "wsnmom_connections_refused_total", reason="per_client") >= 2
        with connect(limited, "127.0.9.2") as other:
            other.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert read_all(other).startswith(b"HTTP/1.1 200")
    finally:
        for sock in held:
            sock.close()


def test_connection_limit(limited: TlsGateway) -> None:
    # 12 connections from 3 addresses (within the per-client limit), handshakes done
    wait_until(lambda: metric(limited, "wsnmom_connections_open") <= 1, what="earlier tests' gone")
    socks: list[socket.socket] = [connect(limited, f"127.0.10.{i // 4 + 1}") for i in range(12)]
    try:
        extra = socket.create_connection(
            ("127.0.0.1", limited.port), 5, source_address=("127.0.10.9", 0)
        )
        assert read_all(extra) == b""  # one too many: closed
        extra.close()
        for sock in socks:  # the others stay open
            sock.settimeout(0.01)
            with pytest.raises(TimeoutError):
                sock.recv(1)
    finally:
        for sock in socks:
            sock.close()
    refused = 0.0

    def read() -> bool:  # once there is room again for the metrics request
        nonlocal refused
        try:
            refused = metric(limited, "wsnmom_connections_refused_total", reason="limit")
        except requests.RequestException:
            return False
        return True

    wait_until(read, what="the metrics")
    assert refused >= 1


def test_idle_keep_alive_connection_is_closed(limited: TlsGateway) -> None:
    with connect(limited) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(5)
        first = b""
        while not first.endswith(b"\r\n\r\nok\n"):  # the answer, maybe in two records
            first += sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200"), first
        started = time.monotonic()
        assert read_all(sock, timeout=10) == b""  # the server closes it
        assert time.monotonic() - started < 5


def test_slow_body_is_cut_off(limited: TlsGateway) -> None:
    body = envelope(NOTIFY)
    request = soap_request(body)
    with connect(limited) as sock:
        sock.sendall(request[: len(request) - 10])  # the head and most of the body
        started = time.monotonic()
        assert read_all(sock, timeout=10) == b""
        assert time.monotonic() - started < 5
    assert metric(limited, "wsnmom_connections_closed_total", reason="body_timeout") >= 1


def test_expect_continue_pipelining_and_a_large_body(limited: TlsGateway) -> None:
    """The ingress answers ``100 Continue`` itself (the body comes before a worker is
    involved), keeps pipelined requests apart, and spills a large request to disk."""
    body = envelope(NOTIFY)
    with connect(limited) as sock:
        sock.sendall(soap_request(body, extra="Expect: 100-continue\r\n")[: -len(body)])
        sock.settimeout(5)
        assert sock.recv(65536).startswith(b"HTTP/1.1 100 Continue")
        sock.sendall(body + soap_request(body) + soap_request(body, close=True))
        answers = read_all(sock)
    statuses = [line[9:12] for line in answers.split(b"\r\n") if line.startswith(b"HTTP/1.1 ")]
    # (cheroot says 100 Continue again when it reads the head: clients take several 1xx)
    assert [s for s in statuses if s != b"100"] == [b"202"] * 3, answers[:2000]
    big = envelope(notify_body(("tns:t", "<m>" + "x" * 1_500_000 + "</m>")))
    with connect(limited) as sock:
        sock.sendall(soap_request(big, close=True))
        assert read_all(sock).startswith(b"HTTP/1.1 202")


def test_reserved_places_serve_probes_and_refuse_others_over_https(certs: Certificates) -> None:
    """Issue 22, item 3 over HTTPS: with the ordinary places held and the reserved ones
    taken by connections that never send a head, a probe still gets a place (the oldest
    of those is evicted) and an anonymous request on a reserved place is answered 503
    inside TLS and closed."""
    env = {
        "WSNMOM_CONNECTIONS__LIMIT": "8",
        "WSNMOM_CONNECTIONS__RESERVE": "4",
        "WSNMOM_CONNECTIONS__PER_CLIENT": "4",
        "WSNMOM_CONNECTIONS__HEADER_TIMEOUT": "30",
    }
    for gateway in _gateway(certs, env):
        held = [connect(gateway, f"127.0.11.{i // 4 + 1}") for i in range(8)]
        try:
            with connect(gateway) as probe:
                probe.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                assert read_all(probe).startswith(b"HTTP/1.1 200")
            with connect(gateway, "127.0.11.9") as stranger:
                stranger.sendall(soap_request(b"<x/>", close=True))
                answer = read_all(stranger)
            assert answer.startswith(b"HTTP/1.1 503") and b"connections.reserve" in answer
        finally:
            for sock in held:
                sock.close()
