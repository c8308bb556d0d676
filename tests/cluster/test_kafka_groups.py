"""Kafka in cluster mode: an Unsubscribe through the instance that does not deliver leaves
no consumer group behind (docs/scale-out.md, "Kafka and MQTT in cluster mode").

The deliverer of a subscription saves its position in the subscription's consumer group
(``wsnmom.sub.<id>``); the instance the Unsubscribe goes through deletes that group.  The
deliverer follows the Unsubscribe and stops its cursor, and the save that used to follow a
stop made the group again after the delete: an empty group, left for good.  The deliverer
is stopped (SIGSTOP) while the other instance deletes, so that its follow comes after the
delete every time.  A subscription feeding a pull point is read, and its position saved,
by the pull point's reader, and behaves the same way (a DestroyPullPoint is forwarded to
the reader, which deletes the groups itself).

The two tests share one cluster (``shared_cluster``), each on a topic of its own, and
count the positions saved in that topic only (a subscription's group holds a position in
every topic of the cluster).  The deliverer's stop
is shorter than the 10 s lease: it keeps its lease and shards, and the cluster is as
before for the next test."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka.admin import AdminClient

from tests.cluster.conftest import INSTANCE, Cluster
from tests.cluster.test_any_instance import detail_of, n, topic
from tests.cluster.test_pull_owner import get_messages
from tests.fixtures.server import ConsumerServer
from tests.support.waiting import wait_until
from wsnmom.client.model import EndpointReference
from wsnmom.client.resources import Subscription
from wsnmom.testing.gateway import Gateway

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.kafka]

#: the module's cluster: one shard, so one instance delivers everything; a 10 s lease, so
#: that the deliverer stopped for the delete keeps its lease (its position saves are not
#: fenced)
SETTINGS = {"WSNMOM_CLUSTER__SHARDS": "1", "WSNMOM_CLUSTER__LEASE": "10"}


def kept_in_store(g: Groups, name: str) -> int:
    """The offsets kept in the store for the subscription ``name`` on the test's topic
    (the truth in cluster mode on PostgreSQL, ``core.positions_postgres``; the group is
    its mirror), summed as ``saved`` sums them."""
    import psycopg

    level = "." + g.on.rpartition("}")[2]
    with psycopg.connect(g.c.store_url) as conn:
        rows = conn.execute(
            "SELECT stream, position FROM wsnmom_positions WHERE name = %s", (name,)
        ).fetchall()
    return sum(
        int(o)
        for stream, o in rows
        if stream.startswith(g.topic_prefix) and stream.endswith(level) and o > 0
    )


def groups(admin: AdminClient, prefix: str) -> set[str]:
    """The consumer groups on the broker whose names start with ``prefix``."""
    found = admin.list_consumer_groups(request_timeout=10).result()
    return {g.group_id for g in found.valid if g.group_id.startswith(prefix)}


def saved(admin: AdminClient, group: str, kafka_topic_prefix: str, on: str = "") -> int:
    """The offsets saved in ``group`` for the cluster's own topics, summed (records of a
    topic that starts at offset 0 that the group's subscription settled); ``on``: only
    for the Kafka topic of that WS topic (a group holds a position in every topic of the
    cluster: records of other topics are settled too, as not the subscription's)."""
    request = [ConsumerGroupTopicPartitions(group)]
    answer = admin.list_consumer_group_offsets(request, request_timeout=10)[group].result()
    level = "." + on.rpartition("}")[2] if on else ""
    return sum(
        tp.offset
        for tp in answer.topic_partitions or []
        if tp.topic.startswith(kafka_topic_prefix) and tp.topic.endswith(level) and tp.offset > 0
    )


@dataclass
class Groups:
    """The module's cluster (``c``) on a topic of the test's own (``on``), its consumer,
    an admin client of the broker, and the prefixes of the cluster's consumer groups and
    topics."""

    c: Cluster
    consumer: ConsumerServer
    admin: AdminClient
    on: str
    group_prefix: str
    topic_prefix: str


def groups_on(
    shared_cluster: Callable[..., Cluster], consumer: ConsumerServer, bootstrap: str, name: str
) -> Groups:
    c = shared_cluster(2, **SETTINGS)
    query = parse_qs(urlsplit(c.gateways[0].adapter_url).query)
    (group_prefix,) = query["group_prefix"]
    (topic_prefix,) = query["topic_prefix"]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return Groups(c, consumer, admin, topic(name), group_prefix, topic_prefix)


def sentinel(g: Groups, deliverer: Gateway, other: Gateway, kept_group: str, number: int) -> None:
    """Wait until the deliverer saved the kept subscription's position past ``number``,
    published now on the topic: the commit thread saves in passes, one after the other,
    so a save it was asked for before has landed by then.  The kept subscription must still be
    delivered by ``deliverer`` (it kept its lease through the stop)."""
    g.c.client(other).notify(n(number), g.on)
    mark = f">{number}<".encode()
    got = wait_until(
        lambda: [r for r in g.consumer.notifies() if r.path == "/kept" and mark in r.body],
        20,
        what=f"the kept subscription's copy of {number}",
    )
    assert got[0].headers[INSTANCE] == g.c.instance_of(deliverer)
    wait_until(
        lambda: saved(g.admin, kept_group, g.topic_prefix, g.on) == number,
        20,
        what=f"the kept subscription's position after {number}, saved by the deliverer",
    )


def unsubscribe_while_the_deliverer_is_held(
    g: Groups, deliverer: Gateway, other: Gateway, gone: Subscription, kept: Subscription
) -> None:
    """``gone`` (whose position the deliverer saved) unsubscribed through ``other``
    while the deliverer is stopped (SIGSTOP, shorter than its lease), so that its follow
    comes after the delete; then no consumer group of ``gone`` may be left, and ``kept``'s
    is still there (the listing does show groups)."""
    group = g.group_prefix + gone.id
    assert deliverer.process is not None
    os.kill(deliverer.process.pid, signal.SIGSTOP)
    try:
        wo = g.c.client(other)
        wo.subscription(EndpointReference(g.c.via(other, gone.address))).unsubscribe()
        wait_until(lambda: group not in groups(g.admin, g.group_prefix), 10, what="the delete")
    finally:
        os.kill(deliverer.process.pid, signal.SIGCONT)
    wait_until(lambda: detail_of(deliverer, gone.id) is None, 10, what="the deliverer following")
    sentinel(g, deliverer, other, g.group_prefix + kept.id, 2)
    wait_until(
        lambda: group not in groups(g.admin, g.group_prefix),
        10,
        what=f"no consumer group of the unsubscribed subscription ({group})",
    )
    assert g.group_prefix + kept.id in groups(g.admin, g.group_prefix)


@pytest.mark.parametrize("middleware", ["kafka"], indirect=True)
def test_an_unsubscribe_through_the_other_instance_leaves_no_consumer_group(
    shared_cluster: Callable[..., Cluster], consumer: ConsumerServer, kafka_bootstrap: str
) -> None:
    g = groups_on(shared_cluster, consumer, kafka_bootstrap, "groups-unsubscribe")
    c, on = g.c, g.on
    a, b = c.gateways
    wa = c.client(a)
    gone = wa.subscribe(consumer.address("/gone"), on)
    kept = wa.subscribe(consumer.address("/kept"), on)
    wa.notify(n(1), on)
    firsts = wait_until(
        lambda: (lambda got: got if {r.path for r in got} == {"/gone", "/kept"} else None)(
            consumer.notifies()
        ),
        20,
        what="the first message at both subscriptions",
    )
    deliverer, other = (a, b) if firsts[0].headers[INSTANCE] == c.instance_of(a) else (b, a)
    # the deliverer saved where the subscription is (its position moved with the ack)
    group = g.group_prefix + gone.id
    wait_until(
        lambda: saved(g.admin, group, g.topic_prefix, on) == 1, 20, what="gone's saved position"
    )
    # kept in the store first, the group written after it
    assert kept_in_store(g, gone.id) == 1
    unsubscribe_while_the_deliverer_is_held(g, deliverer, other, gone, kept)
    # nor any position of it in the store
    wait_until(
        lambda: kept_in_store(g, gone.id) == 0, 10, what="no kept position of the unsubscribed"
    )


@pytest.mark.parametrize("middleware", ["kafka"], indirect=True)
def test_a_pull_points_feed_unsubscribed_through_the_other_instance_leaves_no_group(
    shared_cluster: Callable[..., Cluster], consumer: ConsumerServer, kafka_bootstrap: str
) -> None:
    # a subscription feeding a pull point is read by the pull point's reader (one shard:
    # the deliverer), which saves its position; its Unsubscribe is not forwarded
    g = groups_on(shared_cluster, consumer, kafka_bootstrap, "groups-feed")
    c, on = g.c, g.on
    a, b = c.gateways
    wa = c.client(a)
    address = wa.create_pull_point().reference.address
    feeding = wa.subscribe(EndpointReference(address), on)
    kept = wa.subscribe(consumer.address("/kept"), on)
    wa.notify(n(1), on)
    first = wait_until(
        lambda: [r for r in consumer.notifies() if r.path == "/kept"], 20, what="kept's 1"
    )
    deliverer, other = (a, b) if first[0].headers[INSTANCE] == c.instance_of(a) else (b, a)
    handed = wait_until(
        lambda: get_messages(c, other, address, 10).numbers, 20, what="the pull point's 1"
    )
    assert handed == [1]
    # the reader saved where the feed is (it handed the record out)
    group = g.group_prefix + feeding.id
    wait_until(
        lambda: saved(g.admin, group, g.topic_prefix, on) == 1, 20, what="the feed's position"
    )
    unsubscribe_while_the_deliverer_is_held(g, deliverer, other, feeding, kept)
