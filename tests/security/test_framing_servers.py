"""What h11 accepts and a server behind the guard (waitress 3.0, cheroot 11) reads
otherwise; the guard's framing refuses it (400) before the server sees it, so that both
agree on every request.

* ``Expect: 100-continue`` on a request without a body: waitress answers it
  ``100 Continue``, marks the request incomplete again and reads the next request's head
  as more of its head, so the request is never served and its headers join the next
  request's.
* A control character (DEL, or one below SP other than HT) in a header value: h11 takes
  it, waitress answers 400.
* An empty line between a chunked body and the next request: cheroot reads no trailer
  section, so the CRLF that ends it is the one empty line it skips before a request, and
  it answers one more 400.
* A chunk size line with white space in it or an extension that is not
  ``;token[=token|quoted-string]``: h11 reads anything after the size's digits and a
  ``;``, waitress answers 400."""

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


CHUNKED = b"POST /r/0 HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n"


@pytest.mark.parametrize("split", [False, True])
def test_the_framing_refuses_an_empty_line_after_a_chunked_body(split: bool) -> None:
    f = Framing(0.0)
    f.received(CHUNKED, 1.0)
    f.sent(2.0)
    if split:
        f.received(b"\r", 3.0)
        assert not f.error
    f.received((b"\n" if split else b"\r\n") + SENTINEL, 3.0)
    assert f.error == "an empty line after a chunked body"


def test_a_request_right_after_a_chunked_body_and_empty_lines_before_another_are_read() -> None:
    head = b"POST /r/1 HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n"
    view = front_view(CHUNKED + head + b"\r\n" + SENTINEL, [])
    assert not view.error and [r[1] for r in view.requests] == ["/r/0", "/r/1", "/sentinel"]


@pytest.mark.e2e
def test_cheroot_refuses_an_empty_line_after_a_chunked_body_and_so_does_the_guard(
    http_server: Server, https_server: Server
) -> None:
    with _sent(https_server, CHUNKED + SENTINEL) as sock:  # behind the guard, no empty line
        responses, _ = read_responses(sock, 2)
    assert [path for _, path, _ in served(responses)[0]] == ["/r/0", "/sentinel"]

    stream = CHUNKED + b"\r\n" + SENTINEL
    for server in (http_server, https_server):
        with _sent(server, stream) as sock:
            responses, closed = read_responses(sock, 2)
        assert closed and served(responses)[0] in ([], [("POST", "/r/0", b"ab")]), responses


@pytest.mark.parametrize(
    ("line", "ok"),
    [
        (b"2", True),
        (b"2;a=b", True),
        (b'2;a="q r";c', True),
        (b"02;A-b=c", True),
        (b"2; a=b", False),
        (b"2 ;a=b", False),
        (b"2;a=b c", False),
        (b"2;=b", False),
        (b"2 ", False),
        (b'2;a="', False),
    ],
)
def test_chunk_size_lines_are_read_as_waitress_reads_them(line: bytes, ok: bool) -> None:
    head = b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
    for last in (False, True):
        f = Framing(0.0)
        # the line as a chunk's size line, or as the last chunk's (its size read as 0)
        body = b"0" + line[1:] + b"\r\n\r\n" if last else line + b"\r\nab\r\n0\r\n\r\n"
        f.received(head + body, 1.0)
        assert (f.error == "") == ok, (line, last, f.error)


@pytest.mark.e2e
def test_waitress_refuses_a_space_in_a_chunk_extension_and_so_does_the_guard(
    bare_waitress: Server, http_server: Server, https_server: Server
) -> None:
    stream = b"POST /r/0 HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
    stream += b"1; a=b\r\nx\r\n0\r\n\r\n" + SENTINEL
    with _sent(bare_waitress, stream) as sock:
        alone, _ = read_responses(sock, 1)
    assert served(alone) == ([], 400)

    for server in (http_server, https_server):
        with _sent(server, stream) as sock:
            responses, closed = read_responses(sock, 2)
        assert closed and served(responses) == ([], 400), responses
