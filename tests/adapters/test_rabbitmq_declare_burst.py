"""RabbitMQ adapter: a burst of new subscriptions, against a real node (issue 29, F26).

The bench's fan-out set-up creates thousands of subscriptions with 16 requests in flight;
each freshly opened consuming connection then takes the next ``consumers_per_connection``
of them at once.  Their queue declarations, primers and bindings used to queue on the one
declaration channel of that connection, and under load some waited past
``operation_timeout`` and were refused as overloaded.  Now each connection declares on up to
``declare_channels`` channels at once.  Here 16 threads create 300 started subscriptions
on connections of 100 (so three connections each take a burst): none is refused, each
connection declared on several channels at once, and every queue is in place and bound
(one notification reaches all 300, once each).
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
from wsnmom.adapters.rabbitmq.adapter import RabbitMQAdapter, RabbitMQSubscription
from wsnmom.core.adapter import AdapterError, OutboundMessage, Received, SubscriptionSpec
from wsnmom.topic_mapping.model import PathPattern, Topic

from tests.support.waiting import wait_until

pytestmark = pytest.mark.rabbitmq

#: subscriptions created, per consuming connection, and requests in flight (the bench's)
SUBSCRIPTIONS = 300
PER_CONNECTION = 100
THREADS = 16


class Bodies:
    """An ``on_message`` callback shared by every subscription: acks, counts bodies."""

    def __init__(self) -> None:
        self.counts: Counter[bytes] = Counter()
        self._lock = threading.Lock()

    def __call__(self, received: Received) -> None:
        received.ack()
        with self._lock:
            self.counts[received.body] += 1


def test_a_burst_of_subscriptions_is_declared_concurrently_and_none_is_refused(
    make_adapter: Callable[..., RabbitMQAdapter], private_vhost: str
) -> None:
    adapter = make_adapter(private_vhost, consumers_per_connection=PER_CONNECTION)
    assert adapter.opts.declare_channels == 4
    ns = f"urn:test:rabbit-burst:{uuid.uuid4().hex}"
    topic = Topic(ns, ("fan",))
    patterns = (PathPattern(ns, ("fan",)),)
    bodies = Bodies()
    refused: list[tuple[int, AdapterError]] = []
    handles: list[RabbitMQSubscription] = []
    lock = threading.Lock()

    def create(i: int) -> None:
        try:
            handle = adapter.subscription(SubscriptionSpec(name=f"burst-{i}", patterns=patterns))
            assert isinstance(handle, RabbitMQSubscription)
            handle.start(bodies, prefetch=4)
        except AdapterError as exc:  # MiddlewareBusy ("overloaded") among them
            with lock:
                refused.append((i, exc))
            return
        with lock:
            handles.append(handle)

    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(create, range(SUBSCRIPTIONS)))
    assert refused == [], f"{len(refused)} refused; first: {refused[0][1]!r}"
    links = adapter.pool.links
    assert len(links) == SUBSCRIPTIONS // PER_CONNECTION
    # every connection took its burst on several declaration channels at once (one
    # channel for all, as before, would show 1), and never on more than the bound
    peaks = [link.declare_peak for link in links]
    assert all(1 < peak <= adapter.opts.declare_channels for peak in peaks), peaks

    # every queue declared and bound: one notification, then a sentinel behind it
    assert (
        adapter.publish(OutboundMessage(topic=topic, body=b"<n/>", message_id="n")).routed is True
    )
    assert (
        adapter.publish(
            OutboundMessage(topic=topic, body=b"<sentinel/>", message_id="sentinel")
        ).routed
        is True
    )
    wait_until(
        lambda: bodies.counts[b"<sentinel/>"] == SUBSCRIPTIONS, 30, what="a sentinel in each"
    )
    assert bodies.counts[b"<n/>"] == SUBSCRIPTIONS
    assert adapter.ping(timeout=10)  # one round trip; 1 s by default
