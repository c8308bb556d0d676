"""RabbitMQ adapter: queue primers, and a Notify to many *new* subscription queues is
confirmed (docs/performance.md, F5 follow-up), against a real node.

RabbitMQ creates a classic queue's directory and index journal lazily, with the first
persistent message, at ~1.3 ms of broker I/O per queue; one publish routed to 10,000 fresh
queues was confirmed only after ~13 s.  The adapter primes every new subscription queue
with a persistent message that expires at once, so the files exist before the first real
notification; primers are never handed to core.  The speed figures (first against second
confirm, primed against unprimed, at 2,000 queues) are measured by bench/rabbitmq_priming.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pika
import pytest
from wsnmom.adapters.rabbitmq.adapter import RabbitMQAdapter, RabbitMQSubscription
from wsnmom.core.adapter import OutboundMessage, SubscriptionHandle, SubscriptionSpec
from wsnmom.topic_mapping.model import PathPattern, Topic

from tests.support.waiting import wait_until
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
    """The queue's depth, once the broker reports ``depth``; fails the test when it does
    not within ``timeout`` seconds."""
    wait_until(lambda: handle.depth() == depth, timeout, what=f"a depth of {depth}", interval=0.05)
    return depth


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
    adapter.publish(message(topic, b"<sentinel/>"))  # the barrier
    got.wait_for_body(b"<sentinel/>", 5.0)
    assert got.bodies() == [b"<c/>", b"<sentinel/>"]
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
    # the barrier: a message that expires at once, as a primer would, sent after the
    # subscription was made: once it is dead-lettered, a primer would have been too
    assert isinstance(handle, RabbitMQSubscription)
    native.basic_publish("", handle.queue, b"<sentinel/>", pika.BasicProperties(expiration="0"))
    letters: list[bytes] = []

    def dead_lettered() -> bool:
        while (got := native.basic_get(dead, auto_ack=True))[0] is not None:
            letters.append(got[2])
        return b"<sentinel/>" in letters

    wait_until(dead_lettered, 10, what="the sentinel in the dead-letter queue")
    assert letters == [b"<sentinel/>"]
    handle.delete()
    assert not make_adapter(queue_type="quorum").declarations.primes({"x-queue-type": "quorum"})
    assert not make_adapter(prime_queues="false").declarations.primes({"x-queue-type": "classic"})


def test_publishes_into_new_queues_are_confirmed_and_hold_only_real_messages(
    make_adapter: Callable[..., RabbitMQAdapter], ns: str
) -> None:
    """Unprimed and primed (the default): two publishes into 40 new subscription queues
    are both confirmed as routed, and every queue then holds exactly the two real
    messages (the primers expired, none is counted or delivered).  How much sooner the
    first publish is confirmed with primers is a speed figure: ``python -m
    bench.rabbitmq_priming`` measures it at 2,000 queues."""
    n = 40
    for adapter, tag in ((make_adapter(prime_queues=False), "cold"), (make_adapter(), "primed")):
        specs = [SubscriptionSpec(f"f-{tag}-{i}", (PathPattern(ns, (tag,)),)) for i in range(n)]
        with ThreadPoolExecutor(8) as pool:
            handles = list(pool.map(adapter.subscription, specs))
        try:
            for body in (b"<first/>", b"<second/>"):
                assert adapter.publish(message(Topic(ns, (tag,)), body), timeout=60).routed
            assert [wait_depth(h, 2) for h in handles] == [2] * n
            got = handles[-1].pull(5, timeout=1.0)
            assert [m.body for m in got] == [b"<first/>", b"<second/>"]
            for m in got:
                m.ack()
        finally:
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda h: h.delete(), handles))
