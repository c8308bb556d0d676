"""Issue 22, item 3: 1,010 connections from 16 loopback addresses (63 each, under
``per_client`` 64), each announcing ``Content-Length: 10000000`` and sending one body byte
per second, took the gateway offline: 0 of 118 normal requests answered, ``/healthz``
included.  Now the last ``connections.reserve`` places serve only probes and
authenticated requests, and a body slower than ``connections.min_body_rate`` is cut once
``connections.body_grace`` has passed.

The e2e test repeats the attack at a small scale (48 connections from 127.0.0.2 to
127.0.0.17 against a limit of 48 with 16 reserved): the attack holds every ordinary place
while probes and an authenticated client are answered.  The unit tests check admission,
eviction and the body-rate deadline on synthetic clocks.

Cost: one gateway, about 6 s.
"""

from __future__ import annotations

import base64
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.fixtures.server import RunningServer
from tests.support.abuse import SlowBodies
from tests.support.soap import notify_body
from tests.support.waiting import wait_until
from wsnmom.connections import RESERVED, ConnectionGuard, ConnectionPolicy, probe_request
from wsnmom.http_framing import APP, BODY, Framing
from wsnmom.reserve import authorization_of

from .conftest import post

TOKEN = "reserve-test-admin-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NOTIFY = notify_body(("tns:t", "<m/>"))


# ------------------------------------------------------------------------------ units
class _Conn:
    """What the guard keeps of a connection (no socket needed to decide admissions)."""

    framing: Framing
    guard_client: str
    guard_reason: str


def _guard(**policy: Any) -> ConnectionGuard:
    return ConnectionGuard(ConnectionPolicy(**policy), vouch=lambda head: b"secret" in head)


def _admitted(guard: ConnectionGuard, client: str = "10.0.0.1") -> tuple[_Conn, object]:
    admission = guard._admit(client)
    assert not isinstance(admission, str), admission
    conn = _Conn()
    guard._register(conn, client, reserved=admission is not False)  # type: ignore[arg-type]
    return conn, admission


def test_reserved_places_admit_probes_and_vouched_heads_only() -> None:
    guard = _guard(limit=4, reserve=2, per_client=0)
    ordinary = [_admitted(guard)[0] for _ in range(2)]
    assert all(c.framing.screen is None for c in ordinary)
    probe, admission = _admitted(guard)
    assert admission is True
    probe.framing.received(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 1.0)
    assert probe.framing.phase == APP and not probe.framing.refused
    vouched, _ = _admitted(guard)
    vouched.framing.received(b"POST /wsn/broker HTTP/1.1\r\nHost: x\r\nX: secret\r\n", 1.0)
    vouched.framing.received(b"Content-Length: 3\r\n\r\n", 1.0)
    assert vouched.framing.phase == BODY and not vouched.framing.refused
    # both reserved places serve a request: nothing to evict, the next is refused
    assert "connections.limit" in str(guard._admit("10.0.0.2"))
    # a reserved connection whose request is neither is refused as its head completes
    stranger = Framing(0.0)
    stranger.screen = guard._screen
    stranger.received(b"POST /wsn/broker HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\n", 1.0)
    assert stranger.refused


def test_newcomer_evicts_slow_heads_then_idle_connections_from_the_reserve() -> None:
    guard = _guard(limit=4, reserve=2, per_client=0)
    for _ in range(2):
        _admitted(guard)
    idle, _ = _admitted(guard)
    idle.framing.received(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n", 1.0)
    idle.framing.sent(2.0)  # answered: idle between requests
    slow, _ = _admitted(guard)
    slow.framing.received(b"GET /heal", 5.0)  # a head that is still arriving
    first, victim = _admitted(guard)
    assert victim is slow and slow.guard_reason == "evicted"
    first.framing.received(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 6.0)
    _, victim = _admitted(guard)
    assert victim is idle
    # evicted connections are forgotten when they close; the places stay taken
    assert guard.open_connections == 6
    for gone in (slow, idle):
        guard._forget(gone)  # type: ignore[arg-type]
    assert guard.open_connections == 4 and len(guard._reserved) == 2 and not guard._leaving


def test_slow_body_is_cut_at_the_minimum_rate_not_only_the_body_timeout() -> None:
    guard = _guard(limit=0, body_timeout=60.0, min_body_rate=100.0, body_grace=2.0)
    slow, _ = _admitted(guard)
    fast, _ = _admitted(guard)
    for conn in (slow, fast):
        conn.framing.received(
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\n", 0.0
        )
    for second in range(1, 4):
        slow.framing.received(b"x", float(second))  # 1 byte/s
        fast.framing.received(b"x" * 200, float(second))  # 200 bytes/s
    expired = guard.expired(now=3.5)
    assert [(c, why) for c, why in expired] == [(slow, "min_body_rate")]
    # without a minimum rate the same body would hold its place for body_timeout
    lax = _guard(limit=0, body_timeout=60.0)
    conn, _ = _admitted(lax)
    conn.framing.received(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\nx", 0.0)
    assert lax.expired(now=59.0) == [] and lax.expired(now=60.0) == [(conn, "body_timeout")]


def test_probe_and_authorization_parsing() -> None:
    assert probe_request(b"GET /healthz HTTP/1.1") and probe_request(b"HEAD /readyz?x HTTP/1.1")
    assert not probe_request(b"GET /healthzz HTTP/1.1") and not probe_request(b"POST /healthz ")
    head = b"POST / HTTP/1.1\r\nHost: x\r\nAUTHORIZATION:  Bearer abc \r\nX: y"
    assert authorization_of(head) == "Bearer abc"
    assert authorization_of(b"GET / HTTP/1.1\r\nHost: x") is None


# --------------------------------------------------------------------------------- e2e
@pytest.fixture
def reserved_gateway() -> Iterator[RunningServer]:
    from .conftest import start_server, stop_server

    server = start_server(
        {
            "WSNMOM_AUTH__ADMIN_TOKEN": TOKEN,
            "WSNMOM_CONNECTIONS__LIMIT": "48",
            "WSNMOM_CONNECTIONS__RESERVE": "16",
            "WSNMOM_CONNECTIONS__PER_CLIENT": "8",
            "WSNMOM_CONNECTIONS__HEADER_TIMEOUT": "30",
            "WSNMOM_CONNECTIONS__BODY_TIMEOUT": "60",
            "WSNMOM_CONNECTIONS__MIN_BODY_RATE": "100",
            "WSNMOM_CONNECTIONS__BODY_GRACE": "2",
        }
    )
    try:
        yield server
    finally:
        stop_server(server)


def _anonymous_answer(server: RunningServer) -> bytes:
    """The raw answer to an unauthenticated request from a fresh client address."""
    with socket.create_connection(
        ("127.0.0.1", server.port), timeout=5, source_address=("127.0.0.30", 0)
    ) as sock:
        sock.sendall(b"GET /wsn/policy HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
        return data


def _closed(server: RunningServer, reason: str) -> float:
    text = requests.get(f"{server.base_url}/metrics", headers=AUTH, timeout=5).text
    for line in text.splitlines():
        if line.startswith(f'wsnmom_connections_closed_total{{reason="{reason}"}} '):
            return float(line.split()[-1])
    return 0.0


@pytest.mark.e2e
def test_slow_bodies_from_16_addresses_leave_probes_and_authenticated_clients_served(
    reserved_gateway: RunningServer,
) -> None:
    gateway = reserved_gateway
    sources = [f"127.0.0.{i}" for i in range(2, 18)]
    # 48 clients: without the reserve they would hold every place
    with SlowBodies("127.0.0.1", gateway.port, 48, sources, interval=0.5, backoff=0.5) as attack:
        # the attack holds every ordinary place: an anonymous request is refused
        wait_until(
            lambda: _anonymous_answer(gateway).startswith(b"HTTP/1.1 503"),
            timeout=15,
            what="the attack to hold every ordinary place",
        )
        for _ in range(5):
            health = requests.get(f"{gateway.base_url}/healthz", timeout=10)
            assert health.status_code == 200, health.text
            notify = post(gateway.broker_url, NOTIFY, headers=AUTH, timeout=10)
            assert notify.status_code in (200, 202), notify.text
            refused = _anonymous_answer(gateway)
            assert refused.startswith(b"HTTP/1.1 503"), refused
            assert RESERVED.encode() in refused or b"connections.limit" in refused
        # the trickling bodies are cut at the minimum rate, long before body_timeout
        wait_until(
            lambda: _closed(gateway, "min_body_rate") >= 32,
            timeout=20,
            what="slow bodies cut at connections.min_body_rate",
        )
        assert attack.connects > 48  # the attack came back after each cut
    assert _closed(gateway, "body_timeout") == 0


def test_credentials_vouch_for_a_reserved_place_only_when_checked_at_once(
    tmp_path: Path,
) -> None:
    from types import SimpleNamespace

    from wsnmom.core.config import load_settings
    from wsnmom.soap_frontend.auth import Authenticator

    from wsnmom.reserve import credential_vouch

    settings = load_settings(
        None, environ={}, overrides={"data_dir": str(tmp_path), "auth__admin_token": TOKEN}
    )
    auth = Authenticator(settings)
    vouch = credential_vouch(SimpleNamespace(extensions={"wsnmom.auth": auth}))
    assert vouch is not None
    head = b"POST /wsn/broker HTTP/1.1\r\nHost: x\r\nAuthorization: %s"
    basic = "Basic " + base64.b64encode(f"admin:{TOKEN}".encode()).decode()
    assert vouch(head % f"Bearer {TOKEN}".encode())
    assert not vouch(head % b"Bearer wrong") and not vouch(b"POST / HTTP/1.1\r\nHost: x")
    assert not vouch(head % basic.encode())  # never verified: no password hash on the way in
    auth.http_caller({"HTTP_AUTHORIZATION": basic})  # verified once, on an ordinary place
    assert vouch(head % basic.encode())
    # without identities only the probes use the reserve
    open_settings = load_settings(None, environ={}, overrides={"data_dir": str(tmp_path)})
    anonymous = SimpleNamespace(extensions={"wsnmom.auth": Authenticator(open_settings)})
    assert credential_vouch(anonymous) is None


def test_a_pipelined_head_is_screened_as_it_arrives() -> None:
    """A head pipelined behind an admitted request on a reserved place is checked when it
    arrives (not once the first is answered), and refused without a 503 that could land
    inside the first request's answer."""
    f = Framing(0.0)
    f.screen = lambda head: head.startswith(b"GET /healthz ")
    f.received(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 1.0)
    assert f.phase == APP and not f.refused
    f.received(b"POST /wsn/broker HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx", 2.0)
    assert f.refused and f.behind
