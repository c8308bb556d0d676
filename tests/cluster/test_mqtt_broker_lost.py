"""MQTT cluster mode after the broker lost its state (docs/scale-out.md, "MQTT in cluster
mode"): Mosquitto restarted without its persistence file has neither the subscription
sessions nor their retained records.  The store still holds the subscription, so its
deliverer makes the session and its record again, without a gateway restart, as a single
instance subscribes its filters again (messages published while the broker had no
session are lost).  A subscription deleted through another instance is never made again
(the adapter-level tests of the deletion race: tests/adapters/test_mqtt_cluster_lost.py).

Each test runs its own Mosquitto (``mosquitto_factory``), whose state it wipes."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from tests.cluster.conftest import Cluster
from tests.cluster.test_failover import numbers
from tests.fixtures.mosquitto import MosquittoNode
from tests.fixtures.server import ConsumerServer
from tests.support.waiting import wait_until
from wsnmom.client.errors import ClientError

pytestmark = [pytest.mark.mqtt, pytest.mark.e2e, pytest.mark.slow]

TOPIC = "{urn:cluster}broker-lost"


@pytest.fixture
def private_mosquitto(mosquitto_factory: Callable[..., MosquittoNode]) -> MosquittoNode:
    """A Mosquitto of this test's own (its state is wiped)."""
    return mosquitto_factory()


@pytest.fixture
def mqtt_url(private_mosquitto: MosquittoNode) -> str:
    """The cluster's broker: this test's own (``cluster`` reads ``mqtt_url``)."""
    return private_mosquitto.url


@pytest.mark.parametrize("middleware", ["mqtt"], indirect=True)
def test_delivery_resumes_after_the_broker_lost_every_session_and_record(
    cluster: Callable[..., Cluster],
    private_mosquitto: MosquittoNode,
    consumer: ConsumerServer,
) -> None:
    # one shard: no shard moves to the instance that started second (a moved shard
    # re-attaches its subscriptions, which makes a session found gone again)
    c = cluster(2, WSNMOM_CLUSTER__SHARDS="1")
    a, b = c.gateways
    c.client(a).subscribe(consumer.address(), TOPIC)
    c.client(b).notify("<n>0</n>", TOPIC)
    wait_until(lambda: 0 in numbers(consumer), 30, what="a delivery before the broker's loss")

    private_mosquitto.restart_empty()

    # what is published before the deliverer made the session again is lost (as on a
    # single instance): publish a new number at every check until one arrives
    counter = itertools.count(1)
    published: list[int] = []

    def delivered_after_loss() -> bool:
        n = next(counter)
        try:
            c.client(b if n % 2 else a).notify(f"<n>{n}</n>", TOPIC)
            published.append(n)
        except ClientError:
            pass  # the gateway's publisher is not back yet (503)
        return bool(numbers(consumer) - {0})

    wait_until(
        delivered_after_loss,
        60,
        what="a delivery of a message published after the broker lost its state",
    )
    # and delivery goes on: a message published now arrives
    c.client(a).notify("<n>1000000</n>", TOPIC)
    wait_until(lambda: 1000000 in numbers(consumer), 30, what="a later delivery")
    assert numbers(consumer) - {0, 1000000} <= set(published)
