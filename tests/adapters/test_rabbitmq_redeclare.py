"""What the RabbitMQ adapter declares again, and what it deletes, in cluster mode (issue
23; docs/scale-out.md, "Where an opening's time goes"):

- a subscription whose queue and bindings this process declared on the same connection,
  with the same arguments, is not declared again when its delivery opens again (a shard
  lost and gained back); a queue deleted behind the adapter's back meanwhile is found by
  the consume, declared again and consumed;
- a subscription another instance destroyed is forgotten here, and its queue deleted when
  this process declared it (at a first consume that may come after the other instance's
  delete: the orphan queue a refused Subscribe left behind) and no message waits in it;
  one that holds messages is left unbound (docs/scale-out.md).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

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


def _cluster_adapter(make_adapter: Callable[..., RabbitMQAdapter]) -> RabbitMQAdapter:
    adapter = make_adapter(queue_type="quorum")
    adapter.shared_by_instances()
    return adapter


def _counting(adapter: RabbitMQAdapter) -> list[str]:
    """The names of the subscriptions ``adapter`` declares from now on, in order."""
    declared: list[str] = []
    real = adapter.declarations.declare_subscription

    async def counted(sub: RabbitMQSubscription) -> None:
        declared.append(sub.name)
        await real(sub)

    adapter.declarations.declare_subscription = counted  # type: ignore[method-assign]
    return declared


def test_an_opening_again_declares_nothing_and_a_deleted_queue_is_declared_at_the_consume(
    make_adapter: Callable[..., RabbitMQAdapter], native: Any
) -> None:
    """Delivery opened, closed (the shard lost) and opened again (gained back): the second
    opening declares nothing (the same arguments and bindings on the same connection).
    The queue then deleted by an operator: the next opening declares nothing either, its
    consume finds no queue (404), declares it with its binding and consumes it; a message
    published afterwards is delivered."""
    ns = f"urn:test:redeclare:{uuid.uuid4().hex}"
    a = _cluster_adapter(make_adapter)
    spec = SubscriptionSpec(f"r-{uuid.uuid4().hex[:12]}", (PathPattern(ns, ("t",)),))
    handle = a.subscription(spec)
    got = Collector()
    handle.start(got, prefetch=10)
    a.publish(_message(ns, b"one"))
    wait_until(lambda: got.bodies() == [b"one"], 15, what="the first delivery")
    handle.stop()

    declared = _counting(a)
    again = a.subscription(spec)
    assert again is handle
    again.start(got, prefetch=10)
    assert declared == []  # the opening again declared nothing
    a.publish(_message(ns, b"two"))
    wait_until(lambda: got.bodies() == [b"one", b"two"], 15, what="the second delivery")
    again.stop()

    native.queue_delete(a.queue_name(spec.name))
    a.subscription(spec).start(got, prefetch=10)
    assert declared == [spec.name]  # declared once: at the consume that found no queue
    a.publish(_message(ns, b"three"))
    wait_until(lambda: got.bodies() == [b"one", b"two", b"three"], 15, what="the delivery after it")
    handle.delete()


def test_another_declaration_is_made_when_the_arguments_changed(
    make_adapter: Callable[..., RabbitMQAdapter],
) -> None:
    """The skip holds only for what was declared: another binding (the patterns changed)
    is declared."""
    ns = f"urn:test:redeclare:{uuid.uuid4().hex}"
    a = _cluster_adapter(make_adapter)
    name = f"r-{uuid.uuid4().hex[:12]}"
    handle = a.subscription(SubscriptionSpec(name, (PathPattern(ns, ("t",)),)))
    declared = _counting(a)
    wider = SubscriptionSpec(name, (PathPattern(ns, ("t",)), PathPattern(ns, ("u",))))
    assert a.subscription(wider) is handle
    assert declared == [name]
    got = Collector()
    handle.start(got, prefetch=10)
    a.publish(OutboundMessage(Topic(ns, ("u",)), b"on u", uuid.uuid4().hex))
    wait_until(lambda: got.bodies() == [b"on u"], 15, what="the delivery on the new binding")
    handle.delete()


def test_a_queue_declared_here_after_another_instance_deleted_it_goes_when_forgotten(
    make_adapter: Callable[..., RabbitMQAdapter], rabbitmq_url: str
) -> None:
    """The orphan of a refused Subscribe: instance A wrote the record, B followed it and,
    holding its shard, declared the queue at its first consume after A's refusal had
    deleted the queue and the record.  B follows the record's deletion (core's ``forget``:
    its channel closed, then ``forget_subscription``): the queue B declared is deleted,
    not left behind bound, filling with every message of its topic.  A follower that never
    declared the queue deletes nothing."""
    ns = f"urn:test:redeclare:{uuid.uuid4().hex}"
    a, b = _cluster_adapter(make_adapter), _cluster_adapter(make_adapter)
    pattern = PathPattern(ns, ("t",))
    spec = SubscriptionSpec(f"o-{uuid.uuid4().hex[:12]}", (pattern,), origin="new")
    a.subscription(spec)
    a.delete_subscription(spec.name)  # the refused Subscribe undone on A
    queue = b.queue_name(spec.name)
    assert not queue_exists(rabbitmq_url, queue)
    hb = b.subscription(SubscriptionSpec(spec.name, (pattern,), origin="elsewhere"))
    hb.start(Collector(), prefetch=10)  # B holds the shard: declared at its first consume
    assert queue_exists(rabbitmq_url, queue)
    hb.stop()
    assert b.forget_subscription(spec.name) is False  # nothing left
    assert not queue_exists(rabbitmq_url, queue)
    assert b.stats()["subscriptions"] == 0

    # followed, never declared here: forgetting deletes nothing of the other's queue
    kept = SubscriptionSpec(f"k-{uuid.uuid4().hex[:12]}", (pattern,), origin="new")
    a.subscription(kept)
    b.subscription(SubscriptionSpec(kept.name, (pattern,), origin="elsewhere"))
    assert b.forget_subscription(kept.name) is False  # the other's, not left by this one
    assert queue_exists(rabbitmq_url, b.queue_name(kept.name))
    assert b.stats()["subscriptions"] == 0
    a.delete_subscription(kept.name)


def test_a_followed_queue_that_holds_messages_is_left_unbound_when_forgotten(
    make_adapter: Callable[..., RabbitMQAdapter], rabbitmq_url: str
) -> None:
    """An end through instance A of a subscription that feeds a pull point deletes the
    record, then drains the queue into the pull point, then deletes the queue.  B read
    it by pull (declared at once) and follows the end meanwhile: it leaves the queue
    while a message waits in it, for A's drain, unbound (a message published after the
    end, confirmed, so routed, does not go into it), and deletes an empty one.  A's
    drain then gets what waited, and A deletes the queue."""
    ns = f"urn:test:redeclare:{uuid.uuid4().hex}"
    a, b = _cluster_adapter(make_adapter), _cluster_adapter(make_adapter)
    pattern = PathPattern(ns, ("t",))
    specs = [
        SubscriptionSpec(f"p-{uuid.uuid4().hex[:12]}", (pattern,), origin="new", pulled=True)
        for _ in range(2)
    ]
    handles = [a.subscription(spec) for spec in specs]
    for spec in specs:
        b.subscription(SubscriptionSpec(spec.name, (pattern,), origin="elsewhere", pulled=True))
    waiting, empty = specs
    a.publish(_message(ns, b"waits"))  # confirmed: in both queues
    taken = handles[1].pull(10, timeout=10.0)
    assert [m.body for m in taken] == [b"waits"]
    for m in taken:
        m.ack()
    assert b.forget_subscription(empty.name) is False
    assert not queue_exists(rabbitmq_url, b.queue_name(empty.name))
    assert b.forget_subscription(waiting.name) is True  # left: core writes an intent
    assert queue_exists(rabbitmq_url, b.queue_name(waiting.name))
    a.publish(_message(ns, b"after"))  # confirmed: routed before the pull below
    drained = handles[0].pull(10, timeout=10.0)
    assert [m.body for m in drained] == [b"waits"]
    for m in drained:
        m.ack()
    handles[0].delete()
    assert not queue_exists(rabbitmq_url, b.queue_name(waiting.name))
    assert b.stats()["subscriptions"] == 0
    handles[1].delete()


def test_a_queue_declared_here_again_that_holds_messages_is_left_unbound_when_forgotten(
    make_adapter: Callable[..., RabbitMQAdapter], rabbitmq_url: str, native: Any
) -> None:
    """The known gap (docs/scale-out.md): B declared the queue of a subscription read by
    pull again after A deleted it (a Subscribe refused there and undone), and a message
    reached it before B followed the record's delete.  B leaves it, as it would for A's
    drain, unbound: a message published afterwards (confirmed, so routed) does not go
    into it, and it keeps the one it held.  The forget says it left the queue: core
    writes an intent for it, and the orphan sweep deletes it after the grace
    (tests/core/test_orphans.py)."""
    ns = f"urn:test:redeclare:{uuid.uuid4().hex}"
    a, b = _cluster_adapter(make_adapter), _cluster_adapter(make_adapter)
    pattern = PathPattern(ns, ("t",))
    spec = SubscriptionSpec(f"g-{uuid.uuid4().hex[:12]}", (pattern,), origin="new", pulled=True)
    a.subscription(spec)
    a.delete_subscription(spec.name)  # the refused Subscribe undone on A
    queue = b.queue_name(spec.name)
    assert not queue_exists(rabbitmq_url, queue)
    b.subscription(SubscriptionSpec(spec.name, (pattern,), origin="elsewhere", pulled=True))
    assert queue_exists(rabbitmq_url, queue)  # read by pull: declared again at once
    a.publish(_message(ns, b"for nobody"))  # confirmed: in B's queue
    assert b.forget_subscription(spec.name) is True  # left: core writes an intent
    assert b.stats()["subscriptions"] == 0
    a.publish(_message(ns, b"after"))  # confirmed: routed, to no queue of this name
    assert native.queue_declare(queue, passive=True).method.message_count == 1
    native.queue_delete(queue)  # as the orphan sweep would
