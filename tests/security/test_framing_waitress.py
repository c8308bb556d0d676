"""What h11 accepts and waitress (3.0) reads otherwise; the guard's framing refuses it
(400) before waitress sees it, so that both agree on every request.

* ``Expect: 100-continue`` on a request without a body: waitress answers it
  ``100 Continue``, marks the request incomplete again and reads the next request's head
  as more of its head, so the request is never served and its headers join the next
  request's.
* A control character (DEL, or one below SP other than HT) in a header value: h11 takes
  it, waitress answers 400."""

from __future__ import annotations

import pytest

from tests.security.test_framing_differential import (
    SENTINEL,
    Server,
    _sent,
    bare_waitress,
    front_view,
    http_server,
    https_server,
    read_responses,
    served,
)
from wsnmom.http_framing import Framing

__all__ = ["bare_waitress", "http_server", "https_server"]  # the fixtures, for the tests

EXPECTING = b"POST /r/0 HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\n"


@pytest.mark.parametrize("length", [b"", b"Content-Length: 0\r\n", b"Content-Length: 000\r\n"])
def test_the_framing_refuses_expect_100_continue_without_a_body(length: bytes) -> None:
    f = Framing(0.0)
    f.received(EXPECTING + length + b"\r\n", 1.0)
    assert f.error == "Expect: 100-continue on a request without a body" and f.status == 400


def test_expect_100_continue_with_a_body_is_read() -> None:
    view = front_view(EXPECTING + b"Content-Length: 2\r\n\r\nab" + SENTINEL, [])
    assert not view.error and [r[1:] for r in view.requests] == [
        ("/r/0", b"ab"),
        ("/sentinel", b""),
    ]


@pytest.mark.e2e
def test_waitress_loses_the_request_and_the_guard_refuses_it(
    bare_waitress: Server, http_server: Server, https_server: Server
) -> None:
    stream = EXPECTING + b"Content-Length: 0\r\n\r\n" + SENTINEL
    with _sent(bare_waitress, stream) as sock:
        alone, _ = read_responses(sock, 1)
    assert [path for _, path, _ in served(alone)[0]] == ["/sentinel"]  # /r/0 is lost

    for server in (http_server, https_server):
        with _sent(server, stream) as sock:
            responses, closed = read_responses(sock, 2)
        assert closed and served(responses) == ([], 400), responses


@pytest.mark.parametrize("char", [b"\x7f", b"\x01", b"\x1f", b"\x0b"])
def test_the_framing_refuses_a_control_character_in_a_header_value(char: bytes) -> None:
    f = Framing(0.0)
    f.received(b"GET / HTTP/1.1\r\nHost: h\r\nX: a" + char + b"b\r\n\r\n", 1.0)
    assert f.error == "a control character in the request head" and f.status == 400


def test_a_tab_in_a_header_value_is_read() -> None:
    view = front_view(b"GET /r/0 HTTP/1.1\r\nHost: h\r\nX: a\tb\r\n\r\n", [])
    assert not view.error and view.requests == [("GET", "/r/0", b"")]


@pytest.mark.e2e
def test_waitress_refuses_a_del_in_a_header_value_and_so_does_the_guard(
    bare_waitress: Server, http_server: Server, https_server: Server
) -> None:
    stream = b"GET /r/0 HTTP/1.1\r\nHost: h\r\nX: \x7f\r\n\r\n" + SENTINEL
    with _sent(bare_waitress, stream) as sock:
        alone, _ = read_responses(sock, 1)
    assert served(alone) == ([], 400)

    for server in (http_server, https_server):
        with _sent(server, stream) as sock:
            responses, closed = read_responses(sock, 2)
        assert closed and served(responses) == ([], 400), responses
