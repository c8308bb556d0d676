"""What made a pull point on MQTT in cluster mode hand out messages twice (issue 23,
``tests/cluster/test_pull_owner.py``), adapter level, on the session's Mosquitto.

* When the connection of a session core's buffer reads (docs/scale-out.md, "Pull points
  without a native pull") is cut off (another connection with its client id) and comes
  back, the broker sends again every message the buffer held unacknowledged: each must
  still be handed out once.
* An instance following a subscription made through another instance must not connect
  to its session, even when it finds no record of it yet: that connection would cut off
  the instance already delivering it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from wsnmom.core.adapter import Received
from wsnmom.core.channel_signals import PrepareLater
from wsnmom.core.pull_buffer import PullBuffer

from tests.adapters.test_mqtt_cluster import (
    SENTINEL,
    Collector,
    Instance,
    cluster,
    session_present,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.mqtt

__all__ = ["cluster"]  # the fixture, imported for this module's tests


def body(received: Received) -> bytes:
    return received.body


@pytest.mark.parametrize("through", ["inbox", "feed"])
def test_messages_a_cut_off_connection_held_in_the_buffer_are_handed_out_once(
    cluster: Callable[[], Instance], mqtt_url: str, through: str
) -> None:
    a = cluster()
    # the feed variant: the pull point's own session has a topic of its own, the feed's
    # session the published one
    buffer = PullBuffer(a.handle("p", path="a" if through == "inbox" else "p"), prefetch=64)
    cut = buffer.handle
    if through == "feed":
        cut = a.handle("f")
        buffer.add_feed("f", cut, body, active=True)
    buffer.start()
    bodies = [b"m%d" % i for i in range(25)]
    a.publish(*bodies)
    wait_until(lambda: len(buffer.held(100)) == 25, 20, what="the 25 messages buffered")
    connections = cut.connections
    # another connection with the session's client id takes it over: the buffered
    # messages' connection is gone, and the handle (still allowed to deliver) connects
    # again, to which the broker sends the 25 unacknowledged messages again
    assert session_present(mqtt_url, cut.client_id, expiry=600)
    wait_until(lambda: cut.connections > connections and cut.connected, 20, what="the handle back")
    a.publish(SENTINEL)
    handed: list[bytes] = []

    def sentinel_handed() -> bool:
        for r in buffer.take(100):
            handed.append(r.body)
        return SENTINEL in handed

    wait_until(sentinel_handed, 20, what="the sentinel handed out")
    assert handed == [*bodies, SENTINEL]
    buffer.stop()


def clear_record(url: str, topic: str) -> None:
    """Clear the retained message on ``topic`` (QoS 1, acknowledged before returning)."""
    host, port = url.removeprefix("mqtt://").rsplit(":", 1)
    client = mqtt.Client(callback_api_version=CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    client.connect(host, int(port))
    client.loop_start()
    try:
        info: Any = client.publish(topic, b"", qos=1, retain=True)
        info.wait_for_publish(10)
        assert info.is_published()
    finally:
        client.disconnect()
        client.loop_stop()


def test_a_follower_that_finds_no_record_yet_does_not_cut_the_deliverer_off(
    cluster: Callable[[], Instance], mqtt_url: str
) -> None:
    a, b = cluster(), cluster()
    held = Collector(hold=True)  # a pull point's buffer: unsettled until handed out
    handle = a.handle("s", origin="new")
    handle.start(held, prefetch=64)
    bodies = [b"m%d" % i for i in range(25)]
    a.publish(*bodies)
    wait_until(lambda: len(held.got) == 25, 20, what="the 25 messages held")
    # B follows the subscription from the store before A's record of its session reached
    # the broker (A writes it as it declares; B may read first under load)
    prefix = a.adapter.settings.topic_prefix
    clear_record(mqtt_url, f"{prefix}/wsnmom/sessions/{handle.client_id}")
    b.handle("s", origin="elsewhere")
    a.publish(SENTINEL)
    wait_until(lambda: held.has(SENTINEL), 20, what="the sentinel through A")
    assert held.bodies() == [*bodies, SENTINEL]  # nothing again
    assert handle.await_connection(20) and handle.connections == 1  # installed at the SUBACK


def test_a_feed_stalled_at_a_message_put_off_hands_out_what_follows_in_order_once(
    cluster: Callable[[], Instance],
) -> None:
    """A feed's ``prepare`` puts a message off twice (``PrepareLater``: its dead letter for
    ``max_age`` not confirmed), then drops it (confirmed: settled as a filtered one).  The
    buffer stalls the feed at it (``core.pull_stall``): it is never handed out, and the
    messages behind it are handed out after it was settled, in order; the session's
    in-order PUBACKs settle each once (a new handle of the session gets nothing again).
    Before, the ``PrepareLater`` escaped into the adapter's delivery thread."""
    a = cluster()
    buffer = PullBuffer(a.handle("p", path="p"), prefetch=64)
    refusals = [PrepareLater(0.05), PrepareLater(0.05)]
    prepared: list[bytes] = []

    def prepare(received: Received) -> bytes | None:
        prepared.append(received.body)
        if received.body == b"old":
            if refusals:
                raise refusals.pop()
            return None  # buried: dropped, settled in its place
        return received.body

    feed = a.handle("f")
    buffer.add_feed("f", feed, prepare, active=True)
    buffer.start()
    a.publish(b"m0", b"old", b"m1", b"m2", SENTINEL)
    handed: list[bytes] = []

    def sentinel_handed() -> bool:
        handed.extend(r.body for r in buffer.take(100))
        return SENTINEL in handed

    wait_until(sentinel_handed, 20, what="the sentinel handed out")
    assert handed == [b"m0", b"m1", b"m2", SENTINEL]
    assert prepared.count(b"old") == 3 and not refusals
    buffer.stop()
    again = Collector(hold=True)
    a.handle("f").start(again, prefetch=64)
    a.publish(b"<sentinel2/>")
    wait_until(lambda: again.has(b"<sentinel2/>"), 20, what="the second sentinel")
    assert again.bodies() == [b"<sentinel2/>"]
