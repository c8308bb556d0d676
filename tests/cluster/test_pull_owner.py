"""Pull points that core buffers (Kafka: no native pull) in a cluster of two instances on
one PostgreSQL store (issue 23 §2, §3): one instance reads each pull point, GetMessages
sent to the other is forwarded to it, so concurrent GetMessages through both hand out
every message exactly once; a kill -9 of the reader while draining loses nothing, and
what comes twice is only what the dead reader handed out in its last moments.

The tests share one cluster per middleware (``shared_cluster``), the kill -9 last (a
test finding an instance dead starts a new cluster)."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import requests
from lxml import etree
from wsnmom.soap_frontend.xml import WSNMOM

from tests.cluster.conftest import INSTANCE, MQTT, Cluster
from tests.cluster.test_operate import status
from tests.support.soap import WSNT, body_child, content_type, envelope, fault_name
from tests.support.waiting import wait_until
from wsnmom.client.model import EndpointReference
from wsnmom.testing.gateway import Gateway

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

KAFKA = [pytest.param("kafka", marks=pytest.mark.kafka)]
TOPIC = "{urn:cluster}pull"
#: the other test's topic: the module's tests share a cluster per middleware (its pull
#: points fed from separate topics)
ONCE = "{urn:cluster}pull-once"
#: the clusters' settings: one shard, so one instance reads every pull point
ONE_SHARD = {"WSNMOM_CLUSTER__SHARDS": "1"}
ACTION = "http://docs.oasis-open.org/wsn/bw-2/PullPoint/GetMessagesRequest"
#: what the dead reader may have handed out again: its last position save and commit
#: pass (1.2 s, docs/scale-out.md) with headroom for a loaded 2-core machine
UNSAVED = 3.0


def n(i: int) -> str:
    return f'<n xmlns="urn:n">{i}</n>'


@dataclass(frozen=True, slots=True)
class Answer:
    """One GetMessages answer: HTTP status, the instance it names, the numbers in it."""

    status: int
    instance: str
    numbers: list[int]
    fault: str = ""
    retry_after: str = ""


def get_messages(
    c: Cluster, gateway: Gateway, address: str, maximum: int, headers: dict[str, str] | None = None
) -> Answer:
    """GetMessages sent to ``gateway`` as raw SOAP (the response headers matter here)."""
    target = c.via(gateway, address)
    body = (
        f"<wsnt:GetMessages><wsnt:MaximumNumber>{maximum}</wsnt:MaximumNumber></wsnt:GetMessages>"
    )
    r = requests.post(
        target,
        data=envelope(body, action=ACTION, to=address),
        headers={"Content-Type": content_type(), **(headers or {})},
        timeout=60,
    )
    instance = r.headers.get(INSTANCE, "")
    if r.status_code != 200:
        return Answer(
            r.status_code, instance, [], fault_name(r.content), r.headers.get("Retry-After", "")
        )
    answer = body_child(r.content)
    numbers = [
        int("".join(m.itertext()).strip())
        for m in answer.iter(f"{{{WSNT}}}Message")
        if isinstance(m.tag, str)
    ]
    return Answer(r.status_code, instance, numbers)


def publish(c: Cluster, gateway: Gateway, numbers: range, topic: str = TOPIC) -> None:
    client = c.client(gateway)
    for start in range(numbers.start, numbers.stop, 25):
        client.notify_many([(n(i), topic) for i in range(start, min(start + 25, numbers.stop))])


def feed(c: Cluster, gateway: Gateway, address: str, topic: str = TOPIC) -> None:
    """A subscription on ``topic`` feeding the pull point (made through ``gateway``)."""
    c.client(gateway).subscribe(EndpointReference(address), topic)


@pytest.mark.parametrize("middleware", [*KAFKA, MQTT], indirect=True)
def test_get_messages_through_both_instances_hands_out_every_message_once(
    shared_cluster: Callable[..., Cluster],
) -> None:
    c = shared_cluster(2, **ONE_SHARD)
    a, b = c.gateways
    # both instances in, one holding the shard: a hand-over while draining is the other
    # test's
    wait_until(
        lambda: sorted(len(i["shards"]) for i in status(a)["instances"]) == [0, 1],
        30,
        what="both instances in, one holding the shard",
    )
    pull_point = c.client(a).create_pull_point()
    address = pull_point.reference.address
    feed(c, a, address, ONCE)
    count = 400
    publish(c, b, range(count), ONCE)
    got: list[int] = []
    named: Counter[tuple[str, str]] = Counter()
    refusals: list[Answer] = []
    lock = threading.Lock()

    def drain(gateway: Gateway) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with lock:
                if len(set(got)) >= count:
                    return
            answer = get_messages(c, gateway, address, 9)
            with lock:
                if answer.status == 200:
                    got.extend(answer.numbers)
                    if answer.numbers:
                        named[(gateway.base_url, answer.instance)] += 1
                else:
                    refusals.append(answer)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for f in [pool.submit(drain, g) for g in (a, b, a, b)]:
            f.result()
    twice = sorted(k for k, v in Counter(got).items() if v > 1)
    assert twice == [], f"{len(twice)} message(s) handed out twice: {twice[:20]}"
    assert sorted(got) == list(range(count))
    assert refusals == []  # no hand-over: every answer came from the reader
    # one instance read every message, whichever instance was asked, and says so
    readers = {instance for _, instance in named}
    assert len(readers) == 1 and readers <= {"g0", "g1"}, named
    assert {url for url, _ in named} == {a.base_url, b.base_url}, named
    reader = readers.pop()
    other = b if reader == c.instance_of(a) else a
    assert "forwarding" not in other.log_tail(200)  # no forward failed

    # a client cannot pose as an instance: a forwarding header it made up is refused,
    # and what it asked for stays in the pull point
    publish(c, b, range(count, count + 1), ONCE)
    forged = {"WSNMOM-Forwarded": f"g0 {int(time.time())} {'0' * 64}"}
    for gateway in (a, b):
        r = requests.post(
            c.via(gateway, address),
            data=envelope("<wsnt:GetMessages/>", action=ACTION, to=address),
            headers={"Content-Type": content_type(), **forged},
            timeout=30,
        )
        assert r.status_code == 403, r.text
        assert etree.QName(body_child(r.content)).localname == "Fault"
    left = wait_until(
        lambda: get_messages(c, other, address, 0).numbers, 20, what="the message kept"
    )
    assert left == [count]

    # a client that posts to the broker's address and names the pull point only by the
    # ResourceId reference parameter of its EPR is forwarded to the reader too
    publish(c, b, range(count + 1, count + 2), ONCE)
    resource_id = address.rstrip("/").rsplit("/", 1)[1]
    param = (
        f'<wsnmom:ResourceId xmlns:wsnmom="{WSNMOM}" wsa:IsReferenceParameter="true">'
        f"{resource_id}</wsnmom:ResourceId>"
    )

    def by_resource_id() -> list[int]:
        r = requests.post(
            other.broker_url,
            data=envelope("<wsnt:GetMessages/>", action=ACTION, headers=param),
            headers={"Content-Type": content_type()},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        assert r.headers[INSTANCE] == reader
        return [
            int("".join(m.itertext()).strip())
            for m in body_child(r.content).iter(f"{{{WSNT}}}Message")
        ]

    assert wait_until(by_resource_id, 20, what="the message read by ResourceId") == [count + 1]


@pytest.mark.parametrize("middleware", [*KAFKA, MQTT], indirect=True)
def test_a_kill_9_of_the_reader_while_draining_loses_nothing(
    shared_cluster: Callable[..., Cluster],
) -> None:
    # one shard: the pull point's reader is the instance holding it; the module's last
    # test on the cluster (it kills an instance)
    c = shared_cluster(2, **ONE_SHARD)
    a, b = c.gateways
    pull_point = c.client(a).create_pull_point()
    address = pull_point.reference.address
    feed(c, b, address)
    before, after = 800, 100
    publish(c, a, range(before))
    first = wait_until(
        lambda: (lambda x: x if x.numbers else None)(get_messages(c, a, address, 5)),
        20,
        what="the first messages",
    )
    reader_id = first.instance
    reader, survivor = (a, b) if reader_id == c.instance_of(a) else (b, a)
    # number -> (first time handed out, by whom)
    first_seen: dict[int, tuple[float, str]] = {}
    got: list[int] = []
    refusals: list[Answer] = []
    lock = threading.Lock()
    killed = threading.Event()

    def take(answer: Answer) -> None:
        now = time.monotonic()
        with lock:
            if answer.status != 200:
                refusals.append(answer)
                return
            got.extend(answer.numbers)
            for i in answer.numbers:
                first_seen.setdefault(i, (now, answer.instance))

    take(first)
    total = before + after

    def handed_out_before(moment: float) -> int:
        with lock:
            return sum(1 for t, _ in first_seen.values() if t < moment)

    def drain(gateway: Gateway) -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            with lock:
                if len(set(got)) >= total:
                    return
            if gateway is reader and killed.is_set():
                return
            # before the kill, a steady pace of small batches, so that the reader hands
            # out for longer than UNSAVED before it; after it the pace asserts nothing:
            # the rest is drained in large batches
            gone = killed.is_set()
            try:
                answer = get_messages(c, gateway, address, 50 if gone else 3)
            except (requests.ConnectionError, requests.exceptions.ChunkedEncodingError):
                # the killed reader: refused, or its answer cut off by the kill (what that
                # answer held must come again from the survivor: "nothing lost" below)
                continue
            take(answer)
            if not (gone and answer.numbers):
                time.sleep(0.1)  # 503: what Retry-After asks, shortened

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(drain, g) for g in (a, b, survivor)]
        # the kill comes once the reader handed out enough messages longer than UNSAVED
        # ago for the bound below to tell (or before half the backlog is drained)
        wait_until(
            lambda: handed_out_before(time.monotonic() - UNSAVED) > 20 or len(got) > before // 2,
            30,
            what="draining for a while",
        )
        assert reader.process is not None
        killed_at = time.monotonic()
        reader.process.kill()
        reader.process.wait(10)
        killed.set()
        publish(c, survivor, range(before, total))
        for f in futures:
            f.result()
    # nothing lost
    missing = sorted(set(range(total)) - set(got))
    assert missing == [], f"{len(missing)} lost: {missing[:20]}"
    # what came twice was first handed out by the dead reader in its last moments
    twice = [k for k, v in Counter(got).items() if v > 1]
    early = {
        k: round(killed_at - first_seen[k][0], 2)
        for k in twice
        if first_seen[k][1] != reader_id or first_seen[k][0] < killed_at - UNSAVED
    }
    assert early == {}, f"duplicates not from the dead reader's last {UNSAVED} s: {early}"
    # which is a bound: the dead reader had handed out messages before its last UNSAVED s
    old = [k for k, (t, _) in first_seen.items() if t < killed_at - UNSAVED]
    assert len(old) > 20, f"only {len(old)} message(s) handed out early enough to tell"
    # the survivor read everything after the kill, and said "try again" meanwhile
    assert {i for k, (t, i) in first_seen.items() if t > killed_at + 0.5} <= {
        c.instance_of(survivor)
    }
    assert all(
        r.status == 503 and r.fault == "ResourceUnavailableFault" and r.retry_after
        for r in refusals
    ), refusals[:3]
    oldest = max((killed_at - first_seen[k][0] for k in twice), default=0.0)
    print(
        f"kill -9 of the reader: {len(twice)} duplicate(s), the oldest first handed out "
        f"{oldest:.2f} s before the kill; {len(refusals)} retry answer(s)"
    )
