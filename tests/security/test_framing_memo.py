"""The verdict a connection's framing keeps on its last request head
(``wsnmom.http_framing``: h11 reads a head again only when its shape changes, the
``Content-Length`` digits aside).  A stream of requests with heads of one shape must be
read exactly as each request read alone by a new framing (which asks h11), and the server
behind the guard must serve exactly those requests (the exchange of
``test_framing_differential``)."""

from __future__ import annotations

import os

import h11
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.security.test_framing_differential import (
    FUZZ,
    Seen,
    Server,
    exchange,
    front_view,
    http_server,
)
from wsnmom.http_framing import APP, Framing

pytestmark = [pytest.mark.e2e, pytest.mark.fuzz]

__all__ = ["http_server"]  # the fixture, for the tests below

EXAMPLES = int(os.environ.get("WSNMOM_TEST_FUZZ_EXAMPLES", "0")) or 100


@st.composite
def same_shape(draw: st.DrawFn) -> list[bytes]:
    """Complete requests whose heads differ in the digits of their ``Content-Length`` at
    most (in their number, too: h11 takes at most 20)."""
    method = draw(st.sampled_from(["POST", "PUT", "post"]))
    version = draw(st.sampled_from(["HTTP/1.1", "HTTP/1.1", "HTTP/1.0"]))
    before = draw(st.sampled_from(["", " ", "  ", "\t"]))
    after = draw(st.sampled_from(["", " ", "\t "]))
    name = draw(st.sampled_from(["Content-Length", "content-length", "CONTENT-LENGTH"]))
    extra = draw(st.sampled_from([b"", b"Expect: 100-continue\r\n", b"Connection: keep-alive\r\n"]))
    out = []
    for _ in range(draw(st.integers(2, 4))):
        body = draw(st.binary(max_size=12))
        digits = str(len(body)).rjust(draw(st.sampled_from([0, 0, 3, 20, 21])), "0")
        head = f"{method} /memo {version}\r\nHost: h\r\n{name}:{before}{digits}{after}\r\n"
        out.append(head.encode() + extra + b"\r\n" + body)
    return out


def alone(requests: list[bytes]) -> tuple[list[Seen], bool]:
    """What new framings (h11 reading every head) make of the requests one by one: the
    requests until the first one refused, and whether one was."""
    seen: list[Seen] = []
    for one in requests:
        view = front_view(one, [])
        assert not view.mid_request
        if view.error:
            return seen, True
        seen += view.requests
    return seen, False


@settings(FUZZ, max_examples=EXAMPLES)
@given(requests=same_shape(), cuts=st.lists(st.integers(0, 400), max_size=4))
def test_a_head_of_the_same_shape_is_read_as_h11_reads_it(
    http_server: Server, requests: list[bytes], cuts: list[int]
) -> None:
    stream = b"".join(requests)
    view = front_view(stream, cuts)
    assert (view.requests, bool(view.error)) == alone(requests), stream
    assert not view.mid_request or view.error
    exchange(http_server, stream, view)


def test_h11_reads_a_head_again_only_when_its_shape_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made = []
    real = h11.Connection

    def counted(*args: object, **kwargs: object) -> h11.Connection:
        made.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(h11, "Connection", counted)
    f = Framing(0.0)
    for head, body in [
        (b"POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\n", b"abc"),
        (b"POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\n", b"abcde"),  # same shape
        (b"POST /b HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\n", b"abcde"),  # another
        (b"POST /b HTTP/1.1\r\nHost: h\r\nContent-Length: 15\r\n\r\n", b"x" * 15),  # 2 digits
        (b"POST /b HTTP/1.1\r\nHost: h\r\nContent-Length: 16\r\n\r\n", b"x" * 16),
    ]:
        f.received(head + body, 1.0)
        assert f.phase == APP and not f.error
        f.sent(2.0)
    assert len(made) == 3


def test_a_content_length_over_20_digits_is_refused_behind_one_of_20() -> None:
    f = Framing(0.0)
    f.received(
        b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: %s\r\n\r\nabc" % b"3".rjust(20, b"0"), 1.0
    )
    assert f.phase == APP and not f.error
    f.sent(2.0)
    f.received(
        b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: %s\r\n\r\nabc" % b"3".rjust(21, b"0"), 3.0
    )
    assert f.error and f.status == 400
