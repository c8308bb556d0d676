"""RabbitMQ's ``delete_into_dead_letters``: the backlog reaches the dead-letter topic and
the queue is deleted, on a classic queue and on a quorum queue with single-active-consumer
(cluster mode, which refuses ``basic.get``); when the dead-letter publish is refused the
subscription goes on (core tries again at its next sweep) and loses nothing, neither its
backlog nor what was published to it while the backlog was being dead-lettered."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any

import pytest

pytest.importorskip("pika")

from wsnmom.core.adapter import (
    DROPPED_OVERFLOW_END,
    HEADER_DROPPED_REASON,
    INTERNAL_NAMESPACE_PREFIX,
    AdapterError,
    AdapterUnavailable,
    OutboundMessage,
    SubscriptionSpec,
)
from wsnmom.topic_mapping.model import PathPattern, Topic

from tests.support.rabbitmq_queues import queue_exists
from wsnmom.testing.conformance import Collector

#: a classic queue (one instance) and the queue of a push subscription in cluster mode
QUEUES = [
    pytest.param({}, id="classic"),
    pytest.param({"queue_type": "quorum", "single_active_consumer": True}, id="quorum-sac"),
]


def message(topic: Topic, body: bytes) -> OutboundMessage:
    return OutboundMessage(topic=topic, body=body, message_id=uuid.uuid4().hex)


@pytest.mark.parametrize("options", QUEUES)
def test_the_backlog_goes_to_the_dead_letters_and_the_queue_is_deleted(
    make_adapter: Callable[..., Any], rabbitmq_url: str, options: dict[str, Any]
) -> None:
    """On the quorum queue every end of a subscription in cluster mode (a consumer given
    up on, a full backlog) failed with 405 (no ``basic.get`` on a single-active-consumer
    queue): the subscription stayed, retried at every sweep, and no SubscriptionEnd came."""
    adapter = make_adapter(**options)
    ns = f"urn:test:rabbit-dl-end:{uuid.uuid4().hex}"
    topic = Topic(ns, ("t",))
    grave = Topic(f"{INTERNAL_NAMESPACE_PREFIX}dl-{uuid.uuid4().hex}", ("dl",))
    dead = Collector()
    graves = adapter.subscription(
        SubscriptionSpec(f"g-{uuid.uuid4().hex[:12]}", (PathPattern(grave.namespace, ("dl",)),))
    )
    graves.start(dead)
    handle = adapter.subscription(
        SubscriptionSpec(
            f"t-{uuid.uuid4().hex[:12]}", (PathPattern(ns, ("t",)),), dead_letters=grave
        )
    )
    adapter.publish_many([message(topic, b"%d" % i) for i in range(3)])
    assert handle.delete_into_dead_letters(DROPPED_OVERFLOW_END, {}, timeout=5) == 3
    dead.wait_for(3, 10)
    assert sorted(dead.bodies()) == [b"0", b"1", b"2"]
    assert all(m.headers[HEADER_DROPPED_REASON] == DROPPED_OVERFLOW_END for m in dead.received)
    assert not queue_exists(rabbitmq_url, handle.queue)
    graves.delete()


@pytest.mark.parametrize("options", QUEUES)
def test_a_refused_end_loses_nothing_published_meanwhile(
    make_adapter: Callable[..., Any], options: dict[str, Any]
) -> None:
    """Each sweep that tries to end the subscription while its dead-letter topic refuses
    must not leave a window in which a Notify reaches no queue."""
    adapter = make_adapter(**options)
    ns = f"urn:test:rabbit-dl-end:{uuid.uuid4().hex}"
    topic = Topic(ns, ("t",))
    grave = Topic(f"{INTERNAL_NAMESPACE_PREFIX}dl-{uuid.uuid4().hex}", ("dl",))
    handle = adapter.subscription(
        SubscriptionSpec(
            f"t-{uuid.uuid4().hex[:12]}", (PathPattern(ns, ("t",)),), dead_letters=grave
        )
    )
    adapter.publish_many([message(topic, b"%d" % i) for i in range(3)])
    real = adapter.publish_many

    def refused(messages: Sequence[OutboundMessage], timeout: float = 10.0) -> Any:
        if any(m.topic == grave for m in messages):
            # a Notify while the backlog is being dead-lettered
            real([message(topic, b"during")], timeout)
            raise AdapterUnavailable("the dead-letter topic refused")
        return real(messages, timeout)

    adapter.publish_many = refused
    with pytest.raises(AdapterError):
        handle.delete_into_dead_letters(DROPPED_OVERFLOW_END, {}, timeout=5)
    adapter.publish_many = real
    got = Collector()
    handle.start(got)  # as core does after a refused end
    adapter.publish(message(topic, b"sentinel"))
    got.wait_for_body(b"sentinel", 10)
    assert sorted(m.body for m in got.received) == [b"0", b"1", b"2", b"during", b"sentinel"]
    handle.delete()
