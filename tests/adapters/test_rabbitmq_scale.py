"""RabbitMQ adapter: many started subscriptions (docs/performance.md, F5), against a real node.

One AMQP connection carries at most ``channel_max`` channels (2,047 with RabbitMQ's
defaults) and every started subscription has a channel of its own, so the adapter spreads
subscriptions over a pool of consuming connections.  A failure pika raises on subscribe
must reach core as an ``AdapterError`` (a SubscribeCreationFailedFault, not an internal
error).
"""

from __future__ import annotations

import collections
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pika
import pika.exceptions
import pytest
from wsnmom.adapters.rabbitmq.adapter import RabbitMQAdapter, RabbitMQSubscription
from wsnmom.core.adapter import (
    AdapterError,
    OutboundMessage,
    Received,
    SubscriptionSpec,
)
from wsnmom.topic_mapping.model import PathPattern, Topic

from tests.support.waiting import wait_until
from wsnmom.testing.conformance import Collector

pytestmark = pytest.mark.rabbitmq


@pytest.fixture
def ns() -> str:
    return f"urn:test:rabbit-scale:{uuid.uuid4().hex}"


def message(topic: Topic, body: bytes) -> OutboundMessage:
    return OutboundMessage(topic=topic, body=body, message_id=uuid.uuid4().hex)


class Counter:
    """An ``on_message`` callback shared by many subscriptions: acks and counts, in all
    and per body."""

    def __init__(self) -> None:
        self.count = 0
        self.bodies: collections.Counter[bytes] = collections.Counter()
        self._cv = threading.Condition()

    def __call__(self, received: Received) -> None:
        received.ack()
        with self._cv:
            self.count += 1
            self.bodies[received.body] += 1
            self._cv.notify_all()

    def wait_for(self, n: int, timeout: float) -> int:
        """The count, once it reached ``n``; fails the test when it did not in time."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while self.count < n:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"{self.count} of {n} message(s) within {timeout:g} s")
                self._cv.wait(remaining)
            return self.count


def test_more_started_subscriptions_than_one_connection_has_channels(
    make_adapter: Callable[..., RabbitMQAdapter], rabbitmq_url: str, ns: str
) -> None:
    """Every started subscription holds two channels, so one connection cannot carry more
    than half its negotiated channel limit, less the tap's and the declaration channels.
    With a limit of 32 (room for 13 subscriptions a connection beside 4 declaration
    channels), 40 started subscriptions (80 channels) are spread over 4 connections and
    all receive a notification exactly once; creation, start and deletion run in bulk.  The
    same rule at the broker's default limit (2,047): the default 1,000 subscriptions a
    connection fit one connection's channels."""
    default = make_adapter()
    negotiated = default.pool.primary.connection.params.channel_max
    assert default.pool.capacity() == 1000
    assert default.pool.capacity() * 2 + 2 + default.opts.declare_channels <= negotiated
    sep = "&" if "?" in rabbitmq_url else "?"
    adapter = make_adapter(f"{rabbitmq_url}{sep}channel_max=32")
    assert adapter.opts.declare_channels == 4
    assert adapter.pool.capacity() == 13
    topic = Topic(ns, ("fan",))
    patterns = (PathPattern(ns, ("fan",)),)
    counter = Counter()
    n = 40

    def create(i: int) -> RabbitMQSubscription:
        handle = adapter.subscription(
            SubscriptionSpec(name=f"scale-{ns[-12:]}-{i}", patterns=patterns)
        )
        handle.start(counter, prefetch=4)
        assert isinstance(handle, RabbitMQSubscription)
        return handle

    with ThreadPoolExecutor(8) as pool:
        handles = list(pool.map(create, range(n)))
    try:
        assert len({h.link.name for h in handles}) == 4
        assert adapter.publish(message(topic, b"<all/>")).routed is True
        # the barrier: each queue delivers its sentinel after its <all/>
        assert adapter.publish(message(topic, b"<sentinel/>")).routed is True
        wait_until(lambda: counter.bodies[b"<sentinel/>"] == n, 30, what=f"{n} sentinels")
        assert counter.bodies[b"<all/>"] == n  # exactly once each
        assert adapter.ping(timeout=10)  # one round trip; 1 s by default
    finally:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda h: h.delete(), handles))


def test_subscriptions_spread_over_consuming_connections(
    make_adapter: Callable[..., RabbitMQAdapter], ns: str
) -> None:
    """With 3 subscriptions per connection, 7 subscriptions use 3 connections; each has
    its own prefetch, stop() requeues its unacked deliveries, deleting frees a slot."""
    adapter = make_adapter(consumers_per_connection=3)
    topic = Topic(ns, ("t",))
    patterns = (PathPattern(ns, ("t",)),)
    collectors = [Collector(ack=False) for _ in range(7)]
    handles: list[RabbitMQSubscription] = []
    for i, collector in enumerate(collectors):
        handle = adapter.subscription(
            SubscriptionSpec(name=f"spread-{ns[-12:]}-{i}", patterns=patterns)
        )
        assert isinstance(handle, RabbitMQSubscription)
        handle.start(collector, prefetch=2)
        handles.append(handle)
    try:
        assert len(adapter.pool.links) == 3
        assert [sum(h.link is ln for h in handles) for ln in adapter.pool.links] == [3, 3, 1]
        adapter.publish_many([message(topic, b"%d" % k) for k in range(3)])
        for collector in collectors:
            # prefetch 2 without acks: exactly two deliveries each
            assert [m.body for m in collector.wait_for(2, 5.0)] == [b"0", b"1"]
        # the broker holds the third back in every queue (ready, not delivered)
        wait_until(
            lambda: adapter.depths(handles) == [1] * len(handles), 10, what="one ready message each"
        )
        assert all(len(c.received) == 2 for c in collectors)
        last = handles[-1]
        last.stop()
        got = last.pull(3, timeout=2.0)
        assert [m.body for m in got] == [b"0", b"1", b"2"]
        assert got[0].redelivered and got[1].redelivered
        for m in got:
            m.ack()
        handles[0].delete()
        again = adapter.subscription(
            SubscriptionSpec(name=f"spread-{ns[-12:]}-x", patterns=patterns)
        )
        assert isinstance(again, RabbitMQSubscription)
        assert again.link is adapter.pool.links[0]
        handles[0] = again
        assert adapter.ping(timeout=10)  # one round trip; 1 s by default
    finally:
        for handle in handles:
            handle.delete()


def test_pika_failure_on_subscribe_is_an_adapter_error(
    make_adapter: Callable[..., RabbitMQAdapter], ns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No free channel (or any other pika failure) reaches core as an AdapterError."""
    adapter = make_adapter()
    handle = adapter.subscription(
        SubscriptionSpec(name=f"nochan-{ns[-12:]}", patterns=(PathPattern(ns, ("t",)),))
    )
    assert isinstance(handle, RabbitMQSubscription)

    def no_channel() -> Any:
        raise pika.exceptions.NoFreeChannels()

    # a consumer's channel is begun without waiting for its open (``Link.begin_channel``)
    monkeypatch.setattr(handle.link, "begin_channel", no_channel)
    try:
        with pytest.raises(AdapterError) as info:
            handle.start(Collector(), prefetch=1)
        assert isinstance(info.value.__cause__, pika.exceptions.NoFreeChannels)
    finally:
        monkeypatch.undo()
        handle.delete()
