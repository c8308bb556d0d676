"""A message the RabbitMQ adapter cannot read (here a headers table whose timestamp is
beyond what Python's ``datetime`` holds, which RabbitMQ passes through as any other
table) on a real RabbitMQ: the channel that read it is closed and consumed again, as
``adapters/rabbitmq/_fast.py`` says, and then

- a subscription is not held up behind it: it is redelivered once, and rejected the
  second time (dead-lettered to the subscription's dead-letter topic, by RabbitMQ), so
  the messages after it arrive; it used to come back every 0.5 s for ever, and nothing
  after it was delivered;
- a pull point likewise: a pull or two fail, then it gets what came after;
- the current-message tap, which reads every message of every topic, reads on: it used
  to stay closed until the connection was lost, its map frozen."""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("pika")

from wsnmom.adapters.rabbitmq._link import Link
from wsnmom.adapters.rabbitmq._wire import shortstr
from wsnmom.core.adapter import (
    INTERNAL_NAMESPACE_PREFIX,
    AdapterError,
    OutboundMessage,
    SubscriptionSpec,
)
from wsnmom.topic_mapping.model import PathPattern, Topic

from tests.support.waiting import wait_until
from wsnmom.testing.conformance import Collector

pytestmark = pytest.mark.rabbitmq

#: a headers table {"when": timestamp 2**63}: valid AMQP, not a ``datetime``
_ENTRY = shortstr("when") + b"T" + struct.pack(">Q", 2**63)
POISON_TABLE = struct.pack(">I", len(_ENTRY)) + _ENTRY


def message(topic: Topic, body: bytes) -> OutboundMessage:
    return OutboundMessage(topic=topic, body=body, message_id=uuid.uuid4().hex)


def publish_poison(link: Link, exchange: str, key: str, body: bytes) -> None:
    """Publish ``body`` with :data:`POISON_TABLE` as its headers (raw frames: pika
    cannot encode such a timestamp)."""

    async def publish() -> None:
        ch = await link.open_channel()
        frames = ch.frames()
        out: list[bytes] = []
        frames.message(
            out,
            frames.method(exchange, key, False),
            body,
            content_type=None,
            table=POISON_TABLE,
            persistent=False,
            message_id=None,
            timestamp=None,
        )
        ch.write(b"".join(out))
        await ch.close()

    link.submit(publish(), 10)


def test_a_message_its_consumer_cannot_read_is_dead_lettered_and_the_rest_delivered(
    make_adapter: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    # no queue primers: expired at once, they are dead-lettered into the box too
    adapter = make_adapter(current_message=False, prime_queues=False)
    ns = f"urn:test:rabbit-poison:{uuid.uuid4().hex}"
    topic = Topic(ns, ("t",))
    grave = Topic(f"{INTERNAL_NAMESPACE_PREFIX}dl-{uuid.uuid4().hex}", ("dl",))
    tag = uuid.uuid4().hex[:12]
    # the dead-letter box, not consumed: it could not read that message either
    graves = adapter.subscription(
        SubscriptionSpec(f"g-{tag}", (PathPattern(grave.namespace, ("dl",)),))
    )
    got = Collector()
    handle = adapter.subscription(
        SubscriptionSpec(f"p-{tag}", (PathPattern(ns, ("t",)),), dead_letters=grave)
    )
    handle.start(got)
    adapter.publish(message(topic, b"before"))
    got.wait_for_body(b"before", 15)
    exchange, key = adapter.names.native_name(topic)
    publish_poison(adapter.pool.primary, exchange, key, b"poison")
    adapter.publish(message(topic, b"after"))
    # not held up behind the message it cannot read
    got.wait_for_body(b"after", 20)
    assert [m.body for m in got.received] == [b"before", b"after"]
    # which was tried twice (redelivered once), then dead-lettered, not requeued again
    wait_until(lambda: graves.depth() == 1, 20, what="the poison dead-lettered")
    assert handle.depth() == 0
    assert caplog.text.count("reading channel") == 2
    handle.delete()
    graves.delete()


def test_the_current_message_tap_reads_on_after_a_message_it_cannot_read(
    make_adapter: Callable[..., Any],
) -> None:
    adapter = make_adapter()
    ns = f"urn:test:rabbit-poison-tap:{uuid.uuid4().hex}"
    topic = Topic(ns, ("t",))
    adapter.publish(message(topic, b"first"))  # declares the topic's exchange
    exchange, key = adapter.names.native_name(topic)
    link = adapter.pool.primary
    publish_poison(link, exchange, key, b"poison")
    wait_until(
        lambda: adapter.current.channel is not None and not adapter.current.channel.is_open,
        15,
        what="the tap's channel closed on the message it cannot read",
    )
    # a native publish (the gateway's own update the map directly): only the tap sees it
    native = OutboundMessage(topic=topic, body=b"native", message_id="")

    async def publish_native() -> None:
        ch = await link.open_channel()
        ch.pika.basic_publish(exchange, key, native.body)
        await ch.close()

    def current() -> bytes | None:
        link.submit(publish_native(), 10)
        stored = adapter.current.lookup(topic)
        return None if stored is None else stored.body

    wait_until(lambda: current() == b"native", 20, what="the tap reading again")


def test_a_pull_point_is_not_held_up_by_a_message_it_cannot_read(
    make_adapter: Callable[..., Any],
) -> None:
    """The same for a subscription pulled with ``basic.get``: a pull or two fail (the
    puller's channel closes), then the message is dead-lettered and the next pull gets
    what came after it."""
    adapter = make_adapter(current_message=False, prime_queues=False)
    ns = f"urn:test:rabbit-poison-pull:{uuid.uuid4().hex}"
    topic = Topic(ns, ("t",))
    grave = Topic(f"{INTERNAL_NAMESPACE_PREFIX}dl-{uuid.uuid4().hex}", ("dl",))
    tag = uuid.uuid4().hex[:12]
    graves = adapter.subscription(
        SubscriptionSpec(f"g-{tag}", (PathPattern(grave.namespace, ("dl",)),))
    )
    handle = adapter.subscription(
        SubscriptionSpec(f"q-{tag}", (PathPattern(ns, ("t",)),), dead_letters=grave)
    )
    adapter.publish(message(topic, b"before"))  # declares the topic's exchange
    first = handle.pull(10, timeout=5)
    assert [m.body for m in first] == [b"before"]
    first[0].ack()
    exchange, key = adapter.names.native_name(topic)
    publish_poison(adapter.pool.primary, exchange, key, b"poison")
    adapter.publish(message(topic, b"after"))
    failed = 0
    got: list[bytes] = []
    pulled: list[Any] = []
    for _ in range(6):
        try:
            pulled = handle.pull(10, timeout=2)
            got = [m.body for m in pulled]
        except AdapterError:
            failed += 1
            continue
        if got:
            break
    assert got == [b"after"]
    assert failed <= 2
    pulled[0].ack()
    wait_until(lambda: graves.depth() == 1, 20, what="the poison dead-lettered")
    handle.delete()
    graves.delete()
