"""``wsnmom.sent_answers.sent_state`` on real loopback TCP connections: what the kernel
says of an answer written to a client that reads it, one whose window is full, one that
closed after reading everything and one that closed without reading (reset)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from tests.support.waiting import wait_until
from wsnmom.sent_answers import PENDING, SENT, UNSENT, sent_state

#: more than a 4 KB receive buffer and the send queue take before the client reads
LARGE = 4 * 1024 * 1024


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """(server side, client side) of a loopback TCP connection; the client's receive
    buffer is small, so that a large answer waits for its reads."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.connect(listener.getsockname())
    server, _ = listener.accept()
    listener.close()
    server.setblocking(False)
    try:
        yield server, client
    finally:
        server.close()
        client.close()


def _write(server: socket.socket, data: bytes) -> int:
    """What the kernel takes of ``data`` now (a non-blocking write, as waitress's)."""
    try:
        return server.send(data)
    except BlockingIOError:
        return 0


def test_a_small_answer_is_sent_once_written(pair: tuple[socket.socket, socket.socket]) -> None:
    server, client = pair
    assert _write(server, b"x" * 1000) == 1000
    assert wait_until(lambda: sent_state(server) == SENT, 5, what="sent")
    assert client.recv(1000)


def test_an_answer_the_client_does_not_read_is_pending_then_unsent_at_its_reset(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    server, client = pair
    sent = _write(server, b"x" * LARGE)
    assert 0 < sent < LARGE  # the kernel took part of it: the window holds the rest
    assert sent_state(server) == PENDING
    assert client.recv(100)
    client.close()  # unread bytes: a reset
    assert wait_until(lambda: sent_state(server) == UNSENT, 5, what="unsent")


def test_a_client_that_read_all_and_closed_got_the_answer(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    server, client = pair
    data = b"x" * 200_000
    sent = 0
    read = 0
    while read < len(data):
        sent += _write(server, data[sent:])
        read += len(client.recv(65536))
    client.shutdown(socket.SHUT_WR)
    assert wait_until(lambda: sent_state(server) == SENT, 5, what="sent after the close")


def test_not_tcp_is_sent_when_written() -> None:
    a, b = socket.socketpair()
    try:
        assert sent_state(a) == SENT
    finally:
        a.close()
        b.close()


def test_a_closed_socket_is_unsent(pair: tuple[socket.socket, socket.socket]) -> None:
    server, _ = pair
    server.close()
    assert sent_state(server) == UNSENT
