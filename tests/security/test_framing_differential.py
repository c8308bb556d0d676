"""Request smuggling: the connection guard's framing (``wsnmom.http_framing``, on h11) and
the HTTP server behind it must agree on where every request ends, or the guard refuses the
bytes before the server reads them (issue 24, item 6).

hypothesis builds request streams from the parts that desynchronise parsers: pipelined
requests, ``Content-Length`` and ``Transfer-Encoding`` together, duplicate and invalid
``Content-Length``, obs-fold, chunk extensions, bare LF, huge chunk sizes, invalid
tokens, HTTP/1.0 with ``Transfer-Encoding``, stray empty lines.  Each stream is read by a
standalone :class:`Framing` (the guard's view: the requests it saw, each as method,
target and body, and whether it refused) and sent to a real server behind the guard, as
the gateway serves it (``serving._http_server``: waitress for HTTP, cheroot with the
TLS ingress for HTTPS), whose application echoes each request it is given.  What the
server served must be exactly the guard's requests, in order, as a prefix: never a
request the guard did not see, never a body cut elsewhere.  A stream the guard accepts
ends with a sentinel request, whose answer proves that nothing was served beyond it; a
stream it refuses must be answered 400 (or closed) with nothing served past the refusal.

The second half sends the classic smuggling streams to waitress alone, then behind the
guard: waitress alone serves a request hidden in another's body; behind the guard it is
refused.

Cost: three in-process servers, about 10 s.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import ssl
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import h11
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fixtures.server import free_port
from tests.support.tls import Certificates
from wsnmom.connections import ConnectionGuard, ConnectionPolicy
from wsnmom.http_framing import Framing

pytestmark = [pytest.mark.e2e, pytest.mark.fuzz]

EXAMPLES = int(os.environ.get("WSNMOM_TEST_FUZZ_EXAMPLES", "0")) or 200
SENTINEL = b"GET /sentinel HTTP/1.1\r\nHost: s\r\n\r\n"
#: (method, target, body) of one request
Seen = tuple[str, str, bytes]


# ------------------------------------------------------------------------------ servers
def echo(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    """Answer each request with what the server read of it."""
    body = environ["wsgi.input"].read()
    target = environ.get("PATH_INFO", "") + (
        "?" + environ["QUERY_STRING"] if environ.get("QUERY_STRING") else ""
    )
    out = json.dumps({"m": environ["REQUEST_METHOD"], "t": target, "b": body.hex()}).encode()
    start_response(
        "200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(out)))]
    )
    return [out]


@dataclass
class Server:
    port: int
    tls: ssl.SSLContext | None = None

    def connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        if self.tls is not None:
            return self.tls.wrap_socket(sock, server_hostname="127.0.0.1")
        return sock


def _settings(env: dict[str, str]) -> Any:
    from wsnmom.core.config import load_settings

    return load_settings(environ={"WSNMOM_THREADS": "4", **env})


@contextlib.contextmanager
def _serving(
    env: dict[str, str], tls: ssl.SSLContext | None = None, app: Any = None
) -> Iterator[Server]:
    """The gateway's HTTP server (``serving._http_server``) behind its guard, with
    ``app`` (by default the echo application)."""
    from wsnmom.serving import _http_server

    settings = _settings(env)
    guard = ConnectionGuard(ConnectionPolicy.from_settings(settings))
    port = free_port()
    sock = socket.create_server(("127.0.0.1", port))
    server = _http_server(app or echo, [sock], settings, guard)
    guard.start()
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        yield Server(port, tls)
    finally:
        server.close()
        guard.stop()
        thread.join(5)


@pytest.fixture(scope="module")
def http_server() -> Iterator[Server]:
    with _serving({}) as server:
        yield server


@pytest.fixture(scope="module")
def https_server() -> Iterator[Server]:
    folder = Path(tempfile.mkdtemp(prefix="wsnmom-framing-certs-"))
    certs = Certificates(folder)
    client = ssl.create_default_context(cafile=certs.path("ca"))
    with _serving({"WSNMOM_TLS__CERTFILE": certs.path("server")}, client) as server:
        yield server


@pytest.fixture(scope="module")
def bare_waitress() -> Iterator[Server]:
    """waitress alone, without the guard: the back end's own reading."""
    import waitress

    port = free_port()
    sock = socket.create_server(("127.0.0.1", port))
    server = waitress.create_server(echo, sockets=[sock], threads=2)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        yield Server(port)
    finally:
        server.close()
        thread.join(5)


# ------------------------------------------------------------------------------ the views
@dataclass
class FrontView:
    requests: list[Seen]
    error: str
    mid_request: bool
    #: each request's HTTP version
    versions: list[bytes]


def front_view(stream: bytes, splits: list[int]) -> FrontView:
    """What the guard's framing makes of ``stream`` received in pieces cut at ``splits``."""
    framing = Framing(0.0)
    seen: list[Seen] = []
    versions: list[bytes] = []
    current: list[Any] = []

    def listen(event: Any) -> None:
        if isinstance(event, h11.Request):
            current[:] = [event.method.decode(), event.target.decode("latin-1"), b""]
            versions.append(event.http_version)
        elif isinstance(event, h11.Data):
            current[2] += event.data
        else:
            seen.append((current[0], current[1], current[2]))

    framing.listener = listen
    cuts = [0, *sorted({s for s in splits if 0 < s < len(stream)}), len(stream)]
    for start, end in pairwise(cuts):
        framing.received(stream[start:end], 1.0)
    return FrontView(seen, framing.error, framing.mid_request, versions[: len(seen)])


def read_responses(sock: socket.socket, want: int) -> tuple[list[tuple[int, bytes]], bool]:
    """Up to ``want`` responses (status, body; interim ones skipped) and whether the
    server closed the connection before."""
    buffer = b""
    out: list[tuple[int, bytes]] = []

    def more() -> bool:
        nonlocal buffer
        try:
            data = sock.recv(65536)
        except (ConnectionResetError, ssl.SSLError, BrokenPipeError):
            data = b""
        buffer += data
        return bool(data)

    while len(out) < want:
        while b"\r\n\r\n" not in buffer:
            if not more():
                return out, True
        head, _, buffer = buffer.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        if 100 <= status < 200:
            continue
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        while len(buffer) < length:
            if not more():
                return out, True
        out.append((status, buffer[:length]))
        buffer = buffer[length:]
    return out, False


def served(responses: list[tuple[int, bytes]]) -> tuple[list[Seen], int | None]:
    """The requests the server's application served, and the status of the error answer
    that ended the exchange (None: none)."""
    out: list[Seen] = []
    for status, body in responses:
        if status != 200:
            return out, status
        echoed = json.loads(body)
        out.append((echoed["m"], echoed["t"], bytes.fromhex(echoed["b"])))
    return out, None


def exchange(server: Server, stream: bytes, view: FrontView) -> None:
    """Send ``stream`` and check the server served what the guard saw (module docstring)."""
    front = view.requests
    clean = not view.error and not view.mid_request
    sock = server.connect()
    try:
        sock.sendall(stream + (SENTINEL if clean else b""))
        want = len(front) + (1 if clean else 0)
        responses, closed = read_responses(sock, want)
        if view.mid_request and not view.error and not closed:
            # the guard waits for the rest of a request: end the stream, and whatever
            # the server still answers must be within the guard's requests
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_WR)
            more, _ = read_responses(sock, 1)
            responses += more
    finally:
        sock.close()
    back, error = served(responses)
    if back and back[-1][1] == "/sentinel":
        back.pop()
        assert back == front, ("the sentinel was served after other requests", stream, front, back)
        return
    assert back == front[: len(back)], ("served what the guard did not see", stream, front, back)
    if view.error:
        # refused: nothing served past the refusal, answered 400 (431, 505) or closed
        assert error in (None, 400, 431, 505), (stream, view.error, error)
        return
    if error == 413:  # a body over max_request_bytes: a limit, not a framing question
        return
    assert error is None, ("the server refused what the guard let through", stream, front, error)
    if clean:  # closed early, without an error: only after an HTTP/1.0 request
        assert closed and back and view.versions[len(back) - 1] == b"1.0", (stream, front, back)


# ------------------------------------------------------------------------------ streams
_TOKENS = st.sampled_from(["GET", "POST", "PUT", "G@T", "GET\x00", "get", ""])
_CL_VALUES = st.sampled_from(["+5", "5 5", "0x5", "-1", "5,5", "05", "", "99999999999999999999"])


@st.composite
def chunked_body(draw: st.DrawFn, eol: bytes, odd: bool) -> bytes:
    """A chunked body; ``odd``: its size lines, extensions, ends and trailers may be
    malformed or unusual."""
    out = b""
    for _ in range(draw(st.integers(0, 3))):
        data = draw(st.binary(min_size=1, max_size=12))
        sizes = [f"{len(data):x}", f"{len(data):X}", f"00{len(data):x}"]
        exts = ["", ";a=b", ';a="q"', ";a"]
        ends = [b"\r\n"]
        if odd:
            sizes += [f"{len(data):x} ", f" {len(data):x}", f"0x{len(data):x}", "f" * 20]
            sizes += ["1" + "0" * 16, f"{len(data) + 1:x}"]
            exts += ["; a=b", ";a=\x01", ';a="', ";a=b c", ";=b"]
            ends += [b"\n", b"", b"xx"]
        size = draw(st.sampled_from(sizes))
        ext = draw(st.sampled_from(exts))
        out += size.encode() + ext.encode("latin-1") + eol + data + draw(st.sampled_from(ends))
    last = draw(st.sampled_from([b"0", b"00", b"0;x=y"]))
    trailers = [b""] + ([b"T: v\r\n", b"Content-Length: 3\r\n", b" bad\r\n"] if odd else [])
    return out + last + eol + draw(st.sampled_from(trailers)) + b"\r\n"


@st.composite
def request(draw: st.DrawFn, i: int) -> bytes:
    """One request, mostly valid, with one or two of the hazards."""
    hazards = draw(st.one_of(st.just(set()), st.sets(st.integers(0, 12), min_size=1, max_size=2)))
    method = draw(_TOKENS) if 0 in hazards else draw(st.sampled_from(["GET", "POST"]))
    target = f"/r/{i}" + ("/x y" if 1 in hazards else "")
    version = "HTTP/1.0" if 2 in hazards else "HTTP/1.1"
    eol = b"\n" if 3 in hazards else b"\r\n"
    headers = [b"Host: h"]
    if version == "HTTP/1.0":
        headers.append(b"Connection: keep-alive")
    if 4 in hazards:
        headers.append(b"X-Fold: a\r\n b")  # obs-fold
    if 5 in hazards:
        headers.append(draw(st.sampled_from([b"Bad Name: x", b"X\x00: y", b"X: \x7f", b": x"])))
    body = draw(st.binary(max_size=10))
    framing = draw(st.sampled_from(["none", "cl", "cl", "chunked", "chunked"]))
    if framing == "cl":
        headers.append(b"Content-Length: %d" % len(body))
        payload = body
    elif framing == "chunked":
        headers.append(b"Transfer-Encoding: chunked")
        payload = draw(chunked_body(eol if 3 in hazards else b"\r\n", 12 in hazards))
    else:
        payload = b""
    if 6 in hazards:  # Content-Length and Transfer-Encoding together
        headers.append(b"Content-Length: %d" % draw(st.integers(0, 12)))
        if framing != "chunked":
            headers.append(b"Transfer-Encoding: chunked")
    if 7 in hazards:  # a second Content-Length, the same or another
        headers.append(b"Content-Length: %d" % draw(st.sampled_from([len(body), len(body) + 2])))
    if 8 in hazards:
        headers.append(b"Content-Length: " + draw(_CL_VALUES).encode())
    if 9 in hazards:
        te = draw(st.sampled_from(["chunked, chunked", "gzip, chunked", "Chunked", "chunked "]))
        headers.append(b"Transfer-Encoding: " + te.encode())
    if 10 in hazards:
        headers.append(b"Content-Length : %d" % len(body))  # whitespace before the colon
    head = f"{method} {target} {version}".encode("latin-1") + b"\r\n"
    head += eol.join(headers) + eol + eol
    lead = b"\r\n" if 11 in hazards else b""
    return lead + head + payload


@st.composite
def streams(draw: st.DrawFn) -> tuple[bytes, list[int]]:
    count = draw(st.integers(1, 4))
    stream = b"".join(draw(request(i)) for i in range(count))
    splits = draw(st.lists(st.integers(0, len(stream)), max_size=6))
    return stream, splits


FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=not os.environ.get("WSNMOM_TEST_FUZZ_EXAMPLES"),
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@FUZZ
@given(case=streams())
def test_guard_and_waitress_agree_on_every_request(
    http_server: Server, case: tuple[bytes, list[int]]
) -> None:
    stream, splits = case
    view = front_view(stream, splits)
    assert view == front_view(stream, []), "the guard's framing depends on how bytes arrive"
    exchange(http_server, stream, view)


@FUZZ
@given(case=streams())
def test_guard_and_the_https_server_agree_on_every_request(
    https_server: Server, case: tuple[bytes, list[int]]
) -> None:
    stream, splits = case
    exchange(https_server, stream, front_view(stream, splits))


# ------------------------------------------------------------------------------ smuggling
SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: h\r\n\r\n"
_CHUNKED_SMUGGLED = b"%x\r\n%s\r\n0\r\n\r\n" % (len(SMUGGLED), SMUGGLED)
#: name -> a stream whose second request hides in the first one's body for one reading,
#: and what waitress alone makes of it (the sentinel after it included): the paths it
#: serves, and the error status that ends the exchange
CLASSICS = {
    # waitress ignores Transfer-Encoding in HTTP/1.0 and reads no body: the chunked body
    # is read as the next request (refused here, as its first line is the chunk size; a
    # proxy in front that honours the Transfer-Encoding saw one request and no error)
    "te-in-http-1.0": (
        b"POST /r/0 HTTP/1.0\r\nHost: h\r\nConnection: keep-alive\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + _CHUNKED_SMUGGLED,
        (["/r/0"], 400),
    ),
    # CL.TE: for a server that reads Content-Length, the chunk size line is the body
    # (waitress reads the chunks; a proxy in front that reads Content-Length would not)
    "cl-and-te": (
        b"POST /r/0 HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + _CHUNKED_SMUGGLED,
        (["/r/0", "/sentinel"], None),
    ),
}


@pytest.mark.parametrize("name", sorted(CLASSICS))
def test_smuggling_streams_are_refused_by_the_guard(
    bare_waitress: Server, http_server: Server, https_server: Server, name: str
) -> None:
    stream, (alone_paths, alone_error) = CLASSICS[name]
    stream += SENTINEL
    view = front_view(stream, [])
    assert view.error and view.requests == [], view

    with _sent(bare_waitress, stream) as sock:
        alone, _ = read_responses(sock, len(alone_paths) + (alone_error is not None))
    seen, error = served(alone)
    assert ([path for _, path, _ in seen], error) == (alone_paths, alone_error), alone

    for server in (http_server, https_server):
        with _sent(server, stream) as sock:
            responses, closed = read_responses(sock, 3)
        assert closed and served(responses) == ([], 400), (name, responses)


def _sent(server: Server, stream: bytes) -> socket.socket:
    sock = server.connect()
    sock.sendall(stream)
    return sock
