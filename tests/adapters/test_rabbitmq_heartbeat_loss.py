"""A RabbitMQ connection whose broker falls silent (``adapters/rabbitmq/_fast.py`` under
pika's heartbeat checker), on the real test node behind a loopback relay.

The relay stops passing the broker's bytes to the adapter while the adapter's own still
reach the broker, so only the adapter's side can notice: pika's heartbeat checker must see
no bytes received (the counters the stream keeps), abort the stream through the adapter's
I/O, and the link must report the loss.  A publisher waiting for its confirm then fails
at once with pika's heartbeat timeout as the reason instead of waiting out its timeout, and the link
reconnects (the relay passes new connections) and publishes again.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("pika")

from wsnmom.adapters.rabbitmq.adapter import RabbitMQAdapter
from wsnmom.core.adapter import OutboundMessage, PublishFailed
from wsnmom.topic_mapping.model import Topic

from tests.support.loopback_relay import LoopbackRelay, relayed_url, upstream_of
from tests.support.waiting import wait_until

pytestmark = pytest.mark.rabbitmq


class Relay(LoopbackRelay):
    """Relays loopback connections to the broker; :meth:`silence` makes the broker's side
    of the connections open now go quiet (its bytes are read and dropped)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.silenced: set[int] = set()
        super().__init__(upstream)

    def passes(self, number: int) -> bool:
        return number not in self.silenced

    def silence(self) -> None:
        self.silenced.update(range(1, self.connections + 1))


@pytest.fixture
def relay(rabbitmq_url: str) -> Iterator[Relay]:
    r = Relay(upstream_of(rabbitmq_url, 5672))
    yield r
    r.close()


def _message(topic: Topic, body: bytes) -> OutboundMessage:
    return OutboundMessage(topic=topic, body=body, message_id=uuid.uuid4().hex, headers={})


def test_a_silent_broker_is_noticed_by_the_heartbeat_and_publishers_fail_fast(
    relay: Relay, make_adapter: Callable[..., RabbitMQAdapter], rabbitmq_url: str
) -> None:
    adapter = make_adapter(
        relayed_url(rabbitmq_url, relay.port), heartbeat=1, reconnect_max_delay=0.5
    )
    topic = Topic(f"urn:test:rabbit-hb:{uuid.uuid4().hex}", ("t",))
    adapter.publish(_message(topic, b"<before/>"), timeout=10.0)  # direct path is warm

    relay.silence()
    outcome: list[Any] = []
    publish_timeout = 60.0

    def publish() -> None:
        started = time.monotonic()
        try:
            adapter.publish(_message(topic, b"<during/>"), timeout=publish_timeout)
            outcome.append(("confirmed", time.monotonic() - started))
        except PublishFailed as exc:
            outcome.append((str(exc), time.monotonic() - started))

    thread = threading.Thread(target=publish)
    thread.start()
    # heartbeat 1 s: pika checks every 6 s, so the loss is seen within ~12 s
    thread.join(publish_timeout)
    [(result, took)] = outcome
    assert "heartbeats" in result, result  # pika's AMQPHeartbeatTimeout, passed on
    assert took < publish_timeout / 2, took
    # the link comes back on its own, through the relay's new (not silenced) connection
    wait_until(lambda: adapter.ping(timeout=1.0), 30, what="the link reconnected")
    wait_until(
        lambda: adapter.publish(_message(topic, b"<after/>"), timeout=5.0),
        30,
        what="a publish confirmed after the reconnect",
        errors=(PublishFailed,),
    )
