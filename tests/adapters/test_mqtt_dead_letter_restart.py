"""Dead-letter boxes on MQTT 5 across a graceful restart of the broker, on a Mosquitto of
the test's own (persistence on).

First what Mosquitto 2.0.11 does with a persistent session across its restart, with plain
paho clients: it answers ``session present``, keeps the session's plain subscriptions and
the messages queued for it, and drops its *shared* subscriptions (``$share/...``): a
message published to a shared filter's topic before the session subscribes it again is
queued for nobody (PUBACKed to its publisher all the same); a SUBSCRIBE brings the
shared subscription back (a second one, without a restart, replaces it: one copy).

Then the gateway: a box (a shared subscription, the default ``dead_letter_share``) gets
the dead letters published while the gateway is connected after the restart (the
session subscribes its shared filters again after every CONNACK) and those made while
the broker was down (the outbox waits for the session's filters before it sends).  What
remains: a dead letter published while the gateway is away and the broker has restarted
reaches no box (docs/adapters/mqtt.md, "Dead letters on the broker")."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("paho.mqtt")

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions
from wsnmom.adapters.mqtt.adapter import MqttAdapter
from wsnmom.adapters.mqtt.mapping import MqttMapping
from wsnmom.core.adapter import (
    INTERNAL_NAMESPACE_PREFIX,
    OutboundMessage,
    QueueLimits,
    SubscriptionHandle,
    SubscriptionSpec,
)
from wsnmom.topic_mapping.model import PathPattern, Topic

from tests.fixtures.mosquitto import MosquittoNode, MqttPublisher
from tests.support.waiting import wait_until

pytestmark = pytest.mark.mqtt


# -- the broker: a persistent session's filters across a restart ---------------------------


class PersistentClient:
    """A plain paho MQTT 5 client with a persistent session (clean start false, session
    expiry 300 s) that records the messages it receives and its CONNACKs."""

    def __init__(self, node: MosquittoNode) -> None:
        self.node = node
        self.client_id = f"persistent-{uuid.uuid4().hex[:8]}"
        self.got: list[str] = []
        self.session_present: list[bool] = []
        self._cv = threading.Condition()
        self.client: mqtt.Client | None = None

    def connect(self) -> None:
        client = mqtt.Client(
            callback_api_version=CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            protocol=mqtt.MQTTv5,
        )
        client.on_connect = self._on_connect
        client.on_message = self._on_message
        client.on_subscribe = self._on_subscribe
        props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        props.SessionExpiryInterval = 300
        before = len(self.session_present)
        client.connect("127.0.0.1", self.node.port, clean_start=False, properties=props)
        client.loop_start()
        self.client = client
        with self._cv:
            assert self._cv.wait_for(lambda: len(self.session_present) > before, 10)

    def subscribe(self, f: str) -> None:
        assert self.client is not None
        self._acked = False
        self.client.subscribe(f, options=SubscribeOptions(qos=1))
        with self._cv:
            assert self._cv.wait_for(lambda: self._acked, 10), f"no SUBACK for {f}"

    def disconnect(self) -> None:
        assert self.client is not None
        self.client.disconnect()
        self.client.loop_stop()
        self.client = None

    def wait_for(self, body: str) -> list[str]:
        """What arrived up to and including ``body`` (a sentinel)."""
        with self._cv:
            assert self._cv.wait_for(lambda: body in self.got, 15), (body, self.got)
            got, self.got = self.got, []
        return got

    def _on_connect(self, client: Any, userdata: Any, flags: Any, rc: Any, props: Any) -> None:
        with self._cv:
            self.session_present.append(bool(flags.session_present))
            self._cv.notify_all()

    def _on_subscribe(self, client: Any, userdata: Any, mid: int, rcs: Any, props: Any) -> None:
        with self._cv:
            self._acked = True
            self._cv.notify_all()

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        with self._cv:
            self.got.append(message.payload.decode())
            self._cv.notify_all()


def test_mosquitto_keeps_a_sessions_plain_filters_and_queue_but_not_its_shared_ones(
    mosquitto_factory: Callable[..., MosquittoNode],
) -> None:
    node = mosquitto_factory()
    p = f"r{uuid.uuid4().hex[:8]}"
    shared, plain = f"{p}/shared", f"{p}/plain"
    gw = PersistentClient(node)
    gw.connect()
    gw.subscribe(f"$share/g/{shared}")
    gw.subscribe(plain)
    publisher = MqttPublisher(node.url)
    publisher.publish(shared, b"live-shared")
    publisher.publish(plain, b"live-plain")
    assert gw.wait_for("live-plain") == ["live-shared", "live-plain"]
    # away across the restart: what was queued before it is kept
    gw.disconnect()
    publisher.publish(shared, b"queued-shared")
    publisher.publish(plain, b"queued-plain")
    publisher.close()
    node.stop()
    node.start()
    publisher = MqttPublisher(node.url)
    try:
        publisher.publish(shared, b"gap-shared")  # PUBACKed, queued for nobody
        publisher.publish(plain, b"gap-plain")
        gw.connect()
        assert gw.session_present[-1] is True
        assert gw.wait_for("gap-plain") == ["queued-shared", "queued-plain", "gap-plain"]
        # connected after the restart: the shared filter is still gone
        publisher.publish(shared, b"connected-shared")
        publisher.publish(plain, b"sentinel-1")
        assert gw.wait_for("sentinel-1") == ["sentinel-1"]
        # a SUBSCRIBE brings it back; a second one (no restart) replaces it: one copy
        gw.subscribe(f"$share/g/{shared}")
        gw.subscribe(f"$share/g/{shared}")
        publisher.publish(shared, b"resubscribed-shared")
        publisher.publish(plain, b"sentinel-2")
        assert gw.wait_for("sentinel-2") == ["resubscribed-shared", "sentinel-2"]
    finally:
        publisher.close()
        if gw.client is not None:
            gw.disconnect()


# -- the gateway's boxes -----------------------------------------------------------------------

#: the queue store takes these without the broker (an internal namespace)
SOURCE = Topic(f"{INTERNAL_NAMESPACE_PREFIX}test-dl-restart", ("t",))


class Gateway:
    """An adapter on ``node`` (default ``dead_letter_share``: the box is a shared
    subscription), a box for the dead-letter topic ``grave`` and a subscription ``sub``
    that keeps one message and drops the older ones there."""

    def __init__(self, node: MosquittoNode, data_dir: Path) -> None:
        self.node = node
        self.data_dir = data_dir
        self.prefix = f"o{uuid.uuid4().hex[:8]}"
        self.grave = Topic(
            f"{INTERNAL_NAMESPACE_PREFIX}dead-letters", (f"d{uuid.uuid4().hex[:8]}",)
        )
        #: the dead-letter MQTT topic of ``grave``
        self.topic = MqttMapping({}, self.prefix, dead_letters=True).name(self.grave)
        self.adapter: MqttAdapter | None = None
        self.box: SubscriptionHandle | None = None

    def open(self) -> None:
        adapter = MqttAdapter(
            self.node.url,
            {
                "data_dir": str(self.data_dir),
                "topic_prefix": self.prefix,
                "session_expiry": 300,
                "reconnect_max_delay": 0.5,
            },
        )
        adapter.open()
        self.adapter = adapter
        grave = self.grave
        self.box = adapter.subscription(
            SubscriptionSpec("box", (PathPattern(grave.namespace, grave.path),))
        )
        adapter.subscription(
            SubscriptionSpec(
                "sub",
                (PathPattern(SOURCE.namespace, SOURCE.path),),
                QueueLimits(max_messages=1),
                grave,
            )
        )
        assert any(f.startswith("$share/") for f in adapter._require().session.filters.effective)

    def close(self) -> None:
        if self.adapter is not None:
            self.adapter.close()
            self.adapter = None

    def subscribed(self) -> bool:
        """The session holds its filters again (its CONNACK handled, SUBACKs in)."""
        assert self.adapter is not None
        return self.adapter._require().session.subscribed()

    def drop(self, body: bytes) -> None:
        """Publish ``body`` and one more: ``sub``'s limit drops ``body``."""
        assert self.adapter is not None
        self.adapter.publish_many(
            [OutboundMessage(SOURCE, b, uuid.uuid4().hex) for b in (body, b"kept")]
        )

    def letters(self, *bodies: bytes) -> None:
        """The box's next dead letters are ``bodies``, in this order (besides the
        ``kept`` of an earlier :meth:`drop`, which the next one drops)."""
        assert self.box is not None
        box = self.box
        got: list[bytes] = []

        def enough() -> bool:
            for m in box.pull(10):
                if m.body != b"kept":
                    got.append(m.body)
                m.ack()
            return len(got) >= len(bodies)

        wait_until(enough, 30, what=f"dead letters {bodies!r} in the box (got {got!r})")
        assert got == list(bodies)


@pytest.fixture
def gateway(mosquitto_factory: Callable[..., MosquittoNode], tmp_path: Path) -> Iterator[Gateway]:
    g = Gateway(mosquitto_factory(), tmp_path / "gw")
    g.open()
    yield g
    g.close()


def test_a_box_gets_the_dead_letters_sent_after_a_broker_restart(gateway: Gateway) -> None:
    gateway.drop(b"before")
    gateway.letters(b"before")
    gateway.node.stop()
    gateway.node.start()
    wait_until(gateway.subscribed, 30, what="the session subscribed again")
    gateway.drop(b"connected")
    gateway.letters(b"connected")


def test_a_dead_letter_made_while_the_broker_is_down_reaches_the_box(gateway: Gateway) -> None:
    gateway.node.stop()
    gateway.drop(b"while-down")
    assert gateway.adapter is not None
    adapter = gateway.adapter
    wait_until(lambda: adapter.stats()["outbox_failures"] >= 1, 30, what="a failed attempt")
    gateway.node.start()
    gateway.letters(b"while-down")
    # and the next one, sent at once
    gateway.drop(b"after")
    gateway.letters(b"after")


def test_a_dead_letter_published_while_the_gateway_is_away_after_a_restart_is_lost(
    gateway: Gateway,
) -> None:
    """The documented limit: the session's box is not on the broker until the gateway
    subscribes it again; what was queued for it before the restart is kept."""
    gateway.close()
    publisher = MqttPublisher(gateway.node.url)
    publisher.publish(gateway.topic, b"queued")
    publisher.close()
    gateway.node.stop()
    gateway.node.start()
    publisher = MqttPublisher(gateway.node.url)
    try:
        publisher.publish(gateway.topic, b"gap")  # the broker PUBACKs it
    finally:
        publisher.close()
    gateway.open()
    gateway.drop(b"after")
    gateway.letters(b"queued", b"after")


def test_the_outbox_sends_only_while_the_session_holds_its_filters(gateway: Gateway) -> None:
    """The outbox's gate (``Session.subscribed``), held closed by the test: the outbox
    tries, sends nothing, and sends once the gate opens."""
    assert gateway.adapter is not None
    adapter = gateway.adapter
    outbox = adapter._require().outbox
    gate = threading.Event()
    outbox._ready = gate.is_set
    gateway.drop(b"held")
    wait_until(lambda: adapter.stats()["outbox_failures"] >= 2, 30, what="two attempts")
    assert adapter.stats()["dead_letters_sent"] == 0
    gate.set()
    gateway.letters(b"held")
    assert adapter.stats()["dead_letters_sent"] == 1
