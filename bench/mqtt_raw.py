"""Raw paho-mqtt baselines of the MQTT benchmark (``bench.middleware.Mqtt``): what the broker
and the client library do for the delivery and fan-out scenarios without the gateway.

Round trip: ``publishers`` clients publish QoS 1, each waiting for the PUBACK of every
message before the next (as the gateway confirms each Notify), and one client with a
persistent session (clean start false, QoS 1 subscription) receives them.

Fan-out: ``size`` persistent sessions (one connection each, all driven by one selector
loop, the way a one-session-per-subscription design would have to run) subscribed to one
topic; one QoS 1 message published; the time until every session has it.

Ingress: one connection shared by the gateway's request threads, each publishing one
Notify's messages at QoS 1 and waiting for all their PUBACKs (``ingress``).
"""

from __future__ import annotations

import selectors
import threading
import time
import uuid
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from bench import raw_ingress
from bench.util import timed_threads


def _host_port(url: str) -> tuple[str, int]:
    rest = url.split("://", 1)[1].split("?", 1)[0]
    host, _, port = rest.rpartition(":")
    return host, int(port)


def _client(client_id: str) -> mqtt.Client:
    return mqtt.Client(
        callback_api_version=CallbackAPIVersion.VERSION2,
        client_id=client_id,
        protocol=mqtt.MQTTv5,
    )


def _session_props() -> Properties:
    props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
    props.SessionExpiryInterval = 300
    return props


def roundtrip(url: str, count: int, body: bytes, publishers: int) -> dict[str, float]:
    """See the module docstring; ``{"seconds": s, "msgs_per_s": r}``."""
    host, port = _host_port(url)
    topic = f"bench-raw/{uuid.uuid4().hex[:8]}"
    received = [0]
    done = threading.Event()
    subscribed = threading.Event()
    lock = threading.Lock()

    consumer = _client(f"bench-raw-sub-{uuid.uuid4().hex[:8]}")

    def on_message(client: Any, userdata: Any, message: Any) -> None:
        with lock:
            received[0] += 1
            if received[0] >= count:
                done.set()

    consumer.on_message = on_message
    consumer.on_subscribe = lambda *args: subscribed.set()
    consumer.connect(host, port, clean_start=False, properties=_session_props())
    consumer.loop_start()
    consumer.subscribe(topic, qos=1)
    if not subscribed.wait(30):
        raise RuntimeError("raw paho round trip: the subscription was not acknowledged")
    errors: list[BaseException] = []

    def publisher(k: int) -> None:
        try:
            client = _client(f"bench-raw-pub-{uuid.uuid4().hex[:8]}")
            client.connect(host, port)
            client.loop_start()
            for _ in range(k, count, publishers):
                client.publish(topic, body, qos=1).wait_for_publish(30)
            client.disconnect()
            client.loop_stop()
        except BaseException as exc:
            errors.append(exc)

    finished, elapsed = timed_threads(publisher, publishers, done)
    consumer.disconnect()
    consumer.loop_stop()
    if errors:
        raise RuntimeError(f"raw paho round trip failed: {errors[0]!r}")
    if not finished:
        raise RuntimeError(f"raw paho round trip: only {received[0]}/{count} received")
    return {"seconds": elapsed, "msgs_per_s": count / elapsed}


class _Sessions:
    """Many paho clients on one selector loop (no thread per client)."""

    def __init__(self, host: str, port: int, topic: str) -> None:
        self.host, self.port, self.topic = host, port, topic
        self.selector = selectors.DefaultSelector()
        self.clients: list[mqtt.Client] = []
        self.acked = 0
        self.got = 0

    def add(self, count: int) -> None:
        """Connect ``count`` persistent sessions (expiring 5 s after the run)."""
        props = _session_props()
        props.SessionExpiryInterval = 5
        for i in range(count):
            client = _client(f"bench-fan-{uuid.uuid4().hex[:8]}-{i}")
            client.on_connect = self._on_connect
            client.on_subscribe = self._on_subscribe
            client.on_message = self._on_message
            client.connect(self.host, self.port, keepalive=600, clean_start=False, properties=props)
            sock = client.socket()
            assert sock is not None
            self.selector.register(sock, selectors.EVENT_READ, client)
            self.clients.append(client)

    def _on_connect(self, client: mqtt.Client, *args: Any) -> None:
        client.subscribe(self.topic, qos=1)

    def _on_subscribe(self, *args: Any) -> None:
        self.acked += 1

    def _on_message(self, *args: Any) -> None:
        self.got += 1

    def run_until(self, done: Any, timeout: float) -> bool:
        """Serve the sockets until ``done()`` (False after ``timeout`` seconds)."""
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                return False
            for client in self.clients:
                if client.want_write():
                    client.loop_write()
            for key, _ in self.selector.select(0.05):
                key.data.loop_read(100)
        return True

    def close(self) -> None:
        for client in self.clients:
            client.disconnect()
            client.loop_write()
        self.selector.close()


def fanout(url: str, size: int) -> float:
    """See the module docstring: seconds from the publish to the last session's copy.  The
    publisher connects first (with 5,000 sessions connected on one loop, Mosquitto 2.0.11
    here did not answer a CONNECT that came after them)."""
    host, port = _host_port(url)
    publisher = _client(f"bench-fan-pub-{uuid.uuid4().hex[:8]}")
    connected = threading.Event()
    publisher.on_connect = lambda *args: connected.set()
    publisher.connect(host, port)
    publisher.loop_start()
    sessions = _Sessions(host, port, f"bench-fan/{uuid.uuid4().hex[:8]}")
    try:
        if not connected.wait(30):
            raise RuntimeError("raw MQTT fan-out: the publisher did not connect")
        sessions.add(size)
        if not sessions.run_until(lambda: sessions.acked >= size, 300):
            raise RuntimeError(f"raw MQTT fan-out {size}: {sessions.acked} sessions subscribed")
        started = time.perf_counter()
        publisher.publish(sessions.topic, b"<x/>", qos=1)
        if not sessions.run_until(lambda: sessions.got >= size, 300):
            raise RuntimeError(f"raw MQTT fan-out {size}: {sessions.got}/{size} received")
        return time.perf_counter() - started
    finally:
        sessions.close()
        publisher.disconnect()
        publisher.loop_stop()


def _receive_maximum(host: str, port: int) -> int:
    """The Receive Maximum the broker grants an MQTT 5 client (65,535 when it names none)."""
    client = _client(f"bench-raw-probe-{uuid.uuid4().hex[:8]}")
    granted: list[int] = []
    connected = threading.Event()

    def on_connect(client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        granted.append(int(getattr(props, "ReceiveMaximum", None) or 65_535))
        connected.set()

    client.on_connect = on_connect
    client.connect(host, port)
    client.loop_start()
    try:
        if not connected.wait(30):
            raise RuntimeError("raw paho: no CONNACK in 30 s")
        return granted[0]
    finally:
        client.disconnect()
        client.loop_stop()


def ingress(url: str, bodies: list[bytes], seconds: float, threads: int = 16) -> dict[str, float]:
    """The ingress scenario's Notifies without the gateway: ``threads`` threads (the
    gateway's request threads) share one MQTT 5 connection served by paho's own network
    thread (``loop_start``), as the gateway's publisher shares one; its in-flight window
    is the Receive Maximum the broker grants, as the adapter's is (paho's default is 20).
    Each thread publishes ``bodies`` (one Notify's messages) at QoS 1 to one topic under a
    prefix of its own (as the gateway maps the scenario's one topic), with the Content
    Type and Payload Format Indicator the adapter sets (one shared properties object: the
    adapter also sends each message's id as a user property, which it packs itself), and
    waits for every PUBACK (``wait_for_publish``), again and again for ``seconds``
    (``bench.raw_ingress.run``).  Returns ``{"rps": Notifies/s, "msgs_per_s": ...}``."""
    host, port = _host_port(url)
    topic = f"bench-raw{uuid.uuid4().hex[:8]}/ingress"
    client = _client(f"bench-raw-ingress-{uuid.uuid4().hex[:8]}")
    # paho takes its window before connecting only: ask the broker on a connection first
    client.max_inflight_messages_set(_receive_maximum(host, port))
    connected = threading.Event()
    client.on_connect = lambda *args: connected.set()
    client.connect(host, port)
    client.loop_start()
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    props.ContentType = "application/xml"
    props.PayloadFormatIndicator = 1

    def notify() -> None:
        infos = [client.publish(topic, body, qos=1, properties=props) for body in bodies]
        for info in infos:
            info.wait_for_publish(30)
            if not info.is_published():
                raise RuntimeError("raw paho ingress: no PUBACK in 30 s")

    try:
        if not connected.wait(30):
            raise RuntimeError("raw paho ingress: no CONNACK in 30 s")
        # warm: one round trip on the connection
        client.publish(topic, bodies[0], qos=1).wait_for_publish(30)
        return raw_ingress.run(notify, len(bodies), seconds, threads, "paho-mqtt")
    finally:
        client.disconnect()
        client.loop_stop()
