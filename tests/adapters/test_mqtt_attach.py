"""Where a new subscription starts in the MQTT session's stream (WS-N: a subscription
receives what is published after it was made), on a real Mosquitto.

The gateway's session takes at most its Receive Maximum of unacknowledged messages at a
time (MQTT 3.1.1: the broker's ``max_inflight_messages``); after a reconnect the broker
holds the rest of a backlog back behind that window, while control packets (SUBACK,
UNSUBACK) overtake it.  A subscription made then must still get none of the backlog.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from wsnmom.adapters.mqtt.adapter import MqttAdapter
from wsnmom.core.adapter import (
    OutboundMessage,
    QueueLimits,
    Received,
    SubscriptionHandle,
    SubscriptionSpec,
)
from wsnmom.topic_mapping.model import PathPattern, Topic

from tests.fixtures.mosquitto import MosquittoNode
from tests.support.mqtt_adapters import mqtt_adapters
from tests.support.waiting import wait_until

pytestmark = pytest.mark.mqtt

NS = "urn:test:mqtt-attach"
SENTINEL = b"<sentinel/>"
#: the session's window (Receive Maximum, the broker's max_inflight_messages)
WINDOW = 10
#: messages queued for the session while it is away: many windows' worth
BACKLOG = 3_000


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., MqttAdapter]]:
    with mqtt_adapters(tmp_path, NS, session_expiry=300) as open_adapter:
        yield open_adapter


def message(path: str, body: bytes) -> OutboundMessage:
    return OutboundMessage(
        topic=Topic(NS, tuple(path.split("/"))), body=body, message_id=uuid.uuid4().hex
    )


def subscribe(adapter: MqttAdapter, path: str, name: str) -> SubscriptionHandle:
    spec = SubscriptionSpec(name, (PathPattern(NS, tuple(path.split("/"))),), QueueLimits())
    return adapter.subscription(spec)


def until_sentinel(handle: SubscriptionHandle, timeout: float) -> list[Received]:
    """Pull (and ack) until the sentinel arrived; the others, in order of arrival."""
    got: list[Received] = []

    def arrived() -> bool:
        got.extend(handle.pull(1000, timeout=0.2))
        return any(m.body == SENTINEL for m in got)

    wait_until(arrived, timeout, what="the sentinel")
    for m in got:
        m.ack()
    return [m for m in got if m.body != SENTINEL]


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_a_subscription_made_behind_a_backlog_gets_only_what_follows_it(
    make: Callable[..., MqttAdapter],
    mosquitto_factory: Callable[..., MosquittoNode],
    tmp_path: Path,
    protocol: str,
) -> None:
    node = mosquitto_factory(max_inflight=WINDOW)
    gateway_options: dict[str, Any] = {
        "data_dir": str(tmp_path / "gateway"),
        "protocol": protocol,
        "receive_maximum": WINDOW,
    }
    gateway = make(node.url, **gateway_options)
    subscribe(gateway, "away", "kept")
    gateway.close()
    publisher = make(node.url)
    old = [b"old-%d" % i for i in range(BACKLOG)]
    publisher.publish_many([message("away", body) for body in old])

    again = make(node.url, **gateway_options)  # the broker sends the backlog, a window at a time
    fresh = subscribe(again, "away", "fresh")  # on the topic of the backlog
    publisher.publish(message("away", b"new"))  # after the Subscribe was answered
    publisher.publish(message("away", SENTINEL))

    assert [m.body for m in until_sentinel(fresh, 60)] == [b"new"]
    kept = subscribe(again, "away", "kept")  # re-attach: the backlog was stored for it
    assert [m.body for m in until_sentinel(kept, 30)] == [*old, b"new"]


def test_a_broker_refusing_the_sentinel_topic_gets_the_fallback_barrier(
    make: Callable[..., MqttAdapter],
    mosquitto_factory: Callable[..., MosquittoNode],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Mosquitto's ACL grants the SUBSCRIBE of a topic it denies and refuses the PUBLISH
    (MQTT 5): Subscribes still work, at an UNSUBACK, and the refusal is logged."""
    node = mosquitto_factory(acl="topic readwrite acl/#\n")
    gateway = make(node.url, namespaces={NS: "acl"})
    with caplog.at_level(logging.ERROR, "wsnmom.adapters.mqtt"):
        first = subscribe(gateway, "x", "first")
        second = subscribe(gateway, "x", "second")
    assert "refused the sentinel topic" in caplog.text
    gateway.publish(message("x", b"after"))
    gateway.publish(message("x", SENTINEL))
    assert [m.body for m in until_sentinel(first, 30)] == [b"after"]
    assert [m.body for m in until_sentinel(second, 30)] == [b"after"]
