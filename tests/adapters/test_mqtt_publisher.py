"""The MQTT adapter's batched publisher against a real Mosquitto: concurrent batches larger
than the broker's Receive Maximum keep to it and keep each batch's order, and a batch
waiting for PUBACKs fails as soon as the connection is lost or its time is up, without
losing room in the window."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("paho.mqtt")

from wsnmom.adapters.mqtt.adapter import MqttAdapter
from wsnmom.core.adapter import AdapterUnavailable, OutboundMessage, PublishFailed
from wsnmom.topic_mapping.model import Topic

from tests.fixtures.mosquitto import MosquittoNode, close_client, native_client
from tests.support.mqtt_adapters import mqtt_adapters

pytestmark = pytest.mark.mqtt

NS = "urn:test:mqtt-publisher"


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., MqttAdapter]]:
    with mqtt_adapters(tmp_path, NS) as open_adapter:
        yield open_adapter


def message(path: str, body: bytes) -> OutboundMessage:
    return OutboundMessage(topic=Topic(NS, (path,)), body=body, message_id=uuid.uuid4().hex)


def test_concurrent_batches_keep_the_receive_maximum_and_their_order(
    make: Callable[..., MqttAdapter], mosquitto_factory: Callable[..., MosquittoNode]
) -> None:
    """Mosquitto's default Receive Maximum (20): six callers of 60 messages each, all
    confirmed on one connection, never more than 20 unacknowledged, each caller's
    messages received in its order."""
    node = mosquitto_factory(max_inflight=20)
    adapter = make(node.url)
    prefix = adapter.settings.namespaces[NS]
    got: dict[str, list[bytes]] = {}
    lock = threading.Lock()
    native = native_client(node.url)
    subscribed = threading.Event()

    def on_message(client: Any, userdata: Any, msg: Any) -> None:
        with lock:
            got.setdefault(msg.topic, []).append(bytes(msg.payload))

    native.on_message = on_message
    native.on_subscribe = lambda *args: subscribed.set()
    native.subscribe(f"{prefix}/#", qos=1)
    assert subscribed.wait(10)
    errors: list[BaseException] = []

    def caller(k: int) -> None:
        try:
            receipts = adapter.publish_many(
                [message(f"c{k}", b"%d" % i) for i in range(60)], timeout=30
            )
            assert len(receipts) == 60 and all(r.routed for r in receipts)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        assert not errors
        stats = adapter.stats()
        assert stats["publish_window"] == 20
        assert 1 < stats["publish_peak_inflight"] <= 20
        assert adapter._require().publisher.link.connections == 1  # never refused
        deadline = time.monotonic() + 10
        while sum(map(len, got.values())) < 360 and time.monotonic() < deadline:
            time.sleep(0.05)
        for k in range(6):
            assert got[f"{prefix}/c{k}"] == [b"%d" % i for i in range(60)]
    finally:
        close_client(native)


def test_a_waiting_batch_fails_at_once_when_the_connection_is_lost(
    make: Callable[..., MqttAdapter], mosquitto_factory: Callable[..., MosquittoNode]
) -> None:
    node = mosquitto_factory()
    adapter = make(node.url, reconnect_max_delay=0.5)
    node.pause()  # PUBACKs stop coming; the batch waits
    outcome: list[BaseException] = []

    def publish() -> None:
        try:
            adapter.publish_many([message("lost", b"x")] * 50, timeout=60)
        except BaseException as exc:
            outcome.append(exc)

    caller = threading.Thread(target=publish)
    caller.start()
    time.sleep(0.5)
    assert caller.is_alive()
    started = time.monotonic()
    node.kill()
    caller.join(30)
    assert not caller.is_alive()
    assert time.monotonic() - started < 20  # at the connection's loss, not at the 60 s
    assert len(outcome) == 1 and isinstance(outcome[0], AdapterUnavailable)
    node.start()
    deadline = time.monotonic() + 10
    while not adapter.available() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert adapter.publish(message("lost", b"again")).routed is False


def test_a_batch_not_confirmed_in_time_fails_and_frees_its_room(
    make: Callable[..., MqttAdapter], mosquitto_factory: Callable[..., MosquittoNode]
) -> None:
    node = mosquitto_factory(max_inflight=20)
    adapter = make(node.url)
    node.pause()
    try:
        started = time.monotonic()
        with pytest.raises(PublishFailed, match=r"did not confirm within 0\.5s"):
            adapter.publish_many([message("slow", b"%d" % i) for i in range(30)], timeout=0.5)
        assert time.monotonic() - started < 10  # the broker stays paused: no answer ends it
    finally:
        node.resume()
    # the late PUBACKs free the window: 40 more messages (twice the window) go through
    receipts = adapter.publish_many([message("slow", b"x")] * 40, timeout=10)
    assert len(receipts) == 40
