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

import contextlib
import os
import re
import socket
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests
from lxml import etree

from tests.cluster.conftest import INSTANCE, Cluster
from tests.cluster.test_operate import metric, status
from tests.cluster.test_periodic_once import leader_and_follower
from tests.cluster.test_pull_owner import ONE_SHARD
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
#: while this file exists, the gateways follow no end of a subscription made through
#: another instance (``tests/support/killpoint``); one per test process
HOLD = Path(tempfile.gettempdir()) / f"wsnmom-hold-forget-{os.getpid()}"
#: while this file exists, an end that drains a feed into its pull point waits before
#: the drain (``KILLPOINT_HOLD_DRAIN``); the gateway touches ``.reached`` beside it then
DRAIN = Path(tempfile.gettempdir()) / f"wsnmom-hold-drain-{os.getpid()}"
REACHED = DRAIN.with_name(DRAIN.name + ".reached")
#: the leader's sweep ends an expired subscription soon; the hold above
SETTINGS = {
    "WSNMOM_TERMINATION__SWEEP_INTERVAL": "0.2",
    "PYTHONPATH": str(Path(__file__).parent.parent / "support" / "killpoint"),
    "KILLPOINT_HOLD_FORGET": str(HOLD),
    "KILLPOINT_HOLD_DRAIN": str(DRAIN),
}
#: the answering instance's gauge of the subscriptions it knows
GAUGE = "wsnmom_subscriptions"
#: core's buffer instead of RabbitMQ's basic.get (one instance reads each pull point)
BUFFER = {**SETTINGS, **ONE_SHARD, "WSNMOM_ADAPTER_OPTIONS__PULL": "buffer"}


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
    (closed: given back) when the answer does not carry every message yet.  The answer
    must be ``gateway``'s own: one it forwarded was settled once it had it."""
    own = c.instance_of(gateway)
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
    if f"\r\n{INSTANCE.lower()}: {own}\r\n".encode() not in head.lower() + b"\r\n":
        sock.close()
        raise AssertionError(f"not answered by {own} itself: {head!r}")
    found = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    if not head.startswith(b"HTTP/1.1 200 ") or found is None or int(found[1]) <= COUNT * FILLER:
        sock.close()
        return None
    return sock


def _made(
    c: Cluster, settings: dict[str, str], end: str
) -> tuple[Gateway, Gateway, str, str, float]:
    """The answering and the ending instance, a pull point's address, the address of a
    subscription feeding it (made through the answering one, which knows it then) and
    the answering one's gauge without it."""
    a, b = c.gateways
    if end == "expiry":
        ender, answerer = leader_and_follower(c)  # the leader's sweep ends it
    else:
        answerer, ender = a, b
    address = c.client(answerer).create_pull_point().reference.address
    if settings is BUFFER:
        # the pull point's reader answers (the other instance would forward to it): the
        # one holding the one shard, once both are in (no hand-over afterwards)
        wait_until(
            lambda: sorted(len(i["shards"]) for i in status(a)["instances"]) == [0, 1],
            60,
            what="both instances in, one holding the shard",
        )
        reader = wait_until(lambda: _ask(c, a, address, 0)[0], 30, what="its reader")
        answerer, ender = (a, b) if reader == c.instance_of(a) else (b, a)
    known = metric(answerer, GAUGE)
    sub = c.client(answerer).subscribe(EndpointReference(address), TOPIC)
    wait_until(lambda: metric(answerer, GAUGE) > known, 30, what="the subscription known")
    return answerer, ender, address, sub.address, known


def _gather(c: Cluster, gateway: Gateway, address: str) -> list[int]:
    """GetMessages through ``gateway`` until every message came; what came."""
    got: list[int] = []

    def everything() -> bool:
        got.extend(_ask(c, gateway, address, COUNT)[1])
        return set(got) >= set(range(COUNT))

    try:
        wait_until(everything, 60, what="every message of the unsent answer again")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; got {got}") from None
    return got


@contextlib.contextmanager
def _holding(hold: Path, *marks: Path) -> Iterator[None]:
    """``hold`` present inside (the gateways wait at its kill point), removed on leaving;
    the ``marks`` the gateways leave beside it removed before and after."""
    for mark in marks:
        mark.unlink(missing_ok=True)
    hold.touch()
    try:
        yield
    finally:
        hold.unlink(missing_ok=True)
        for mark in marks:
            mark.unlink(missing_ok=True)


def _destroy(c: Cluster, gateway: Gateway, address: str) -> None:
    """DestroyPullPoint of ``address`` through ``gateway``."""
    requests.post(
        c.via(gateway, address),
        data=envelope("<wsnt:DestroyPullPoint/>", to=address),
        headers={"Content-Type": content_type()},
        timeout=30,
    ).raise_for_status()


@pytest.mark.parametrize(
    ("settings", "end", "followed"),
    [
        pytest.param(SETTINGS, "unsubscribe", True, id="get-unsubscribe"),
        pytest.param(SETTINGS, "expiry", True, id="get-expiry"),
        pytest.param(SETTINGS, "unsubscribe", False, id="get-unsubscribe-unfollowed"),
        pytest.param(BUFFER, "unsubscribe", True, id="buffer-unsubscribe"),
        pytest.param(BUFFER, "unsubscribe", False, id="buffer-unsubscribe-unfollowed"),
    ],
)
def test_an_unsent_answer_whose_feed_another_instance_ended_comes_again(
    shared_cluster: Callable[..., Cluster], settings: dict[str, str], end: str, followed: bool
) -> None:
    """``followed``: the client goes away once the answering instance followed the end
    (its feed removed); else while that instance's following of it is held
    (``KILLPOINT_HOLD_FORGET``), after the ending instance deleted the queue."""
    c = shared_cluster(2, **settings)
    answerer, ender, address, subscription, known = _made(c, settings, end)
    publisher = c.client(answerer)
    for i in range(COUNT):
        publisher.notify_many([(f'<p:v xmlns:p="urn:p" n="{i}">{"x" * FILLER}</p:v>', TOPIC)])
    held = wait_until(lambda: _hold(c, answerer, address), 60, what="an answer holding all")
    assert held is not None
    try:
        with contextlib.nullcontext() if followed else _holding(HOLD):
            through = c.client(ender).subscription(
                EndpointReference(c.via(ender if end == "unsubscribe" else answerer, subscription))
            )
            if end == "unsubscribe":
                through.unsubscribe()  # answered once the queue is deleted
            else:
                through.renew(timedelta(seconds=1))
            if followed:
                wait_until(lambda: metric(answerer, GAUGE) == known, 60, what="the end followed")
            held.close()  # unread bytes: the kernel resets the connection, the answer unsent
            got = _gather(c, ender, address)
    finally:
        held.close()
    wait_until(lambda: metric(answerer, GAUGE) == known, 60, what="the end followed")
    # kept in the inbox and settled in the deleted subscription: each once
    assert sorted(got) == list(range(COUNT)), got
    _destroy(c, answerer, address)


def test_waiting_messages_of_a_feed_another_instance_ends_come_from_the_pull_point(
    shared_cluster: Callable[..., Cluster],
) -> None:
    """Native pull: the messages waiting in a subscription's queue when another instance
    ends it come from the pull point, each once, also when the instance that declared
    the queue (here: the one it was made through) follows the end between the ending
    instance's delete of the record and its drain of the queue: it leaves a queue that
    holds messages to the ending instance, which drains it and then deletes it
    (``RabbitMQSubscription.forget``; before session 15 it deleted them, about one run
    in three without the hold)."""
    c = shared_cluster(2, **SETTINGS)
    follower, ender, address, subscription, known = _made(c, SETTINGS, "unsubscribe")
    c.client(follower).notify_many(
        [(f'<p:v xmlns:p="urn:p" n="{i}"/>', TOPIC) for i in range(COUNT)]
    )  # confirmed: routed into the subscription's queue
    through = c.client(ender).subscription(EndpointReference(c.via(ender, subscription)))
    with _holding(DRAIN, REACHED), ThreadPoolExecutor(1) as pool:
        ended = pool.submit(through.unsubscribe)
        wait_until(REACHED.exists, 60, what="the end held before its drain")
        # the follower forgot it (its gauge drops once the adapter forgot it)
        wait_until(lambda: metric(follower, GAUGE) == known, 60, what="the end followed")
        DRAIN.unlink()
        ended.result(timeout=120)
    got = _gather(c, follower, address)
    assert sorted(got) == list(range(COUNT)), got
    _destroy(c, follower, address)
