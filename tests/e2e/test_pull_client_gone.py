"""A client that goes away in the middle of a GetMessages answer loses nothing: the
messages of the answer it did not take come again in the next GetMessages.

The client is a raw socket with a small receive buffer: it asks for messages large
enough that the answer cannot fit in the socket buffers, reads the head and a little of
the body, and closes (its kernel resets the connection, the unread bytes are dropped).
The gateway's write of the answer returns once the body is in waitress's output buffer,
long before the client read it, so an answer settled when the write returned was lost
for every client that went away (before ``wsnmom.sent_answers``: none of the cut
answer's messages ever came again).  Runs on every adapter of the shared gateways."""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Callable
from urllib.parse import urlsplit

import pytest
from lxml import etree

from tests.e2e.conftest import Wsn
from tests.support.soap import WSA, XPATH, content_type, envelope
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

#: messages in the pull point, and the size of each: one message alone is far more than
#: the cut client's receive window (it reads ``TAKEN`` bytes of the answer and goes)
COUNT = 12
FILLER = 64 * 1024
TAKEN = 1024


def _payload(n: int) -> str:
    return f'<p:v xmlns:p="urn:p" n="{n}">{"x" * FILLER}</p:v>'


def _numbers(messages: list[etree._Element]) -> list[int]:
    return [int(v.get("n", "-1")) for m in messages for v in m.iter("{urn:p}v")]


def _cut(address: str, body: str) -> int | None:
    """POST ``body`` on a raw socket that reads ``TAKEN`` bytes of a large answer and
    closes; the answer's Content-Length, or None when the answer was small (no message
    yet: nothing cut)."""
    sock, length = _open_answer(address, body)
    sock.close()  # unread bytes in the receive buffer: the kernel resets the connection
    return length


def _open_answer(address: str, body: str) -> tuple[socket.socket, int | None]:
    """``_cut`` without the close: the socket, and the Content-Length of a large answer
    (None: small)."""
    url = urlsplit(address)
    data = envelope(body)
    request = (
        f"POST {url.path} HTTP/1.1\r\nHost: {url.netloc}\r\n"
        f"Content-Type: {content_type()}\r\nContent-Length: {len(data)}\r\n\r\n"
    ).encode() + data
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        # a small window: the gateway cannot send the answer ahead of the reads
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(60)
        sock.connect((url.hostname, url.port))
        sock.sendall(request)
        got = b""
        while b"\r\n\r\n" not in got:
            chunk = sock.recv(TAKEN)
            assert chunk, got
            got += chunk
        head = got.split(b"\r\n\r\n", 1)[0]
        assert head.startswith(b"HTTP/1.1 200 "), head
        found = re.search(rb"(?im)^content-length:\s*(\d+)", head)
        assert found is not None, head
        length = int(found.group(1))
        return sock, (length if length > FILLER else None)
    except BaseException:
        sock.close()
        raise


def _read_whole(address: str, body: str) -> bytes:
    """POST ``body`` on a raw socket with the same small window, and read the whole
    answer (the gateway sends it as the client reads: its settlement waits)."""
    url = urlsplit(address)
    data = envelope(body)
    request = (
        f"POST {url.path} HTTP/1.1\r\nHost: {url.netloc}\r\nConnection: close\r\n"
        f"Content-Type: {content_type()}\r\nContent-Length: {len(data)}\r\n\r\n"
    ).encode() + data
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(60)
        sock.connect((url.hostname, url.port))
        sock.sendall(request)
        got = bytearray()
        while chunk := sock.recv(TAKEN):
            got += chunk
    head, _, answer = bytes(got).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), head
    return answer


def _publish(wsn: Wsn) -> None:
    for n in range(COUNT):
        wsn.notify(("tns:big", _payload(n)))


def _gather(fetch: Callable[[], list[int]], what: str) -> list[int]:
    """Call ``fetch`` until messages 0..COUNT-1 all came; what came, in order (a failure
    names it: a ``what`` built before the wait would always say nothing came)."""
    got: list[int] = []

    def everything() -> bool:
        got.extend(fetch())
        return set(got) >= set(range(COUNT))

    try:
        wait_until(everything, 30, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; got {got}") from None
    return got


def test_an_answer_the_client_went_away_from_comes_again(wsn: Wsn) -> None:
    _, pp = wsn.create_pull_point()
    wsn.subscribe(pp, "tns:big")
    _publish(wsn)
    # an answer with no message yet is small: ask until one with messages is cut
    body = f"<wsnt:GetMessages><wsnt:MaximumNumber>{COUNT}</wsnt:MaximumNumber></wsnt:GetMessages>"
    wait_until(lambda: _cut(pp, body), 30, what="an answer with messages")
    got = _gather(lambda: _numbers(wsn.get_messages(pp, COUNT)), "every message again")
    assert sorted(set(got)) == list(range(COUNT)), got
    wsn.post(pp, "<wsnt:DestroyPullPoint/>").ok()


def test_an_answer_read_slowly_to_its_end_is_settled(wsn: Wsn) -> None:
    """The other side: an answer sent while its client reads it (pending first) is
    settled once sent, so none of its messages comes twice (before the sentinel)."""
    _, pp = wsn.create_pull_point()
    wsn.subscribe(pp, "tns:big")
    _publish(wsn)
    body = f"<wsnt:GetMessages><wsnt:MaximumNumber>{COUNT}</wsnt:MaximumNumber></wsnt:GetMessages>"

    def read_all() -> list[int]:
        answer = _read_whole(pp, body)
        return [int(v.get("n", "-1")) for v in etree.fromstring(answer).iter("{urn:p}v")]

    got = _gather(read_all, "every message")
    wsn.notify(("tns:big", _payload(COUNT)))  # the sentinel
    after: list[int] = []

    def sentinel() -> bool:
        after.extend(_numbers(wsn.get_messages(pp, COUNT)))
        return COUNT in after

    wait_until(sentinel, 30, what="the sentinel")
    assert sorted(got) == list(range(COUNT)), got
    assert after == [COUNT], after
    wsn.post(pp, "<wsnt:DestroyPullPoint/>").ok()


def test_an_answer_cut_after_its_feed_ended_comes_again_from_the_inbox(wsn: Wsn) -> None:
    """The subscription feeding the pull point ends (Unsubscribe) while an answer that
    took its messages is being sent, and the client then goes away: the messages are
    kept in the pull point (its inbox), as the end keeps what reached it, rather than
    given back into the subscription being deleted.  The MessageContent filter makes the
    subscription a feed (the embedded adapter routes one without it into the inbox at
    publish time).  The held answer carries all the messages: one that had not reached
    the pull point when the subscription ended is deleted with it (by design), and an
    answer taken before the last one arrived would make that a flake (it was, on
    Kafka: the wait's message said ``got []`` while 11 of 12 came)."""
    _, pp = wsn.create_pull_point()
    every = f'<wsnt:MessageContent Dialect="{XPATH}">true()</wsnt:MessageContent>'
    sub = wsn.subscribe(pp, "tns:big", extra_filter=every)
    _publish(wsn)
    body = f"<wsnt:GetMessages><wsnt:MaximumNumber>{COUNT}</wsnt:MaximumNumber></wsnt:GetMessages>"
    held: list[socket.socket] = []

    def cut_later() -> int | None:
        sock, length = _open_answer(pp, body)
        if length is None or length <= COUNT * FILLER:
            sock.close()  # not all of them yet: given back, first again in the next
            return None
        held.append(sock)
        return length

    wait_until(cut_later, 60, what="an answer with every message, held unread")
    wsn.post(sub.address, "<wsnt:Unsubscribe/>").ok()
    held[-1].close()  # the answer unsent: given back
    _gather(lambda: _numbers(wsn.get_messages(pp, COUNT)), "every message again")
    wsn.post(pp, "<wsnt:DestroyPullPoint/>").ok()


# --- ONVIF PullMessages: the same rule, for an answer at once and for a long poll's ----------
TEV = "http://www.onvif.org/ver10/events/wsdl"
CONCRETE_SET = "http://www.onvif.org/ver10/tev/topicExpression/ConcreteSet"


def _pull_body(timeout: str) -> str:
    return (
        f'<tev:PullMessages xmlns:tev="{TEV}"><tev:Timeout>{timeout}</tev:Timeout>'
        f"<tev:MessageLimit>{COUNT}</tev:MessageLimit></tev:PullMessages>"
    )


def _onvif_subscription(wsn: Wsn) -> str:
    expression = (
        f'<wsnt:TopicExpression Dialect="{CONCRETE_SET}" xmlns:tns="{wsn.ns}">tns:big'
        "</wsnt:TopicExpression>"
    )
    created = wsn.post(
        f"{wsn.server.base_url}/onvif/event_service",
        f'<tev:CreatePullPointSubscription xmlns:tev="{TEV}"><tev:Filter>{expression}'
        "</tev:Filter><tev:InitialTerminationTime>PT120S</tev:InitialTerminationTime>"
        "</tev:CreatePullPointSubscription>",
        validate=False,
    )
    assert created.status == 200, created.data
    address = created.body.findtext(f"{{{TEV}}}SubscriptionReference/{{{WSA}}}Address")
    assert address, created.data
    return address.strip()


def _pulled(wsn: Wsn, address: str) -> list[int]:
    answer = wsn.post(address, _pull_body("PT0S"), validate=False)
    assert answer.status == 200, answer.data
    return [int(v.get("n", "-1")) for v in answer.body.iter("{urn:p}v")]


@pytest.mark.parametrize("waiting", [False, True], ids=["at-once", "long-poll"])
def test_a_pull_messages_answer_the_client_went_away_from_comes_again(
    wsn: Wsn, waiting: bool
) -> None:
    """ONVIF PullMessages settled at once before (at most once): the cut answer's messages
    were lost.  ``long-poll``: the PullMessages waits (parked) when the messages come, and
    its answer is made by the poller and written when the request runs again."""
    address = _onvif_subscription(wsn)
    if waiting:
        cut: list[int | None] = []
        client = threading.Thread(target=lambda: cut.append(_cut(address, _pull_body("PT60S"))))
        client.start()
        _publish(wsn)
        client.join(90)
        assert cut and cut[0] is not None, cut
    else:
        _publish(wsn)
        wait_until(lambda: _cut(address, _pull_body("PT0S")), 30, what="an answer with messages")
    got = _gather(lambda: _pulled(wsn, address), "every message again")
    assert sorted(set(got)) == list(range(COUNT)), got
