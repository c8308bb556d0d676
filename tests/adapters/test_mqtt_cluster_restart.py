"""MQTT cluster mode across a graceful restart of the broker (a Mosquitto of the test's
own, persistence on): Mosquitto 2.0.11 keeps a persistent session's plain subscriptions
and its queued messages, and drops its shared ones while answering ``session present``
(tests/adapters/test_mqtt_dead_letter_restart.py).  A subscription session subscribes its
filters on every connection, so a dead-letter box (a ``$share`` filter) receives again
once its session reconnected; an instance's dead letters wait until its own box has
subscribed again (a dead letter published while no box session has is queued for
nobody), while an ordinary subscription's session keeps what was published
meanwhile."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.importorskip("paho.mqtt")

from wsnmom.adapters.mqtt.cluster_handle import ClusterHandle
from wsnmom.core.adapter import AdapterError, OutboundMessage, QueueLimits, SubscriptionSpec
from wsnmom.core.dead_letter_records import box_name, destination_topic
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
    the dead letter was not (the next one arrives alone).  A stopped box is not waited
    for (core stops its boxes only when it closes; the next test has a started one)."""
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


def test_a_dead_letter_published_before_the_box_subscribed_again_waits_for_it(
    setup: Setup,
) -> None:
    """After a broker restart the publisher is back before the box's session (its
    reconnect put off for the test, as a loaded instance's can be): the dead letter
    published meanwhile waits until the box has subscribed its ``$share`` filter again,
    and reaches it.  The box's reconnect is let go once the publish waits for it, or,
    as the code before did, once the publish returned: the letter was then queued for
    nobody."""
    box, adapter = setup.box, setup.instance.adapter
    waiting = threading.Event()
    wait_for_box = box.await_connection

    def noted(timeout: float) -> bool:
        waiting.set()
        return wait_for_box(timeout)

    box.await_connection = noted  # type: ignore[method-assign]
    with box._lock:
        box._delay = 3600.0  # the box's next reconnect: when the test lets it go
    setup.restart_broker()
    # the box saw its connection lost and put its reconnect off (an hour)
    wait_until(lambda: box._timer is not None, 30, what="the box's reconnect put off")
    wait_until(lambda: adapter._cnode is not None and adapter._cnode.connected, 30)
    assert not box.connected
    publishing = threading.Thread(target=setup.publish, args=(DESTINATION, b"held"))
    publishing.start()
    wait_until(lambda: waiting.is_set() or not publishing.is_alive(), 30, what="the publish")
    with box._lock:
        box._schedule(0.0, first=False)
    publishing.join(60)
    assert not publishing.is_alive()
    setup.publish(DESTINATION, b"after")
    wait_until(lambda: setup.letters.has(b"after"), 30, what="the next dead letter")
    assert setup.letters.bodies() == [b"held", b"after"]
