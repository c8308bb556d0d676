"""MQTT cluster mode: a clean ``stop`` hands every PUBACK settled before it to the
broker, so nothing acknowledged comes to the session's next connection.

Before the fix the connection's socket was closed right after the last write: the broker
was still sending the backlog, so the closed socket answered with a TCP reset, and the
broker's kernel dropped the PUBACKs the broker had not read yet; the broker then sent
those messages again to the next connection (docs/scale-out.md, "MQTT in cluster
mode").  Here a window of messages is held, acknowledged at once and the handle stopped
right away, while the broker still has a backlog to send."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.adapters.test_mqtt_cluster import SENTINEL, Collector, Instance
from tests.support.waiting import wait_until

pytestmark = pytest.mark.mqtt

#: messages held, then acknowledged at once right before the stop
WINDOW = 200


def test_a_stop_amid_a_backlog_hands_every_acknowledgement_over_first(
    mqtt_url: str, tmp_path: Path
) -> None:
    inst = Instance(mqtt_url, tmp_path / "i0", f"sa{uuid.uuid4().hex[:8]}")
    try:
        handle = inst.handle("s1")
        bodies = [b"m%04d" % i for i in range(WINDOW * 5)]
        inst.publish(*bodies)
        held = Collector(hold=True)
        handle.start(held, prefetch=WINDOW)
        wait_until(lambda: len(held.got) >= WINDOW, 30, what="the window full")
        acked = held.got[:WINDOW]
        assert [r.body for r in acked] == bodies[:WINDOW]
        for r in acked:
            r.ack()
        handle.stop()  # at once: the broker is still sending the backlog
        again = Collector()
        handle.start(again, prefetch=WINDOW)
        inst.publish(SENTINEL)
        wait_until(lambda: again.has(SENTINEL), 60, what="the sentinel")
        # nothing acknowledged came back; the rest came, in order
        assert again.bodies() == [*bodies[WINDOW:], SENTINEL]
    finally:
        inst.adapter.close()
