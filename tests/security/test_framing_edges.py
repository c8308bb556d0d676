"""Edges of the guard's framing (``wsnmom.http_framing``) where h11 accepts a stream that
waitress or cheroot read otherwise: the limit of a request head (waitress counts the
empty lines before it and the blank line that ends it), empty lines before a request
(cheroot skips one), HTTP versions other than 1.0 and 1.1 (h11 takes any digit.digit), and
a chunked body the application does not read (cheroot would read its chunk size line as
the next request).  Each is checked with the exchange of ``test_framing_differential``
against the servers behind the guard, then by a strategy that mixes them with the
framings around them (leading zeros, Expect, chunk sizes, last chunks, pipelining).

Cost: four in-process servers, about 15 s.
"""

from __future__ import annotations

import json
import os
import ssl
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.security.test_framing_differential import (
    FUZZ,
    SENTINEL,
    Server,
    _serving,
    exchange,
    front_view,
    http_server,
    https_server,
    read_responses,
    served,
)
from tests.support.tls import Certificates
from wsnmom.http_framing import MAX_HEAD, Framing

pytestmark = [pytest.mark.e2e, pytest.mark.fuzz]

__all__ = ["http_server", "https_server"]  # the fixtures, for the tests below

EXAMPLES = int(os.environ.get("WSNMOM_TEST_FUZZ_EXAMPLES", "0")) or 60
_SERVERS = ["http_server", "https_server"]


def _get(size: int) -> bytes:
    """A GET whose head (its blank line included) is ``size`` bytes long."""
    head = b"GET /big HTTP/1.1\r\nHost: h\r\nX-Pad: \r\n\r\n"
    return head.replace(b"X-Pad: ", b"X-Pad: " + b"a" * (size - len(head)))


def _post(path: bytes, body: bytes, version: bytes = b"HTTP/1.1") -> bytes:
    head = b"POST %s %s\r\nHost: h\r\nContent-Length: %d\r\n\r\n" % (path, version, len(body))
    return head + body


# ------------------------------------------------------------------------ the head limit
@pytest.mark.parametrize("lead", [b"", b"\r\n"])
@pytest.mark.parametrize("split", [False, True])
def test_a_head_at_waitress_limit_is_refused_431(
    http_server: Server, lead: bytes, split: bool
) -> None:
    """waitress refuses a head once it read ``MAX_HEAD`` bytes, the empty line before it
    and the blank line ending it included: so does the guard, one byte under is read."""
    for size, refused in ((MAX_HEAD - len(lead), True), (MAX_HEAD - len(lead) - 1, False)):
        stream = lead + _get(size)
        view = front_view(stream, [len(stream) - 1] if split else [])
        assert (view.error != "", len(view.requests)) == (refused, 0 if refused else 1), view
        exchange(http_server, stream, view)
    f = Framing(0.0)
    f.received(lead + _get(MAX_HEAD)[: MAX_HEAD - len(lead)], 1.0)  # no blank line yet
    assert f.status == 431 and f.error == "the request head is too large"


# ----------------------------------------------------------- empty lines before a request
@pytest.mark.parametrize("server_name", _SERVERS)
@pytest.mark.parametrize("blank", [1, 2, 3])
@pytest.mark.parametrize("first", [False, True])
def test_one_empty_line_before_a_request_is_read_more_are_refused(
    request: pytest.FixtureRequest, server_name: str, blank: int, first: bool
) -> None:
    """cheroot skips one empty line before a request and reads a second as its request
    line (400); waitress skips any number: the guard reads one."""
    server: Server = request.getfixturevalue(server_name)
    stream = b"\r\n" * blank + SENTINEL if first else _post(b"/r/0", b"ab") + b"\r\n" * blank
    view = front_view(stream, [])
    assert view.error == ("" if blank == 1 else "more than one empty line before a request")
    assert view == front_view(stream, list(range(len(stream)))), "one byte at a time"
    exchange(server, stream, view)


# --------------------------------------------------------------------------- versions
@pytest.mark.parametrize("server_name", _SERVERS)
@pytest.mark.parametrize("version", [b"HTTP/0.9", b"HTTP/1.2", b"HTTP/1.9", b"HTTP/2.0"])
def test_a_version_other_than_1_0_and_1_1_is_refused_505(
    request: pytest.FixtureRequest, server_name: str, version: bytes
) -> None:
    """h11 reads any ``HTTP/d.d``; cheroot answers 505 (0.9 too) and waitress serves it
    as HTTP/1.0: the guard answers 505."""
    server: Server = request.getfixturevalue(server_name)
    stream = _post(b"/r/0", b"ab", version) + SENTINEL
    view = front_view(stream, [])
    assert view.error == "HTTP version not supported" and view.requests == []
    f = Framing(0.0)
    f.received(stream, 1.0)
    assert f.status == 505
    exchange(server, stream, view)


@pytest.mark.parametrize("server_name", _SERVERS)
def test_http_1_0_and_1_1_are_read(request: pytest.FixtureRequest, server_name: str) -> None:
    server: Server = request.getfixturevalue(server_name)
    keep = b"POST /r/0 HTTP/1.0\r\nHost: h\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\nx"
    stream = keep + _post(b"/r/1", b"yz")
    view = front_view(stream, [])
    assert not view.error and [r[1] for r in view.requests] == ["/r/0", "/r/1"]
    exchange(server, stream, view)


# -------------------------------------------------- a chunked body the application ignores
def ignore_body(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    """Answer without reading the body (as a GET view or a 404 does)."""
    out = json.dumps({"m": environ["REQUEST_METHOD"], "t": environ["PATH_INFO"], "b": ""})
    start_response("200 OK", [("Content-Length", str(len(out)))])
    return [out.encode()]


@pytest.fixture(scope="module")
def ignoring_servers() -> Iterator[list[Server]]:
    folder = Path(tempfile.mkdtemp(prefix="wsnmom-framing-edges-"))
    certs = Certificates(folder)
    client = ssl.create_default_context(cafile=certs.path("ca"))
    tls = {"WSNMOM_TLS__CERTFILE": certs.path("server")}
    with _serving({}, app=ignore_body) as plain, _serving(tls, client, app=ignore_body) as https:
        yield [plain, https]


HIDDEN = b"GET /hidden HTTP/1.1\r\nHost: h\r\n\r\n"


@pytest.mark.parametrize(
    "body",
    [
        b"%x\r\n%s\r\n0\r\n\r\n" % (len(HIDDEN), HIDDEN),
        b'3;a="x y"\r\nabc\r\n0;q=1\r\n\r\n',
        b"1\r\na\r\n" * 100 + b"0\r\n\r\n",
    ],
)
def test_a_chunked_body_the_application_does_not_read_is_not_read_as_a_request(
    ignoring_servers: list[Server], body: bytes
) -> None:
    """cheroot drains a body by Content-Length the application left unread, not a
    chunked one: it would read the chunk size line as the next request.  The server
    reads the rest of the body, and the next request is the guard's next request."""
    stream = b"POST /r/0 HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n" + body
    stream += _post(b"/r/1", b"xyz") + SENTINEL
    view = front_view(stream, [])
    assert [r[1] for r in view.requests] == ["/r/0", "/r/1", "/sentinel"], view
    for server in ignoring_servers:
        sock = server.connect()
        try:
            sock.sendall(stream)
            responses, _ = read_responses(sock, 3)
        finally:
            sock.close()
        paths = [path for _, path, _ in served(responses)[0]]
        assert paths == ["/r/0", "/r/1", "/sentinel"], (server.tls is not None, responses)


# --------------------------------------------------------------------------- mixed
@st.composite
def edge_request(draw: st.DrawFn, i: int) -> bytes:
    """A request with the edges above around the framings h11 and the servers check."""
    version = draw(st.sampled_from([b"HTTP/1.1", b"HTTP/1.1", b"HTTP/1.0", b"HTTP/1.2"]))
    lead = b"\r\n" * draw(st.sampled_from([0, 0, 0, 1, 2]))
    headers = [b"Host: h"]
    if version == b"HTTP/1.0":
        headers.append(b"Connection: keep-alive")
    expect = draw(st.sampled_from([b"", b"", b"100-continue", b"100-Continue", b" 100-continue"]))
    if expect:
        headers.append(b"Expect: " + expect)
    body = draw(st.binary(max_size=8))
    framing = draw(st.sampled_from(["cl", "chunked", "none"]))
    if framing == "cl" or (framing == "chunked" and version != b"HTTP/1.1"):
        zeros = draw(st.sampled_from([0, 0, 2, 20 - len(str(len(body)))]))
        headers.append(b"Content-Length: " + b"0" * zeros + b"%d" % len(body))
        payload = body
    elif framing == "chunked":
        headers.append(b"Transfer-Encoding: chunked")
        payload = b""
        if body:
            size = draw(st.sampled_from(["%x", "%X", "000%x", "%020x"])) % len(body)
            ext = draw(st.sampled_from([b"", b";a", b";a=b", b';a="x y"']))
            payload += size.encode() + ext + b"\r\n" + body + b"\r\n"
        payload += draw(st.sampled_from([b"0", b"000", b"0;x=y", b"0" * 20])) + b"\r\n\r\n"
    else:
        payload = b""
    head = b"POST /r/%d %s\r\n" % (i, version) + b"\r\n".join(headers) + b"\r\n\r\n"
    return lead + head + payload


@st.composite
def edge_streams(draw: st.DrawFn) -> tuple[bytes, list[int]]:
    stream = b"".join(draw(edge_request(i)) for i in range(draw(st.integers(1, 4))))
    return stream, draw(st.lists(st.integers(0, len(stream)), max_size=6))


EDGES = settings(FUZZ, max_examples=EXAMPLES)


@EDGES
@given(case=edge_streams())
def test_guard_and_waitress_agree_at_the_edges(http_server: Server, case: Any) -> None:
    stream, splits = case
    view = front_view(stream, splits)
    assert view == front_view(stream, []), "the guard's framing depends on how bytes arrive"
    exchange(http_server, stream, view)


@EDGES
@given(case=edge_streams())
def test_guard_and_cheroot_agree_at_the_edges(https_server: Server, case: Any) -> None:
    stream, splits = case
    exchange(https_server, stream, front_view(stream, splits))


# ------------------------------------------------------------ the kept verdict's memory
def test_the_kept_verdict_holds_little_more_than_the_head() -> None:
    """A connection keeps the shape of its last head (at most 4 KiB) and h11's verdict on
    it; the verdict must not keep h11's request, whose header objects take 27 times the
    head's bytes for a head of empty headers (1000 connections: 110 MiB held idle)."""
    import gc
    import tracemalloc

    head = b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n"
    head += b"a:\r\n" * ((4096 - len(head) - 2) // 4) + b"\r\n"
    framings = []
    # only what this test's own calls allocated and still hold counts: the process's
    # total also moved with other threads' allocations (a session broker's reader, a
    # gateway's), 10 KB per connection once in a full run.  Deep tracebacks keep this
    # file's frame in every trace the Framings' calls make.  Tracing makes each head's read
    # ~80 ms (50 connections took 32 s of a loaded run): ten show the mean as well
    tracemalloc.start(32)
    try:
        for _ in range(10):
            framing = Framing(0.0)
            framing.received(head, 1.0)
            framings.append(framing)
        gc.collect()
        mine = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(True, __file__, all_frames=True)]
        )
        held = sum(stat.size for stat in mine.statistics("filename")) / len(framings)
    finally:
        tracemalloc.stop()
    assert all(not f.error and f.phase == "app" for f in framings)
    framings[0].sent(2.0)
    framings[0].received(head.replace(b"Length: 0", b"Length: 1") + b"x", 3.0)
    assert not framings[0].error and framings[0].body_bytes == 1  # the kept verdict
    assert held < 2 * len(head), f"{held:.0f} bytes held per connection"
