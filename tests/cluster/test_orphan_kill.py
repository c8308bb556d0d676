"""A gateway killed (SIGKILL) after it made a new subscription's durable subscription and
before it stored the record leaves an orphan no record names: on RabbitMQ a quorum queue
bound to the exchange, on Kafka the subscription's consumer group with its saved
positions.  The intent it stored first names it, and the orphan sweep of the instance
left (the cluster's leader once the killed one's lease ran out) deletes it after the
grace (``core.orphans``, docs/operations.md#orphan-durable-subscriptions).  A
subscription whose record exists keeps delivering.

The kill comes from tests/support/killpoint/sitecustomize.py, a fault-injection point that
exists only in the tests: the killed instance runs with it on its ``PYTHONPATH``."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import psycopg
import pytest
from confluent_kafka.admin import AdminClient

from tests.cluster.conftest import Cluster
from tests.cluster.test_any_instance import n, topic
from tests.cluster.test_kafka_groups import groups
from tests.core.test_orphan_intents import queue_exists
from tests.fixtures.server import ConsumerServer
from tests.support.waiting import wait_until
from wsnmom.client.errors import TransportError

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TOPIC = topic("orphans")
KILLPOINT = Path(__file__).parent.parent / "support" / "killpoint"
#: seconds an intent may wait for its record: the test waits it out once; the live
#: subscription's Subscribe must take less (a quorum queue's declaration took 15 ms at
#: load 20, a store write a few ms), or its intent is swept and it is refused
GRACE = "10"


def _killed_here(i: int) -> dict[str, str]:
    """Instance 0 dies storing the record of a subscription to ``/killme``."""
    if i:
        return {}
    path = os.pathsep.join(p for p in (str(KILLPOINT), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "KILLPOINT_BEFORE_STORE": "/killme"}


def _intents(store_url: str) -> list[str]:
    with psycopg.connect(store_url, autocommit=True) as conn:
        return [str(r[0]) for r in conn.execute("SELECT name FROM wsnmom_intents")]


def _stored(store_url: str, sub_id: str) -> bool:
    with psycopg.connect(store_url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM subscriptions WHERE id = %s", (sub_id,))
        return bool(row.fetchone()[0])  # type: ignore[index]


@pytest.mark.parametrize(
    "middleware",
    [
        pytest.param("rabbitmq", marks=pytest.mark.rabbitmq),
        pytest.param("kafka", marks=pytest.mark.kafka),
    ],
    indirect=True,
)
def test_a_gateway_killed_between_declaring_and_storing_leaves_an_orphan_the_sweep_removes(
    cluster: Callable[..., Cluster],
    consumer: ConsumerServer,
    middleware: str,
    request: pytest.FixtureRequest,
) -> None:
    c = cluster(
        2,
        instance_env=_killed_here,
        WSNMOM_TERMINATION__ORPHAN_GRACE=GRACE,
        WSNMOM_TERMINATION__ORPHAN_SWEEP_INTERVAL="0.5",
    )
    a, b = c.gateways
    wb = c.client(b)
    # a live subscription, delivering (on Kafka its topic exists from now on, so the
    # orphan's group saves a position for it when it is made)
    kept = wb.subscribe(consumer.address("/kept"), TOPIC)
    wb.notify(n(1), TOPIC)
    wait_until(lambda: [r for r in consumer.notifies() if r.path == "/kept"], 30, what="kept's 1")
    with pytest.raises(TransportError, match="closed connection"):
        c.client(a).subscribe(consumer.address("/killme"), TOPIC)
    assert a.process is not None
    assert wait_until(lambda: a.process.poll(), 30, what="the killed instance's end") == -9
    (orphan,) = _intents(c.store_url)
    assert orphan != kept.id and not _stored(c.store_url, orphan)
    if middleware == "rabbitmq":
        amqp_url = str(request.getfixturevalue("rabbitmq_url"))
        queue = "wsnmom.sub." + orphan
        assert queue_exists(amqp_url, queue)  # the orphan: declared, no record
        wait_until(lambda: not queue_exists(amqp_url, queue), 90, what="the sweep of the queue")
    else:
        (group_prefix,) = parse_qs(urlsplit(a.adapter_url).query)["group_prefix"]
        admin = AdminClient({"bootstrap.servers": str(request.getfixturevalue("kafka_bootstrap"))})
        group = group_prefix + orphan
        wait_until(lambda: group in groups(admin, group_prefix), 30, what="the orphan's group")
        wait_until(
            lambda: group not in groups(admin, group_prefix), 90, what="the sweep of the group"
        )
    wait_until(lambda: not _intents(c.store_url), 30, what="the intent's removal")
    swept = [
        line
        for line in b.log_path.read_text(errors="replace").splitlines()
        if f"removed the orphan durable subscription {orphan}" in line
    ]
    assert len(swept) == 1, swept
    # the live subscription was left alone: a notification published now reaches it
    wb.notify(n(2), TOPIC)
    wait_until(
        lambda: [r for r in consumer.notifies() if r.path == "/kept" and b">2<" in r.body],
        30,
        what="kept's 2 after the sweep",
    )
    if middleware == "kafka":
        assert group_prefix + kept.id in groups(admin, group_prefix)
