"""RabbitMQ's ``delete_into_dead_letters`` when the dead-letter publish is refused: the
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
    INTERNAL_NAMESPACE_PREFIX,
    AdapterError,
    AdapterUnavailable,
    OutboundMessage,
    SubscriptionSpec,
)
from wsnmom.topic_mapping.model import PathPattern, Topic

from wsnmom.testing.conformance import Collector


def message(topic: Topic, body: bytes) -> OutboundMessage:
    return OutboundMessage(topic=topic, body=body, message_id=uuid.uuid4().hex)


def test_a_refused_end_loses_nothing_published_meanwhile(
    make_adapter: Callable[..., Any],
) -> None:
    """Each sweep that tries to end the subscription while its dead-letter topic refuses
    must not leave a window in which a Notify reaches no queue."""
    adapter = make_adapter()
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
