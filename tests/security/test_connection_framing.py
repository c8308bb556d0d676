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
    feed(f, b"0\r\n\r\n", split=split)  # trailer fields are refused (below)
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
    f.received(
        b"POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n", 1.0
    )
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
        b.sendall(
            b"POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc"
        )
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


# ------------------------------------------------------------------ refused framings (h11)
_HEAD = b"POST /wsn/broker HTTP/1.1\r\nHost: x\r\n"


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (_HEAD + b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", "both"),
        (_HEAD + b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", "both"),
        (_HEAD + b"Content-Length: 3\r\nContent-Length: 3\r\n\r\nabc", "more than one"),
        (_HEAD + b"Content-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", "more than one"),
        (_HEAD + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", "more"),
        (_HEAD + b"Content-Length: +3\r\n\r\nabc", "Content-Length"),
        (_HEAD + b"Content-Length: 3, 3\r\n\r\nabc", "Content-Length"),
        (_HEAD + b"Content-Length: 0x3\r\n\r\nabc", "Content-Length"),
        (_HEAD + b"Transfer-Encoding: gzip, chunked\r\n\r\n", "Transfer-Encoding"),
        (b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", "HTTP/1.0"),
        (_HEAD + b"X-A: 1\n\r\n\r\n", "bare CR or LF"),
        (_HEAD + b"X-A: 1\r\r\n\r\n", "bare CR or LF"),
        (_HEAD + b"X-A: 1\r\n b\r\n\r\n", "obs-fold"),
        (_HEAD + b"Bad Name: 1\r\n\r\n", "header"),
        (b"G@T / HTTP/1.1\r\nHost: x\r\n\r\n", "request line"),
        (b"get / HTTP/1.1\r\nHost: x\r\n\r\n", "lower case"),
        (b"GET / HTTP/1.1\r\n\r\n", "Host"),
        (_HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n", "chunk"),
        (_HEAD + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n", "chunk"),
        (_HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + b"f" * 21 + b"\r\n", "chunk"),
        (_HEAD + b"Transfer-Encoding: chunked\r\n\r\n0\r\nT: v\r\n\r\n", "trailer"),
    ],
)
@pytest.mark.parametrize("split", [None, 1])
def test_ambiguous_or_malformed_framing_is_refused(
    data: bytes, why: str, split: int | None
) -> None:
    f = Framing(0.0)
    feed(f, data, split=split)
    assert why.lower() in f.error.lower(), f.error
    assert f.status == (501 if b"gzip" in data else 400)  # 501: a coding no one here reads


def test_a_head_beyond_the_limit_is_refused_431() -> None:
    from wsnmom.http_framing import MAX_HEAD

    f = Framing(0.0)
    f.received(_HEAD + b"X-Big: " + b"a" * MAX_HEAD, 1.0)
    assert f.error and f.status == 431


def test_a_pipelined_request_is_checked_as_it_arrives() -> None:
    """The second request's framing is refused while the first is still with the
    application: the server behind never reads bytes the guard has not agreed on."""
    f = Framing(0.0)
    f.received(_HEAD + b"Content-Length: 1\r\n\r\nx", 1.0)
    assert f.phase == APP and not f.error
    f.received(_HEAD + b"Content-Length: 1\r\nContent-Length: 2\r\n\r\nxy", 2.0)
    assert f.phase == APP and "more than one Content-Length" in f.error


def test_chunk_extensions_and_a_stray_empty_line_are_read() -> None:
    f = Framing(0.0)  # one empty line: cheroot reads a second as a request line
    f.received(b"\r\n" + _HEAD + b"Transfer-Encoding: chunked\r\n\r\n", 1.0)
    f.received(b'3;name=value;q="x y"\r\nabc\r\n0\r\n\r\n', 2.0)
    assert f.phase == APP and not f.error and f.body_bytes == 3


def test_a_refused_request_gets_400_and_the_server_reads_nothing() -> None:
    import socket

    from wsnmom.connections import ConnectionGuard, ConnectionPolicy, GuardedConnection

    guard = ConnectionGuard(ConnectionPolicy())
    a, b = socket.socketpair()
    conn = GuardedConnection(a.family, a.type, a.proto, fileno=a.detach())
    guard._register(conn, "127.0.0.1")
    try:
        b.sendall(_HEAD + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
        assert conn.recv(4096) == b""  # the server sees the client go
        answer = b.recv(4096)
        assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n"), answer
        assert b"both Content-Length and Transfer-Encoding" in answer
        assert b.recv(4096) == b""  # and the connection is closed
    finally:
        conn.close()
        b.close()
    assert guard.open_connections == 0


def test_after_an_answer_a_refused_request_only_closes() -> None:
    """Once the server answered on the connection, more of its bytes may be on their way:
    a 400 from the guard could land inside them, so the connection is only closed."""
    import socket

    from wsnmom.connections import ConnectionGuard, ConnectionPolicy, GuardedConnection

    guard = ConnectionGuard(ConnectionPolicy())
    a, b = socket.socketpair()
    conn = GuardedConnection(a.family, a.type, a.proto, fileno=a.detach())
    guard._register(conn, "127.0.0.1")
    try:
        b.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert conn.recv(4096).startswith(b"GET /")
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        b.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n")
        assert conn.recv(4096) == b""
        assert b.recv(4096) == b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
        assert b.recv(4096) == b""
    finally:
        conn.close()
        b.close()
