"""The position fence of a pull point's feed in cluster mode (Kafka: core buffers pull
points): a feed is read by the instance reading its pull point (the pull point's shard,
``core.pull_owners``), which in general does not hold the feed's own shard.  Core's
fence (``Adapter.shared_by_instances``) must let that reader save the feed's position:
after a kill -9 of the reader, the next reader hands out again at most what the dead one
handed out in its last moments (``UNSAVED``), never the whole feed from an old position."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from confluent_kafka.admin import AdminClient
from wsnmom.adapters.mqtt.cluster_handle import session_client_id
from wsnmom.core.coordination import shard_of

from tests.adapters.test_mqtt_cluster import session_present
from tests.cluster.conftest import MQTT, Cluster
from tests.cluster.test_kafka_groups import saved
from tests.cluster.test_operate import status
from tests.cluster.test_pull_owner import KAFKA, TOPIC, UNSAVED, Answer, get_messages, publish
from tests.support.waiting import wait_until
from wsnmom.client.model import EndpointReference
from wsnmom.testing.gateway import Gateway

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

#: two shards over two instances: one each, so a feed on the other shard than its pull
#: point's is held by the instance that does not read the pull point
SHARDS = 2
#: the clusters' lease (``WSNMOM_CLUSTER__LEASE`` of tests/cluster/conftest.py)
LEASE = 3.0


def split_feed(c: Cluster, gateway: Gateway, pull_point_id: str, address: str) -> str:
    """A subscription on TOPIC feeding the pull point whose shard is not the pull
    point's, made through ``gateway`` (others made on the way are unsubscribed); its id."""
    client = c.client(gateway)
    for _ in range(40):
        sub = client.subscribe(EndpointReference(address), TOPIC)
        if shard_of(sub.id, SHARDS) != shard_of(pull_point_id, SHARDS):
            return sub.id
        client.unsubscribe(c.via(gateway, sub.reference.address))
    raise AssertionError("no subscription id on the other shard in 40 tries")


@dataclass(frozen=True, slots=True)
class Split:
    """A pull point and its one feed on the other instance's shard."""

    reader: Gateway
    survivor: Gateway
    reader_id: str
    address: str
    feed_id: str


def split(c: Cluster) -> Split:
    """One shard on each of ``c``'s two instances, a pull point, and a feed of it whose
    shard the other instance holds."""
    a, b = c.gateways
    held = wait_until(
        lambda: (lambda v: v if sorted(len(i["shards"]) for i in v) == [1, 1] else None)(
            status(a)["instances"]
        ),
        30,
        what="one shard held by each instance",
    )
    holder = {s: i["id"] for i in held for s in i["shards"]}
    pull_point = c.client(a).create_pull_point()
    address = pull_point.reference.address
    reader_id = holder[shard_of(pull_point.id, SHARDS)]
    reader, survivor = (a, b) if reader_id == c.instance_of(a) else (b, a)
    # made through the instance that holds the feed's shard and does not read the pull
    # point: made through the reader, the duplicates did not show even with the fence on
    # the feed's own shard (2 of 2 runs; why is not established)
    feed_id = split_feed(c, survivor, pull_point.id, address)
    # the feed's shard and the pull point's are held by different instances
    assert holder[shard_of(feed_id, SHARDS)] != reader_id
    return Split(reader, survivor, reader_id, address, feed_id)


@pytest.mark.parametrize("middleware", KAFKA, indirect=True)
def test_the_reader_saves_the_position_of_a_feed_on_another_instances_shard(
    cluster: Callable[..., Cluster], kafka_bootstrap: str
) -> None:
    c = cluster(2, WSNMOM_CLUSTER__SHARDS=str(SHARDS))
    a, b = c.gateways
    sp = split(c)
    reader, survivor, reader_id, address = sp.reader, sp.survivor, sp.reader_id, sp.address
    count = 200
    publish(c, b, range(count))
    got: list[int] = []
    deadline = time.monotonic() + 60
    while len(set(got)) < count and time.monotonic() < deadline:
        answer = get_messages(c, a, address, 50)
        assert answer.status == 200, answer
        got.extend(answer.numbers)
        assert answer.instance == reader_id
    assert sorted(got) == list(range(count))
    # the reader saves the feed's position past everything it handed out (in the feed's
    # consumer group, within UNSAVED: its next save), then the kill; without the fence's
    # leave to save a feed on another instance's shard the position stays behind
    query = parse_qs(urlsplit(reader.adapter_url).query)
    group = query["group_prefix"][0] + sp.feed_id
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    wait_until(
        lambda: saved(admin, group, query["topic_prefix"][0], TOPIC) == count,
        UNSAVED + 10,
        what="the feed's position saved past every message handed out",
    )
    assert reader.process is not None
    reader.process.kill()
    reader.process.wait(10)
    # a sentinel after the kill: the survivor hands out whatever the feed gives it up to
    # the sentinel (it reads the pull point once it took the dead reader's shard)
    publish(c, survivor, range(count, count + 1))
    after: list[int] = []
    refusals: list[Answer] = []

    def sentinel() -> bool:
        try:
            answer = get_messages(c, survivor, address, 50)
        except requests.ConnectionError:
            return False
        if answer.status != 200:
            refusals.append(answer)
            return False
        after.extend(answer.numbers)
        return count in after

    wait_until(sentinel, 60, what="the sentinel at the survivor")
    again = sorted(set(after) & set(got))
    assert again == [], f"{len(again)} message(s) handed out again after the kill: {again[:20]}"
    assert Counter(after)[count] == 1
    assert all(r.status == 503 for r in refusals), refusals[:3]


@pytest.mark.parametrize("middleware", [MQTT], indirect=True)
def test_the_reader_reconnects_a_feed_on_another_instances_shard(
    cluster: Callable[..., Cluster],
) -> None:
    """MQTT cluster mode: the reader's connection of the feed's session is cut (a client
    taking the session's client id, which keeps the session and leaves what it was sent
    unacknowledged): the reader reconnects it, and the pull point receives what is
    published after."""
    c = cluster(2, WSNMOM_CLUSTER__SHARDS=str(SHARDS))
    sp = split(c)
    # past the grace of a shard handed back cleanly when the second instance joined (the
    # fence passes for it until that lease would have ended)
    spread_at = time.monotonic()
    wait_until(lambda: time.monotonic() - spread_at > LEASE + 1, 10, what="the grace")
    first = range(20)
    publish(c, sp.survivor, first)
    got: list[int] = []

    def drained(numbers: range) -> bool:
        answer = get_messages(c, sp.survivor, sp.address, 50)
        assert answer.status == 200, answer
        assert not answer.numbers or answer.instance == sp.reader_id
        got.extend(answer.numbers)
        return set(numbers) <= set(got)

    wait_until(lambda: drained(first), 30, what="the messages before the cut")
    url = sp.reader.adapter_url
    (prefix,) = parse_qs(urlsplit(url).query)["topic_prefix"]
    # the reader's connection is cut off; the session stays (expiry 600 s)
    assert session_present(url.split("?")[0], session_client_id(prefix, sp.feed_id), 600)
    after = range(20, 40)
    publish(c, sp.survivor, after)
    wait_until(lambda: drained(after), 30, what="the messages published after the cut")
    assert sorted(set(got)) == list(range(40))
