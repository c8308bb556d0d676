"""MQTT cluster mode across a graceful restart of the broker (a Mosquitto of the test's
own, persistence on): Mosquitto 2.0.11 keeps a persistent session's plain subscriptions
and its queued messages, and drops its shared ones while answering ``session present``
(tests/adapters/test_mqtt_dead_letter_restart.py).  A subscription session subscribes its
filters on every connection, so a dead-letter box (a ``$share`` filter) receives again
once its session reconnected; a dead letter published after the restart while no box
session has subscribed again is queued for nobody, while an ordinary subscription's
session keeps what was published meanwhile."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.importorskip("paho.mqtt")

from wsnmom.adapters.mqtt.cluster_handle import ClusterHandle
from wsnmom.core.adapter import AdapterError, OutboundMessage, QueueLimits, SubscriptionSpec
from wsnmom.core.dead_letters import box_name, destination_topic
from wsnmom.topic_mapping.model import PathPattern, Topic

from tests.adapters.test_mqtt_cluster import NS, Collector, Instance
from tests.fixtures.mosquitto import MosquittoNode
from tests.support.waiting import wait_until

pytestmark = pytest.mark.mqtt

DESTINATION = destination_topic("dl-restart")


class Setup:
    """One instance in cluster mode on a private broker, a dead-letter box session and an
    ordinary subscription session, both delivering to collectors."""

    def __init__(self, node: MosquittoNode, data_dir: Path) -> None:
        self.node = node
        self.instance = Instance(node.url, data_dir, f"c{uuid.uuid4().hex[:8]}")
        adapter = self.instance.adapter
        box = adapter.subscription(
            SubscriptionSpec(
                box_name("dl-restart"),
                (PathPattern(DESTINATION.namespace, DESTINATION.path),),
                QueueLimits(),
            )
        )
        assert isinstance(box, ClusterHandle)
        assert all(f.startswith("$share/") for f in box.filters)
        self.box, self.letters = box, Collector()
        self.sub, self.got = self.instance.handle("plain"), Collector()
        self.box.start(self.letters)
        self.sub.start(self.got)

    def publish(self, topic: Topic, body: bytes) -> None:
        """Publish through the instance, once its publisher is connected again."""

        def sent() -> bool:
            try:
                self.instance.adapter.publish(
                    OutboundMessage(topic=topic, body=body, message_id=uuid.uuid4().hex)
                )
            except AdapterError:
                return False
            return True

        wait_until(sent, 30, what=f"{body!r} published")

    def restart_broker(self) -> None:
        self.node.stop()
        self.node.start()


def settled(handle: ClusterHandle, connections: int) -> bool:
    """The handle made ``connections`` connections and the last one subscribed (a
    reconnect holds the handle's lock until the SUBACKs are in)."""
    if handle.connections < connections:
        return False
    with handle._lock:
        return handle.connected


@pytest.fixture
def setup(mosquitto_factory: Callable[..., MosquittoNode], tmp_path: Path) -> Iterator[Setup]:
    s = Setup(mosquitto_factory(), tmp_path / "i0")
    yield s
    s.instance.adapter.close()


def test_box_and_subscription_sessions_receive_again_after_a_broker_restart(
    setup: Setup,
) -> None:
    setup.restart_broker()
    wait_until(lambda: settled(setup.box, 2) and settled(setup.sub, 2), 30, what="reconnects")
    setup.publish(DESTINATION, b"letter")
    setup.publish(Topic(NS, ("a",)), b"notification")
    wait_until(lambda: setup.letters.has(b"letter"), 20, what="the dead letter")
    wait_until(lambda: setup.got.has(b"notification"), 20, what="the notification")


def test_a_dead_letter_sent_before_any_box_session_subscribed_again_is_lost(
    setup: Setup,
) -> None:
    """The gap of the single-instance mode, with no outbox to wait: both sessions are
    stopped (the broker keeps them), the broker restarts, a dead letter and a
    notification are published, the sessions start again: the notification was queued,
    the dead letter was not (the next one arrives alone)."""
    setup.box.stop()
    setup.sub.stop()
    setup.restart_broker()
    setup.publish(DESTINATION, b"gap")
    setup.publish(Topic(NS, ("a",)), b"queued")
    setup.box.start(setup.letters)
    setup.sub.start(setup.got)
    setup.publish(DESTINATION, b"after")
    wait_until(lambda: setup.letters.has(b"after"), 20, what="the next dead letter")
    assert setup.letters.bodies() == [b"after"]
    wait_until(lambda: setup.got.has(b"queued"), 20, what="the queued notification")
