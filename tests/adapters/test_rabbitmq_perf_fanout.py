"""RabbitMQ adapter: a Notify to thousands of *new* subscription queues is confirmed in time
(docs/performance.md, F5 follow-up), against a real node.

RabbitMQ creates a classic queue's directory and index journal lazily, with the first
persistent message, at ~1.3 ms of broker I/O per queue; one publish routed to 10,000 fresh
queues was confirmed only after ~13 s.  The adapter primes every new subscription queue
with a persistent message that expires at once, so the files exist before the first real
notification; primers are never handed to core.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pika
import pytest
from wsnmom.adapters.rabbitmq.adapter import RabbitMQAdapter
from wsnmom.core.adapter import OutboundMessage, SubscriptionHandle, SubscriptionSpec
from wsnmom.topic_mapping.model import PathPattern, Topic

from wsnmom.testing.conformance import Collector

pytestmark = pytest.mark.rabbitmq


@pytest.fixture
def ns() -> str:
    return f"urn:test:rabbit-prime:{uuid.uuid4().hex}"


@pytest.fixture
def native(rabbitmq_url: str) -> Iterator[Any]:
    conn = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    yield conn.channel()
    conn.close()


def message(topic: Topic, body: bytes) -> OutboundMessage:
    return OutboundMessage(topic=topic, body=body, message_id=uuid.uuid4().hex)


def primer_like(native: Any, queue: str) -> None:
    """A primer that does not expire: what a consumer sees if it wins the race with the
    primer's expiry."""
    native.basic_publish(
        "",
        queue,
        b"",
        pika.BasicProperties(delivery_mode=2, expiration="60000", headers={"wsnmom-primer": 1}),
    )


def wait_depth(handle: SubscriptionHandle, depth: int, timeout: float = 5.0) -> int | None:
    deadline = time.monotonic() + timeout
    while (now := handle.depth()) != depth and time.monotonic() < deadline:
        time.sleep(0.05)
    return now


def test_primers_are_never_delivered(
    make_adapter: Callable[..., RabbitMQAdapter], native: Any, ns: str
) -> None:
    """A primer is dropped by the broker; one that reaches a consumer or a pull anyway is
    acked by the adapter and never seen; real messages go on in order."""
    adapter = make_adapter()
    topic = Topic(ns, ("t",))
    name = f"p-{uuid.uuid4().hex[:10]}"
    handle = adapter.subscription(SubscriptionSpec(name, (PathPattern(ns, ("t",)),)))
    assert wait_depth(handle, 0) == 0  # the primer expired at once
    queue = adapter.queue_name(name)
    primer_like(native, queue)
    adapter.publish(message(topic, b"<a/>"))
    primer_like(native, queue)
    adapter.publish(message(topic, b"<b/>"))
    assert [m.body for m in handle.pull(10, timeout=1.0)] == [b"<a/>", b"<b/>"]
    primer_like(native, queue)
    adapter.publish(message(topic, b"<c/>"))
    got = Collector()
    handle.start(got, prefetch=8)
    assert [m.body for m in got.wait_for(1, 5.0)] == [b"<c/>"]
    time.sleep(0.3)
    assert got.bodies() == [b"<c/>"]
    handle.stop()
    assert wait_depth(handle, 0) == 0  # the primers were acked, not left unsettled
    handle.delete()


def test_no_primer_into_a_dead_letter_exchange(
    make_adapter: Callable[..., RabbitMQAdapter], native: Any, ns: str
) -> None:
    """An expired primer would be dead-lettered: queues with a dead-letter exchange (and
    quorum queues, and ``prime_queues = false``) get none."""
    dlx = f"test.dlx.{uuid.uuid4().hex[:8]}"
    native.exchange_declare(dlx, exchange_type="fanout", auto_delete=True)
    dead = native.queue_declare("", exclusive=True).method.queue
    native.queue_bind(dead, dlx)
    adapter = make_adapter(queue_arguments={"x-dead-letter-exchange": dlx})
    handle = adapter.subscription(
        SubscriptionSpec(f"d-{uuid.uuid4().hex[:10]}", (PathPattern(ns, ("t",)),))
    )
    time.sleep(0.3)
    assert native.queue_declare(dead, passive=True).method.message_count == 0
    handle.delete()
    assert not make_adapter(queue_type="quorum")._primes({"x-queue-type": "quorum"})
    assert not make_adapter(prime_queues="false")._primes({"x-queue-type": "classic"})


def _first_and_second_confirm(adapter: RabbitMQAdapter, ns: str, n: int) -> tuple[float, float]:
    """Seconds until the broker confirmed the first and the second publish routed to
    ``n`` new subscription queues (not consumed)."""
    patterns = (PathPattern(ns, ("fan",)),)
    tag = uuid.uuid4().hex[:8]

    def create(i: int) -> SubscriptionHandle:
        return adapter.subscription(SubscriptionSpec(f"f-{tag}-{i}", patterns))

    with ThreadPoolExecutor(16) as pool:
        handles = list(pool.map(create, range(n)))
    time.sleep(1.0)  # let the broker finish writing the primers
    times = []
    try:
        for body in (b"<first/>", b"<second/>"):
            started = time.perf_counter()
            assert adapter.publish(message(Topic(ns, ("fan",)), body), timeout=60).routed
            times.append(time.perf_counter() - started)
    finally:
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda h: h.delete(), handles))
    return times[0], times[1]


@pytest.mark.slow  # about 1-2 min: 2 x 2,000 subscriptions
def test_first_publish_to_new_queues_costs_no_more_than_later_ones(
    make_adapter: Callable[..., RabbitMQAdapter], ns: str
) -> None:
    """Without primers the first publish into 2,000 new queues takes ~10x the second
    (file creation per queue); with them, about the same."""
    n = 2000
    cold_first, cold_second = _first_and_second_confirm(make_adapter(prime_queues=False), ns, n)
    first, second = _first_and_second_confirm(make_adapter(), ns + ":primed", n)
    print(
        f"unprimed: first {cold_first:.2f}s second {cold_second:.2f}s; "
        f"primed: first {first:.2f}s second {second:.2f}s"
    )
    assert first < cold_first / 2
    assert first < 3 * second + 0.5
