"""MQTT cluster mode on descriptors that ``select()`` cannot watch.

An instance in cluster mode holds a connection per subscription it delivers (and paho a
socket pair each), so with a few hundred subscriptions its new sockets get descriptor
numbers of 1024 and above: ``select.select`` refuses those (FD_SETSIZE), and a network
loop built on it loses every such connection (measured before the fix: the 316th
Subscribe to one instance failed, its session's CONNECT never sent, "did not accept a
connection within 10s").  Here the test holds descriptors up to 1100 first, so that
everything the adapter opens is above the limit, and one subscription must still be
declared, consumed and acknowledged."""

from __future__ import annotations

import os
import select
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from wsnmom.adapters.mqtt.readiness import ready

from tests.adapters.test_mqtt_cluster import SENTINEL, Collector, Instance
from tests.support.descriptors import ABOVE, DescriptorHold, descriptors_held
from tests.support.waiting import wait_until


@pytest.fixture
def high_descriptors() -> Iterator[DescriptorHold]:
    """Hold descriptors up to :data:`ABOVE` (the soft limit raised if needed); a test
    calls ``refill`` right before the code under test opens its descriptors."""
    with descriptors_held(ABOVE) as hold:
        yield hold


def test_ready_waits_on_descriptors_that_select_refuses(high_descriptors: DescriptorHold) -> None:
    """What the publisher's network loop (``driver.py``) waits with."""
    high_descriptors.refill()
    a, b = socket.socketpair()
    try:
        assert a.fileno() > 1023
        with pytest.raises(ValueError):  # the limit is real here
            select.select([a], [], [], 0)
        assert ready([a], [], 0.05) == ([], [])  # nothing to read: it waited, no error
        b.send(b"x")
        assert ready([a, b], [a], 5) == ([a], [a])
    finally:
        a.close()
        b.close()
    with pytest.raises(ValueError):  # a closed socket, as select says
        ready([a], [], 0)


@pytest.mark.mqtt
def test_a_subscription_session_above_descriptor_1023_is_declared_consumed_and_acked(
    mqtt_url: str, tmp_path: Path, high_descriptors: DescriptorHold
) -> None:
    high_descriptors.refill()
    inst = Instance(mqtt_url, tmp_path / "i0", f"fd{os.getpid()}")
    try:
        handle = inst.handle("s1")
        consumer = Collector()
        handle.start(consumer, prefetch=8)
        bodies = [b"m%d" % i for i in range(20)]
        inst.publish(*bodies, SENTINEL)
        wait_until(lambda: consumer.has(SENTINEL), 20, what="the sentinel")
        conn = handle._conn  # the session's connection: the case under test
        sock = None if conn is None else conn.client.socket()
        assert sock is not None and sock.fileno() > ABOVE, sock
        assert consumer.bodies() == [*bodies, SENTINEL]
        # acknowledged: a new connection of the session gets nothing of it again
        handle.stop()
        again = Collector()
        handle.start(again, prefetch=8)
        inst.publish(b"after")
        wait_until(lambda: again.has(b"after"), 20, what="the next message")
        assert again.bodies() == [b"after"]
    finally:
        inst.adapter.close()
