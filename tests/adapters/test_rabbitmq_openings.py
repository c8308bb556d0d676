"""A followed subscription's first opening on RabbitMQ (a survivor after a failover takes
the subscriptions another instance made; docs/scale-out.md, "Failover at scale"): its queue
and binding are declared in the write of its consume, on the consumer's own channel,
so the opening waits for no declaration channel; a queue that exists with other
arguments still gets the declaration that keeps it (``Declarations.declare_queue``).
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable

import pytest
from wsnmom.adapters.rabbitmq.adapter import RabbitMQAdapter
from wsnmom.adapters.rabbitmq.subscription import RabbitMQSubscription
from wsnmom.core.adapter import OutboundMessage, SubscriptionSpec
from wsnmom.topic_mapping.model import PathPattern, Topic

from tests.support.rabbitmq_queues import queue_exists
from tests.support.waiting import wait_until
from wsnmom.testing.conformance import Collector

pytestmark = pytest.mark.rabbitmq


def _message(ns: str, body: bytes) -> OutboundMessage:
    return OutboundMessage(Topic(ns, ("t",)), body, uuid.uuid4().hex)


def _hold_declaration_channels(sub: RabbitMQSubscription, count: int) -> Callable[[], None]:
    """Hold ``count`` declaration channels of ``sub``'s connection (all of them) until the
    returned function is called."""
    link = sub.link
    held = threading.Event()
    release = asyncio.Event()  # made here, used on the loop thread only

    async def hold(left: int) -> None:
        if left == 0:
            held.set()
            await release.wait()
            return
        async with link.declaring():
            await hold(left - 1)

    future = asyncio.run_coroutine_threadsafe(hold(count), link.loop)
    assert held.wait(10), "the declaration channels were not taken"

    def let_go() -> None:
        link.loop.call_soon_threadsafe(release.set)
        future.result(10)

    return let_go


def test_a_followed_subscription_opens_without_a_declaration_channel(
    make_adapter: Callable[..., RabbitMQAdapter], rabbitmq_url: str
) -> None:
    """Every declaration channel of the follower's connection held by others (a burst of
    Subscribes, say): a subscription made on another instance still opens, declared in
    its consume's write (it waited for one of them before, up to the operation timeout),
    and it is declared as it must be: the queue exists, the binding delivers."""
    ns = f"urn:test:openings:{uuid.uuid4().hex}"
    maker = make_adapter(queue_type="quorum")
    follower = make_adapter(queue_type="quorum", declare_channels=1, operation_timeout=5)
    for adapter in (maker, follower):
        adapter.shared_by_instances()
    pattern = PathPattern(ns, ("t",))
    first, second = (f"f-{uuid.uuid4().hex[:12]}" for _ in range(2))
    for name in (first, second):
        maker.subscription(SubscriptionSpec(name, (pattern,), origin="new"))
    # the first opening puts the namespace's exchange in place (once per connection)
    follower.subscription(SubscriptionSpec(first, (pattern,), origin="elsewhere")).start(
        Collector(), prefetch=10
    )

    handle = follower.subscription(SubscriptionSpec(second, (pattern,), origin="elsewhere"))
    assert isinstance(handle, RabbitMQSubscription)
    let_go = _hold_declaration_channels(handle, 1)
    got = Collector()
    try:
        handle.start(got, prefetch=10)
    finally:
        let_go()
    assert handle.declared
    assert queue_exists(rabbitmq_url, follower.queue_name(second))
    maker.publish(_message(ns, b"after the opening"))
    wait_until(lambda: got.bodies() == [b"after the opening"], 15, what="the delivery")
    for name in (first, second):
        maker.delete_subscription(name)


def test_a_followed_subscription_whose_queue_has_other_arguments_keeps_it_and_consumes(
    make_adapter: Callable[..., RabbitMQAdapter], rabbitmq_url: str
) -> None:
    """The queue exists as a classic queue holding a message (made by an older
    configuration) while the follower wants quorum queues: the declaration in the
    consume's write is refused, the declaration of its own keeps the queue as it is (it
    cannot change type in place), and the consume then gets the message waiting."""
    ns = f"urn:test:openings:{uuid.uuid4().hex}"
    maker = make_adapter(queue_type="classic")
    follower = make_adapter(queue_type="quorum")
    follower.shared_by_instances()
    pattern = PathPattern(ns, ("t",))
    name = f"k-{uuid.uuid4().hex[:12]}"
    maker.subscription(SubscriptionSpec(name, (pattern,), origin="new"))
    maker.publish(_message(ns, b"waiting"))

    handle = follower.subscription(SubscriptionSpec(name, (pattern,), origin="elsewhere"))
    assert isinstance(handle, RabbitMQSubscription)
    got = Collector()
    handle.start(got, prefetch=10)
    wait_until(lambda: got.bodies() == [b"waiting"], 15, what="the waiting message")
    assert handle.declared and handle.declared_as is None  # kept: declared again next time
    maker.publish(_message(ns, b"after"))
    wait_until(lambda: got.bodies() == [b"waiting", b"after"], 15, what="the next one")
    handle.stop()
    maker.delete_subscription(name)
    assert not queue_exists(rabbitmq_url, follower.queue_name(name))
