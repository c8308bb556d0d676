"""Every retained message under one MQTT topic filter, read with a short-lived clean
session (cluster mode lists its subscription sessions' records with it:
:meth:`.cluster_sessions.SubscriptionSessions.names`).

The session subscribes the filter (QoS 0, retained messages sent) and unsubscribes it
at once; Mosquitto sends the retained messages a SUBSCRIBE brings before it answers the
UNSUBSCRIBE that follows, so the UNSUBACK ends the read.  The session then disconnects
(clean start, session expiry 0: nothing stays on the broker).
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

from wsnmom.core.adapter import AdapterUnavailable

from .config import MqttSettings
from .link import Link, mqtt

__all__ = ["retained_under"]

try:
    from paho.mqtt.subscribeoptions import SubscribeOptions
except ImportError as exc:  # pragma: no cover - link.py raised already
    raise ImportError('the MQTT adapter needs paho-mqtt: pip install "wsnmom[mqtt]"') from exc


class _Scan:
    """What one read has seen (paho's network thread writes, the reader waits)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.found: dict[str, bytes] = {}
        self.unsub_mid: int | None = None
        self.done = threading.Event()

    def message(self, client: Any, userdata: Any, message: Any) -> None:
        if not message.retain:
            return  # published meanwhile: not a record kept by the broker
        try:
            name = str(message.topic)
        except UnicodeDecodeError:
            return
        with self.lock:
            if message.payload:
                self.found[name] = bytes(message.payload)

    def unsubscribed(self, client: Any, userdata: Any, mid: int, *rest: Any) -> None:
        with self.lock:
            if mid == self.unsub_mid:
                self.done.set()


def retained_under(
    settings: MqttSettings, client_id_head: str, topic_filter: str, timeout: float
) -> dict[str, bytes]:
    """The retained messages under ``topic_filter`` (MQTT topic -> payload), read by a
    clean session whose client id starts with ``client_id_head``.  AdapterUnavailable
    when the broker cannot be reached or does not answer within ``timeout``."""
    scan = _Scan()
    link = Link(
        settings,
        f"{client_id_head}-r{uuid.uuid4().hex[:8]}",
        persistent=False,
        label="MQTT record scan",
        reconnect=False,
    )
    client = link.client
    client.on_message = scan.message
    client.on_unsubscribe = scan.unsubscribed
    link.start(settings.connect_timeout)
    try:
        with link.io_lock, scan.lock:
            if settings.v5:
                options = SubscribeOptions(qos=0, retainHandling=0)
                rc, _ = client.subscribe(topic_filter, options=options)
            else:
                rc, _ = client.subscribe(topic_filter, qos=0)
            if rc == mqtt.MQTT_ERR_SUCCESS:
                rc, scan.unsub_mid = client.unsubscribe(topic_filter)
        link.wake()
        if rc != mqtt.MQTT_ERR_SUCCESS:
            raise AdapterUnavailable("the connection to the MQTT broker was lost")
        if not scan.done.wait(timeout):
            raise AdapterUnavailable(f"the MQTT broker did not answer within {timeout:g}s")
        with scan.lock:
            return dict(scan.found)
    finally:
        link.stop()
