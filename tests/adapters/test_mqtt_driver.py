"""The MQTT adapter's network loop (``adapters/mqtt/driver.py``) on the session's
Mosquitto: one pass reads every packet waiting on the socket, in order, not one packet
a pass (paho 2.2's ``loop_read`` reads one packet a call on a connection with nothing
of its own in flight, whatever its argument)."""

from __future__ import annotations

import fcntl
import struct
import termios
import threading
import uuid
from typing import Any

import pytest

pytest.importorskip("paho.mqtt")

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from wsnmom.adapters.mqtt import driver as driver_module
from wsnmom.adapters.mqtt.driver import Driver

from tests.fixtures.mosquitto import close_client, native_client
from tests.support.waiting import wait_until

pytestmark = pytest.mark.mqtt

#: messages in the burst
N = 400


def _waiting_bytes(sock: Any) -> int:
    """Bytes the kernel holds for ``sock`` to read (FIONREAD)."""
    raw = fcntl.ioctl(sock.fileno(), termios.FIONREAD, struct.pack("i", 0))
    return int(struct.unpack("i", raw)[0])


def test_a_burst_waiting_on_the_socket_is_read_in_full_in_order_in_few_passes(
    mqtt_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """N messages are made to wait on the driver's socket (the test holds ``io_lock``
    until the kernel has every byte of them), then come out complete and in order, and
    the driver waits for its socket a handful of times, not once per message (before:
    N waits, one packet read a pass)."""
    topic = f"burst/{uuid.uuid4().hex[:8]}"
    got: list[bytes] = []
    subscribed = threading.Event()
    client = mqtt.Client(
        callback_api_version=CallbackAPIVersion.VERSION2,
        client_id=f"driver-{uuid.uuid4().hex[:8]}",
        protocol=mqtt.MQTTv5,
    )
    client.on_message = lambda c, u, m: got.append(m.payload)
    client.on_connect = lambda c, u, f, rc, p: c.subscribe(topic, qos=0)
    client.on_subscribe = lambda c, u, mid, rcs, p: subscribed.set()
    host, port = mqtt_url.removeprefix("mqtt://").split("?")[0].split(":")
    client.connect_async(host, int(port))
    waits: list[float] = []
    real_ready = driver_module.ready

    def counting(readers: Any, writers: Any, timeout: float) -> Any:
        if timeout > 0:  # a pass waiting for the socket (a burst's checks wait 0 s)
            waits.append(timeout)
        return real_ready(readers, writers, timeout)

    monkeypatch.setattr(driver_module, "ready", counting)
    driver = Driver(client, "burst-test", 0.1, 1.0, on_connect_fail=lambda exc: None)
    driver.start()
    publisher = native_client(mqtt_url)
    try:
        assert subscribed.wait(20), "no SUBACK"
        bodies = [b"%05d" % i for i in range(N)]
        # a QoS 0 PUBLISH without properties: fixed header, remaining length (1 byte
        # below 128), topic length, topic, property length, payload
        size = sum(2 + 2 + len(topic) + 1 + len(b) for b in bodies)
        with driver.io_lock:
            for body in bodies:
                publisher.publish(topic, body, qos=0)
            sock = client.socket()
            wait_until(lambda: _waiting_bytes(sock) >= size, 30, what="the burst on the socket")
            waits.clear()
        wait_until(lambda: len(got) >= N, 30, what=f"{N} messages")
        assert got == bodies
        assert len(waits) <= 10, f"{len(waits)} waits for {N} messages waiting at once"
    finally:
        close_client(publisher)
        driver.stop()
