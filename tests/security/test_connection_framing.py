"""The HTTP/1.1 framing the connection guard follows to know which deadline applies
(``wsnmom.connections.Framing``): headers, then a Content-Length or chunked body, then the
application (no deadline) until the response, then waiting for the next request."""

from __future__ import annotations

import pytest

from wsnmom.http_framing import APP, BODY, HEADERS, WAITING, Framing


def feed(framing: Framing, data: bytes, *, split: int | None = None, now: float = 1.0) -> None:
    if split is None:
        framing.received(data, now)
        return
    for i in range(0, len(data), split):
        framing.received(data[i : i + split], now)


@pytest.mark.parametrize("split", [None, 1, 3, 7])
def test_content_length_request(split: int | None) -> None:
    f = Framing(0.0)
    assert f.phase == HEADERS and f.since == 0.0
    feed(f, b"POST /wsn/broker HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nab", split=split)
    assert f.phase == BODY
    feed(f, b"cde", split=split, now=2.0)
    assert f.phase == APP
    f.sent(3.0)
    assert f.phase == WAITING and f.since == 3.0


@pytest.mark.parametrize("split", [None, 1, 2, 5])
def test_chunked_request(split: int | None) -> None:
    f = Framing(0.0)
    head = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    feed(f, head, split=split)
    assert f.phase == BODY
    feed(f, b"5;ext=1\r\nhello\r\n10\r\n" + b"x" * 16 + b"\r\n", split=split)
    assert f.phase == BODY
    feed(f, b"0\r\nTrailer: v\r\n\r\n", split=split)
    assert f.phase == APP


def test_get_without_body_goes_to_the_application() -> None:
    f = Framing(0.0)
    f.received(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 1.0)
    assert f.phase == APP


def test_slow_headers_stay_in_the_header_phase_from_the_first_byte() -> None:
    f = Framing(0.0)
    f.sent(0.5)  # nothing to answer yet: no change
    for i, byte in enumerate(b"POST / HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaa"):
        f.received(bytes([byte]), 1.0 + i)
    assert f.phase == HEADERS and f.since == 0.0  # a new connection: since accept


def test_keep_alive_next_request_starts_its_own_header_clock() -> None:
    f = Framing(0.0)
    f.received(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 1.0)
    f.sent(2.0)
    assert f.phase == WAITING
    f.received(b"GET", 9.0)
    assert f.phase == HEADERS and f.since == 9.0


def test_pipelined_request_waits_for_the_response() -> None:
    f = Framing(0.0)
    f.received(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n", 1.0)
    assert f.phase == APP  # no deadline while the first is being answered
    f.sent(5.0)
    assert f.phase == HEADERS and f.since == 5.0
    f.received(b"\r\n", 6.0)
    assert f.phase == APP


def test_100_continue_does_not_end_the_body() -> None:
    f = Framing(0.0)
    f.received(b"POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n", 1.0)
    f.sent(1.1)  # the interim response
    assert f.phase == BODY
    f.received(b"abc", 2.0)
    assert f.phase == APP
    assert f.expect_continue


def test_a_late_100_continue_does_not_end_the_request() -> None:
    """Over HTTPS the body is in before the server's worker reads the head and says
    ``100 Continue`` again: that interim answer is no response (``Tracked.send``)."""
    import socket

    from wsnmom.connections import ConnectionGuard, ConnectionPolicy, GuardedConnection

    guard = ConnectionGuard(ConnectionPolicy())
    a, b = socket.socketpair()
    conn = GuardedConnection(a.family, a.type, a.proto, fileno=a.detach())
    guard._register(conn, "127.0.0.1")
    try:
        b.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc")
        assert conn.recv(4096).endswith(b"abc") and conn.framing.phase == APP
        conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        assert conn.framing.phase == APP  # the application still works on it
        conn.sendall(b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n")
        assert conn.framing.phase == WAITING
        assert guard.open_connections == 1
    finally:
        conn.close()
        b.close()
    assert guard.open_connections == 0


def test_inbox_keeps_order_and_spills_to_a_file() -> None:
    from wsnmom.tls_ingress import SPOOL, Inbox

    inbox = Inbox()
    data = bytes(range(256)) * (SPOOL // 256 * 2 + 3)  # beyond the memory part
    for i in range(0, len(data), 70_000):
        inbox.write(data[i : i + 70_000])
    assert len(inbox) == len(data)
    out = bytearray()
    buffer = bytearray(8192)
    while n := inbox.readinto(buffer):
        out += buffer[:n]
    assert bytes(out) == data and len(inbox) == 0
    inbox.write(b"again")  # usable after being drained
    assert inbox.readinto(buffer) == 5 and buffer[:5] == b"again"
