"""Gateways killed (SIGKILL) between the middleware's side of a subscription and its
record leave orphans no record names: on RabbitMQ a quorum queue bound to the exchange, on
Kafka the subscription's consumer group with its saved positions.  Two windows:

* a Subscribe killed after it made the durable subscription, before it stored the record:
  the intent it stored first names the orphan;
* an Unsubscribe killed after it deleted the record, before the middleware's delete: the
  record's delete stored an intent of it in the same write.

The orphan sweep of the instance left (the cluster's leader once the killed ones' leases
ran out) deletes both after the grace (``core.orphans``,
docs/operations.md#orphan-durable-subscriptions).  A subscription whose record exists
keeps delivering, and a removal that finishes leaves no intent.

The kills come from tests/support/killpoint/sitecustomize.py, a fault-injection point that
exists only in the tests: the killed instances run with it on their ``PYTHONPATH``.  One
cluster of three covers both windows, swept in the same grace."""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import psycopg
import pytest
from confluent_kafka.admin import AdminClient

from tests.cluster.conftest import INSTANCE, Cluster
from tests.cluster.test_any_instance import n, topic
from tests.cluster.test_kafka_groups import groups
from tests.fixtures.server import ConsumerServer
from tests.support.rabbitmq_queues import queue_exists
from tests.support.waiting import wait_until
from wsnmom.client.errors import TransportError
from wsnmom.client.model import EndpointReference
from wsnmom.testing.gateway import Gateway

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TOPIC = topic("orphans")
KILLPOINT = Path(__file__).parent.parent / "support" / "killpoint"
#: seconds an intent may wait for its record: the test waits it out once (as long as the
#: 3 s lease a killed leader's successor waits out); the live subscription's Subscribe
#: must take less (a quorum queue's declaration took 15 ms at load 20, a store write a
#: few ms; this test's Subscribes 0.03-0.11 s at load 11, on both middlewares), or its
#: intent is swept and it is refused.  The sweep's wait: 5.1-5.4 s with 5, 3.5 s with 3
GRACE = "3"


def _killed_here(i: int) -> dict[str, str]:
    """Instances 0 and 1 die storing the record of a subscription to ``/killme``, or just
    after deleting the record of a subscription to ``/doomed`` (its Unsubscribe);
    instance 2 lives."""
    if i > 1:
        return {}
    path = os.pathsep.join(p for p in (str(KILLPOINT), os.environ.get("PYTHONPATH", "")) if p)
    return {
        "PYTHONPATH": path,
        "KILLPOINT_BEFORE_STORE": "/killme",
        "KILLPOINT_AFTER_DELETE": "/doomed",
    }


def _intents(store_url: str) -> list[str]:
    with psycopg.connect(store_url, autocommit=True) as conn:
        return [str(r[0]) for r in conn.execute("SELECT name FROM wsnmom_intents")]


def _stored(store_url: str, sub_id: str) -> bool:
    with psycopg.connect(store_url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM subscriptions WHERE id = %s", (sub_id,))
        return bool(row.fetchone()[0])  # type: ignore[index]


class _Orphans:
    """Whether a durable subscription exists on the test's middleware."""

    def __init__(self, c: Cluster, middleware: str, request: pytest.FixtureRequest) -> None:
        self.middleware = middleware
        if middleware == "rabbitmq":
            self.amqp_url = str(request.getfixturevalue("rabbitmq_url"))
        else:
            (self.prefix,) = parse_qs(urlsplit(c.gateways[0].adapter_url).query)["group_prefix"]
            bootstrap = str(request.getfixturevalue("kafka_bootstrap"))
            self.admin = AdminClient({"bootstrap.servers": bootstrap})

    def exists(self, name: str) -> bool:
        if self.middleware == "rabbitmq":
            return queue_exists(self.amqp_url, "wsnmom.sub." + name)
        return self.prefix + name in groups(self.admin, self.prefix)

    def gone(self, name: str) -> bool:
        return not self.exists(name)


def _on(c: Cluster, gateway: Gateway, ref: EndpointReference) -> EndpointReference:
    """``ref`` (at the public URL, which no load balancer serves here) sent to ``gateway``."""
    return EndpointReference(c.via(gateway, ref.address), ref.reference_parameters)


def _killed(gateway: Gateway) -> None:
    process = gateway.process
    assert process is not None
    assert wait_until(process.poll, 30, what="the killed instance's end") == -9


@pytest.mark.parametrize(
    "middleware",
    [
        pytest.param("rabbitmq", marks=pytest.mark.rabbitmq),
        pytest.param("kafka", marks=pytest.mark.kafka),
    ],
    indirect=True,
)
def test_gateways_killed_between_middleware_and_record_leave_orphans_the_sweep_removes(
    cluster: Callable[..., Cluster],
    consumer: ConsumerServer,
    middleware: str,
    request: pytest.FixtureRequest,
) -> None:
    """Both windows in one cluster, swept in one grace: a Subscribe killed after its
    declaration, before its record (instance ``a``), and an Unsubscribe killed after the
    record's delete, before the middleware's (instance ``b``, the deliverer); the third
    instance sweeps both."""
    # one shard: one instance delivers every subscription, an instance killed or the
    # one started first (a deliverer that follows a delete deletes a RabbitMQ queue it
    # declared itself: the killed Unsubscribe's deliverer must be the killed instance)
    c = cluster(
        3,
        instance_env=_killed_here,
        WSNMOM_CLUSTER__SHARDS="1",
        WSNMOM_TERMINATION__ORPHAN_GRACE=GRACE,
        WSNMOM_TERMINATION__ORPHAN_SWEEP_INTERVAL="0.5",
    )
    live = c.gateways[2]
    wl = c.client(live)
    orphans = _Orphans(c, middleware, request)
    # a live subscription, delivering (on Kafka its topic exists from now on, so a group
    # made later saves a position for it when it is made)
    kept = wl.subscribe(consumer.address("/kept"), TOPIC)
    wl.notify(n(1), TOPIC)
    (first,) = wait_until(
        lambda: [r for r in consumer.notifies() if r.path == "/kept"], 30, what="kept's 1"
    )
    by_id = {f"g{i}": g for i, g in enumerate(c.gateways)}
    deliverer = by_id[first.headers[INSTANCE]]
    assert deliverer is not live, "the instance started last took the only shard"
    (a,) = [g for g in c.gateways[:2] if g is not deliverer]
    b = deliverer
    doomed = c.client(b).subscribe(consumer.address("/doomed"), TOPIC)
    # a removal that finishes leaves no intent
    plain = wl.subscribe(consumer.address("/plain"), TOPIC)
    wl.unsubscribe(_on(c, live, plain.reference))
    pull_point = wl.create_pull_point()
    wl.destroy_pull_point(_on(c, live, pull_point.reference))
    assert _intents(c.store_url) == []
    # the kills, each orphan seen at once (the sweep may take it from the grace on):
    # declared, no record (on Kafka: its group, with positions)
    with pytest.raises(TransportError, match="closed connection"):
        c.client(a).subscribe(consumer.address("/killme"), TOPIC)
    _killed(a)
    (made,) = _intents(c.store_url)
    assert made != kept.id and not _stored(c.store_url, made)
    wait_until(partial(orphans.exists, made), 30, what="the killed Subscribe's orphan")
    with pytest.raises(TransportError, match="closed connection"):
        c.client(b).unsubscribe(_on(c, b, doomed.reference))
    _killed(b)
    assert sorted(_intents(c.store_url)) == sorted([made, doomed.id])
    assert not _stored(c.store_url, doomed.id)
    wait_until(partial(orphans.exists, doomed.id), 30, what="the killed Unsubscribe's orphan")
    for orphan in (made, doomed.id):
        wait_until(partial(orphans.gone, orphan), 90, what=f"the sweep of {orphan}")
    wait_until(lambda: not _intents(c.store_url), 30, what="the intents' removal")
    log = live.log_path.read_text(errors="replace")
    for orphan in (made, doomed.id):
        assert log.count(f"removed the orphan durable subscription {orphan}") == 1, orphan
    # the live subscription was left alone: a notification published now reaches it
    wl.notify(n(2), TOPIC)
    wait_until(
        lambda: [r for r in consumer.notifies() if r.path == "/kept" and b">2<" in r.body],
        30,
        what="kept's 2 after the sweep",
    )
    assert orphans.exists(kept.id)
