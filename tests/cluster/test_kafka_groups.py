"""Kafka in cluster mode: an Unsubscribe through the instance that does not deliver leaves
no consumer group behind (docs/scale-out.md, "Kafka and MQTT in cluster mode").

The deliverer of a subscription saves its position in the subscription's consumer group
(``wsnmom.sub.<id>``); the instance the Unsubscribe goes through deletes that group.  The
deliverer follows the Unsubscribe and stops its cursor, and the save that used to follow a
stop made the group again after the delete: an empty group, left for good.  The deliverer
is stopped (SIGSTOP) while the other instance deletes, so that its follow comes after the
delete every time."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from urllib.parse import parse_qs, urlsplit

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka.admin import AdminClient

from tests.cluster.conftest import INSTANCE, Cluster
from tests.cluster.test_any_instance import detail_of, n, topic
from tests.fixtures.server import ConsumerServer
from tests.support.waiting import wait_until
from wsnmom.client.model import EndpointReference

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.kafka]

TOPIC = topic("groups")


def groups(admin: AdminClient, prefix: str) -> set[str]:
    """The consumer groups on the broker whose names start with ``prefix``."""
    found = admin.list_consumer_groups(request_timeout=10).result()
    return {g.group_id for g in found.valid if g.group_id.startswith(prefix)}


def saved(admin: AdminClient, group: str, kafka_topic_prefix: str) -> int:
    """The offsets saved in ``group`` for the cluster's own topics, summed (records of a
    topic that starts at offset 0 that the group's subscription settled)."""
    request = [ConsumerGroupTopicPartitions(group)]
    answer = admin.list_consumer_group_offsets(request, request_timeout=10)[group].result()
    return sum(
        tp.offset
        for tp in answer.topic_partitions or []
        if tp.topic.startswith(kafka_topic_prefix) and tp.offset > 0
    )


@pytest.mark.parametrize("middleware", ["kafka"], indirect=True)
def test_an_unsubscribe_through_the_other_instance_leaves_no_consumer_group(
    cluster: Callable[..., Cluster], consumer: ConsumerServer, kafka_bootstrap: str
) -> None:
    # one shard: one instance delivers everything; a 10 s lease, so that the deliverer
    # stopped for the delete keeps its lease (its position saves are not fenced)
    c = cluster(2, WSNMOM_CLUSTER__SHARDS="1", WSNMOM_CLUSTER__LEASE="10")
    a, b = c.gateways
    query = parse_qs(urlsplit(a.adapter_url).query)
    (group_prefix,) = query["group_prefix"]
    (topic_prefix,) = query["topic_prefix"]
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    wa = c.client(a)
    gone = wa.subscribe(consumer.address("/gone"), TOPIC)
    kept = wa.subscribe(consumer.address("/kept"), TOPIC)
    wa.notify(n(1), TOPIC)
    firsts = wait_until(
        lambda: (lambda got: got if {r.path for r in got} == {"/gone", "/kept"} else None)(
            consumer.notifies()
        ),
        20,
        what="the first message at both subscriptions",
    )
    deliverer_id = firsts[0].headers[INSTANCE]
    deliverer, other = (a, b) if deliverer_id == c.instance_of(a) else (b, a)
    group = group_prefix + gone.id
    # the deliverer saved where the subscription is (its position moved with the ack)
    wait_until(lambda: saved(admin, group, topic_prefix) == 1, 20, what="gone's saved position")
    assert deliverer.process is not None
    os.kill(deliverer.process.pid, signal.SIGSTOP)
    try:
        wo = c.client(other)
        wo.subscription(EndpointReference(c.via(other, gone.address))).unsubscribe()
        wait_until(lambda: group not in groups(admin, group_prefix), 10, what="the delete")
    finally:
        os.kill(deliverer.process.pid, signal.SIGCONT)
    wait_until(lambda: detail_of(deliverer, gone.id) is None, 10, what="the deliverer following")
    # the sentinel: a position of the kept subscription the deliverer saved after it
    # followed the Unsubscribe (the commit thread saves in passes, one after the other:
    # a save the stop asked for has landed by then)
    c.client(other).notify(n(2), TOPIC)
    second = wait_until(
        lambda: [r for r in consumer.notifies() if r.path == "/kept" and b">2<" in r.body],
        20,
        what="the kept subscription's copy of 2",
    )
    # still delivered by the same instance: it kept its lease through the stop
    assert second[0].headers[INSTANCE] == deliverer_id
    wait_until(
        lambda: saved(admin, group_prefix + kept.id, topic_prefix) == 2,
        20,
        what="the kept subscription's position after 2, saved by the deliverer",
    )
    wait_until(
        lambda: group not in groups(admin, group_prefix),
        10,
        what=f"no consumer group of the unsubscribed subscription ({group})",
    )
    # the kept subscription's group is still there (the listing does show groups)
    assert group_prefix + kept.id in groups(admin, group_prefix)
