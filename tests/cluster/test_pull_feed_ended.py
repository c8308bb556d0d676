"""A GetMessages answer being sent by one instance, whose messages came from a
subscription that another instance ended meanwhile (Unsubscribe through it, or its
expiry by the leader), keeps them in the pull point when the client then goes away:
they come again from the pull point's inbox (docs/architecture.md, "The feed ended
meanwhile"; docs/scale-out.md).

The answering instance holds the only copy once the other instance deleted the
subscription's queue: RabbitMQ drops a deleted queue's unacknowledged messages with
it.  With a native pull (RabbitMQ's ``pull = "get"``, its default in a cluster) the
answering instance gave them back into that queue before (``PullFeeds.detach`` with
``here=False`` kept nothing late): lost every time.  With core's buffer (``pull =
"buffer"``) the reader keeps them since session 14.

The client reads the answer's head on a socket with a small receive buffer, so the
answer stays unsent, until the answering instance followed the end (its
``wsnmom_subscriptions`` gauge drops), then closes it unread (its kernel resets the
connection: not sent, given back).  The held answer carries every message: one that
had not reached the pull point when its subscription ended is deleted with it, by
design.  Two clusters of two instances (native pull, buffer), shared by their cases."""

from __future__ import annotations

import re
import socket
from collections.abc import Callable
from datetime import timedelta
from urllib.parse import urlsplit

import pytest
import requests
from lxml import etree

from tests.cluster.conftest import INSTANCE, Cluster
from tests.cluster.test_operate import metric
from tests.cluster.test_periodic_once import leader_and_follower
from tests.support.soap import content_type, envelope
from tests.support.waiting import wait_until
from wsnmom.client.model import EndpointReference
from wsnmom.testing.gateway import Gateway

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.rabbitmq]

TOPIC = "{urn:cluster}feed-ended"
ACTION = "http://docs.oasis-open.org/wsn/bw-2/PullPoint/GetMessagesRequest"
#: messages, and the size of each: one alone is far more than the held client's window
COUNT = 12
FILLER = 64 * 1024
#: the leader's sweep ends an expired subscription soon
SETTINGS = {"WSNMOM_TERMINATION__SWEEP_INTERVAL": "0.2"}
#: core's buffer instead of RabbitMQ's basic.get (one instance reads each pull point)
BUFFER = {**SETTINGS, "WSNMOM_ADAPTER_OPTIONS__PULL": "buffer"}


def _body(maximum: int) -> str:
    return (
        f"<wsnt:GetMessages><wsnt:MaximumNumber>{maximum}</wsnt:MaximumNumber></wsnt:GetMessages>"
    )


def _ask(c: Cluster, gateway: Gateway, address: str, maximum: int) -> tuple[str, list[int]]:
    """GetMessages through ``gateway``: the instance that read the pull point (its answer
    names it, also when forwarded) and the numbers (none: not answered yet)."""
    r = requests.post(
        c.via(gateway, address),
        data=envelope(_body(maximum), action=ACTION, to=address),
        headers={"Content-Type": content_type()},
        timeout=60,
    )
    if r.status_code != 200:
        return "", []  # "try again" while a shard finds its holder
    numbers = [int(v.get("n", "-1")) for v in etree.fromstring(r.content).iter("{urn:p}v")]
    return r.headers.get(INSTANCE, ""), numbers


def _hold(c: Cluster, gateway: Gateway, address: str) -> socket.socket | None:
    """A GetMessages to ``gateway`` whose answer's head is read and the rest left unread
    (a 4 KB window: the answer cannot be sent ahead of the reads); the socket, or None
    (closed: given back) when the answer does not carry every message yet."""
    url = urlsplit(c.via(gateway, address))
    data = envelope(_body(COUNT), action=ACTION, to=address)
    request = (
        f"POST {url.path} HTTP/1.1\r\nHost: {url.netloc}\r\n"
        f"Content-Type: {content_type()}\r\nContent-Length: {len(data)}\r\n\r\n"
    ).encode() + data
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(60)
    try:
        sock.connect((url.hostname, url.port))
        sock.sendall(request)
        got = b""
        while b"\r\n\r\n" not in got:
            chunk = sock.recv(1024)
            assert chunk, got
            got += chunk
    except BaseException:
        sock.close()
        raise
    head = got.split(b"\r\n\r\n", 1)[0]
    found = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    if not head.startswith(b"HTTP/1.1 200 ") or found is None or int(found[1]) <= COUNT * FILLER:
        sock.close()
        return None
    return sock


@pytest.mark.parametrize(
    ("settings", "end"),
    [
        pytest.param(SETTINGS, "unsubscribe", id="get-unsubscribe"),
        pytest.param(SETTINGS, "expiry", id="get-expiry"),
        pytest.param(BUFFER, "unsubscribe", id="buffer-unsubscribe"),
    ],
)
def test_an_unsent_answer_whose_feed_another_instance_ended_comes_again(
    shared_cluster: Callable[..., Cluster], settings: dict[str, str], end: str
) -> None:
    c = shared_cluster(2, **settings)
    a, b = c.gateways
    if end == "expiry":
        ender, answerer = leader_and_follower(c)  # the leader's sweep ends it
    else:
        answerer, ender = a, b
    address = c.client(answerer).create_pull_point().reference.address
    if settings is BUFFER:
        # the pull point's reader answers (the other instance would forward to it)
        reader = wait_until(lambda: _ask(c, a, address, 0)[0], 30, what="its reader")
        answerer, ender = (a, b) if reader == c.instance_of(a) else (b, a)
    known = metric(answerer, "wsnmom_subscriptions")
    sub = c.client(answerer).subscribe(EndpointReference(address), TOPIC)
    wait_until(lambda: metric(answerer, "wsnmom_subscriptions") > known, 30, what="it known")
    publisher = c.client(answerer)
    for i in range(COUNT):
        publisher.notify_many([(f'<p:v xmlns:p="urn:p" n="{i}">{"x" * FILLER}</p:v>', TOPIC)])
    held = wait_until(lambda: _hold(c, answerer, address), 60, what="an answer holding all")
    try:
        target = EndpointReference(c.via(ender if end == "unsubscribe" else answerer, sub.address))
        through = c.client(ender).subscription(target)
        if end == "unsubscribe":
            through.unsubscribe()
        else:
            through.renew(timedelta(seconds=1))
        # the answering instance followed the end (its feed removed): only then is the
        # answer given back, so that its give-back meets the removed feed
        wait_until(
            lambda: metric(answerer, "wsnmom_subscriptions") == known,
            60,
            what="the answering instance followed the end",
        )
    finally:
        held.close()  # unread bytes: the kernel resets the connection, the answer unsent
    got: list[int] = []

    def everything() -> bool:
        got.extend(_ask(c, answerer, address, COUNT)[1])
        return set(got) >= set(range(COUNT))

    try:
        wait_until(everything, 60, what="every message of the unsent answer again")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; got {got}") from None
    # kept in the inbox and settled in the deleted subscription: each once
    assert sorted(got) == list(range(COUNT)), got
    requests.post(
        c.via(answerer, address),
        data=envelope("<wsnt:DestroyPullPoint/>", to=address),
        headers={"Content-Type": content_type()},
        timeout=30,
    ).raise_for_status()
