"""A pull point read through core's buffer on MQTT in cluster mode (docs/scale-out.md,
"Pull points without a native pull"), adapter level, on the session's Mosquitto: when
the connection of a session the buffer reads is cut off (another connection with its
client id, as a declare or a take-over makes) and comes back, the broker sends again
every message the buffer held unacknowledged; each must still be handed out once."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from wsnmom.core.adapter import Received
from wsnmom.core.pull_buffer import PullBuffer

from tests.adapters.test_mqtt_cluster import SENTINEL, Instance, cluster, session_present
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
