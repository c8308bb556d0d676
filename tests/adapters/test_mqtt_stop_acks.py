"""Single-instance MQTT: closing the adapter while its session still receives a backlog
stores nothing twice.

The session stores a batch, then PUBACKs it; a close acknowledges what arrived, then
disconnects.  paho closed the socket the moment it wrote the DISCONNECT: the broker,
still sending the backlog, got a TCP reset and never read the last PUBACKs, and sent
those messages again after the next open, so the subscription's queue held them twice
(measured: 157 of 4,000 twice).  Now the driver closes cleanly (``driver.linger``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from wsnmom.adapters.mqtt.adapter import MqttAdapter

from tests.adapters.test_mqtt import SENTINEL, make, message, pattern, subscribe, until_sentinel
from tests.support.waiting import wait_until

__all__ = ["make"]  # the fixture, shared with test_mqtt.py

pytestmark = pytest.mark.mqtt

BACKLOG = 4000
CLOSES = 3


def test_closing_amid_a_backlog_stores_nothing_twice(
    make: Callable[..., MqttAdapter], tmp_path: Path
) -> None:
    data_dir = str(tmp_path / "gateway")
    gateway = make(data_dir=data_dir)
    subscribe(gateway, pattern("away"), name="kept")
    gateway.close()
    publisher = make()
    publisher.publish_many([message("away", b"%d" % i) for i in range(BACKLOG)])
    publisher.publish(message("away", SENTINEL))
    for n in range(CLOSES):
        # open, let it store part of the backlog, close while the broker still sends
        again = make(data_dir=data_dir)
        handle = subscribe(again, pattern("away"), name="kept")
        low = (n + 1) * BACKLOG // (CLOSES + 2)
        wait_until(lambda h=handle, k=low: (h.depth() or 0) >= k, 60, what=f"{low} stored")
        again.close()
    last = make(data_dir=data_dir)
    got = until_sentinel(subscribe(last, pattern("away"), name="kept"), timeout=60)
    assert [m.body for m in got] == [b"%d" % i for i in range(BACKLOG)]
