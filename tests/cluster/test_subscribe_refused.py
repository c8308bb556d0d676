"""A Subscribe the middleware refuses leaves no subscription behind on any instance
(session 8, P7): the client was told "no", so nothing may exist afterwards, neither in
the store (another instance would follow it and deliver a subscription without a queue)
nor in any instance's admin API; and the client's retry once the middleware accepts
again makes exactly one subscription.  The refused subscription's record is never even
written: the durable subscription is made before it (no other instance then follows a
subscription whose queue is not, or not yet, made).

The refusal is deterministic: the cluster runs in a vhost of its own whose queue limit
(``max-queues``) is set to the queues the instances declared at start, so RabbitMQ
refuses the declaration of the new subscription's queue.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
import pytest
import requests

from tests.cluster.conftest import Cluster
from tests.fixtures.brokers import RabbitNode
from tests.fixtures.server import ConsumerServer
from tests.support.waiting import wait_until
from wsnmom.client.errors import SubscribeCreationFailedFault, WsnFault
from wsnmom.testing.gateway import Gateway

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.rabbitmq]

TOPIC = "{urn:cluster}refused"


@pytest.fixture
def vhost(rabbitmq_broker: Any) -> Iterator[tuple[RabbitNode, str]]:
    """A vhost of the test's own on the session's node (its queue limit is changed)."""
    node = rabbitmq_broker.node
    if not isinstance(node, RabbitNode):
        pytest.skip(f"RabbitMQ comes from {rabbitmq_broker.source}: cannot add a vhost")
    name = node.fresh_vhost()
    try:
        yield node, name
    finally:
        with contextlib.suppress(Exception):
            node.rabbitmqctl_in_background("delete_vhost", name)


@pytest.fixture
def rabbitmq_url(rabbitmq_url: str, vhost: tuple[RabbitNode, str]) -> str:
    """The cluster's AMQP URL: the session's broker, the test's vhost."""
    parts = urlsplit(rabbitmq_url)
    return urlunsplit(parts._replace(path="/" + quote(vhost[1], safe="")))


def _queues(node: RabbitNode, name: str) -> int:
    out = node.rabbitmqctl("list_queues", "-p", name, "name", "--silent")
    return len([line for line in out.splitlines() if line.strip()])


def _limit(node: RabbitNode, name: str, queues: int) -> None:
    node.rabbitmqctl("set_vhost_limits", "-p", name, json.dumps({"max-queues": queues}))


def _subscription_changes(store_url: str) -> int:
    """Rows of the store's change log about subscriptions (every insert, update, delete)."""
    with psycopg.connect(store_url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM wsnmom_changes WHERE kind = 'subscription'")
        return int(row.fetchone()[0])  # type: ignore[index]


def _ids(gateway: Gateway) -> set[str]:
    url = gateway.base_url + "/wsn/admin/api/subscriptions"
    return {s["id"] for s in requests.get(url, timeout=10).json()["subscriptions"]}


def test_a_refused_subscribe_leaves_no_subscription_on_any_instance(
    cluster: Callable[..., Cluster], consumer: ConsumerServer, vhost: tuple[RabbitNode, str]
) -> None:
    node, name = vhost
    # one shard: b delivers every push subscription, so it follows a's Subscribes
    c = cluster(2, WSNMOM_CLUSTER__SHARDS="1")
    a, b = c.gateways
    wa = c.client(a)
    # a sentinel made before the limit: each instance's admin API shows it once followed
    sentinel = wa.subscribe(consumer.address("/sentinel"), TOPIC)
    sentinel_id = sentinel.id
    for g in (a, b):
        wait_until(lambda g=g: sentinel_id in _ids(g), 30, what="the sentinel everywhere")
    _limit(node, name, _queues(node, name))
    changes = _subscription_changes(c.store_url)
    with pytest.raises(WsnFault) as refused:
        wa.subscribe(consumer.address("/refused"), TOPIC)
    assert "queue limit" in str(refused.value), refused.value
    assert isinstance(refused.value, SubscribeCreationFailedFault), refused.value
    # the queue is declared before the record is stored: a refused one was never in the
    # store, so no instance followed it (and could declare its queue after the refusal)
    assert _subscription_changes(c.store_url) == changes
    # a second sentinel, made through b once the limit is lifted, is followed after the
    # refused one's record would have been: once a shows it, a's change log is read past
    _limit(node, name, -1)
    later = c.client(b).subscribe(consumer.address("/later"), TOPIC)
    later_id = later.id
    for g in (a, b):
        wait_until(lambda g=g: later_id in _ids(g), 30, what="the second sentinel everywhere")
        assert _ids(g) == {sentinel_id, later_id}, g.base_url
    # the client's retry makes exactly one subscription
    retry = wa.subscribe(consumer.address("/refused"), TOPIC)
    retry_id = retry.id
    for g in (a, b):
        wait_until(lambda g=g: retry_id in _ids(g), 30, what="the retry everywhere")
        assert _ids(g) == {sentinel_id, later_id, retry_id}, g.base_url
