"""Publishing to the broker (QoS 1, confirmed by PUBACK) and reading retained messages.

One clean (non-persistent) connection per gateway instance, apart from the session, so
that publishing never waits behind the session's traffic.  ``publish_many`` sends every
message and then waits for each PUBACK; a PUBACK with a failure reason (MQTT 5: not
authorized, quota exceeded, payload format invalid, ...) is a ``PublishFailed``, and "no
matching subscribers" gives ``routed=False``.  While the connection is down a publish
fails at once (``AdapterUnavailable``), and one that is waiting fails as soon as the
connection is lost; paho may still deliver such a message after reconnecting, so a
publisher that retries can cause a duplicate (at-least-once), never a loss.

GetCurrentMessage reads the retained message of one topic on the same connection:
SUBSCRIBE (QoS 0, retained messages sent) and UNSUBSCRIBE, then the retained message, if
any, has arrived before the UNSUBACK (brokers send it right after the SUBACK;
``retained_wait`` waits longer for brokers that do not).  Reads are serialised; they are
rare.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from wsnmom.core.adapter import (
    AdapterUnavailable,
    OutboundMessage,
    PublishFailed,
    PublishReceipt,
)

from .config import MqttSettings
from .link import Link, ReasonCode, mqtt
from .wire import publish_properties

__all__ = ["Publisher", "Retained"]

log = logging.getLogger("wsnmom.adapters.mqtt")

try:
    from paho.mqtt.subscribeoptions import SubscribeOptions
except ImportError as exc:  # pragma: no cover - link.py raised already
    raise ImportError('the MQTT adapter needs paho-mqtt: pip install "wsnmom[mqtt]"') from exc

#: PUBACK reason "no matching subscribers" (MQTT 5): accepted, nobody received it
_NO_SUBSCRIBERS = 0x10
#: seconds between two checks of the connection while waiting for a PUBACK
_POLL = 0.05
#: unacknowledged messages before the first CONNACK says what the broker takes
_DEFAULT_WINDOW = 20


@dataclass
class Retained:
    """A retained message read back from the broker."""

    payload: bytes
    properties: Any


@dataclass(eq=False)
class _Read:
    """One retained-message read in progress."""

    topic: str
    found: Retained | None = None
    done: threading.Event = field(default_factory=threading.Event)
    #: the connection was lost before the broker answered
    lost: bool = False


class Publisher:
    """The publishing connection (see the module docstring)."""

    def __init__(self, settings: MqttSettings, client_id: str) -> None:
        self.settings = settings
        self.link = Link(
            settings,
            client_id,
            persistent=False,
            on_connected=self._connected_cb,
            on_disconnected=self._disconnected_cb,
            label="MQTT publisher",
        )
        client = self.link.client
        # the window of unacknowledged messages is ours (``_window``): paho's own is fixed
        # when it connects, while the broker says its Receive Maximum only then
        client.max_inflight_messages_set(0)
        client.on_publish = self._publish_cb
        client.on_message = self._message_cb
        client.on_unsubscribe = self._unsubscribe_cb
        #: PUBACK reason codes by packet id, written before paho marks a message published
        self._reasons: dict[int, ReasonCode] = {}
        self._read_lock = threading.Lock()
        self._lock = threading.Lock()
        self._read: _Read | None = None
        self._unsub_mid: int | None = None
        #: the largest packet the broker accepts (MQTT 5 CONNACK), None when unknown
        self.max_packet_size: int | None = None
        #: QoS 1 messages sent and not acknowledged, and how many the broker takes
        self._window = threading.Condition()
        self._inflight = 0
        self._limit = _DEFAULT_WINDOW

    def start(self) -> None:
        """Connect; see ``Link.start``."""
        self.link.start(self.settings.connect_timeout)

    def stop(self) -> None:
        self.link.stop()

    # -- publishing -------------------------------------------------------------------------
    def publish_many(
        self, items: Sequence[tuple[str, OutboundMessage]], timeout: float
    ) -> list[PublishReceipt]:
        """Publish each (MQTT topic, message) with QoS 1 and wait for every PUBACK."""
        if not self.link.connected:
            raise AdapterUnavailable("the MQTT broker is not connected")
        limit = self.max_packet_size
        client = self.link.client
        deadline = time.monotonic() + timeout
        retain = self.settings.retain
        v5 = self.settings.v5
        infos: list[Any] = []
        largest = self.settings.max_message_bytes
        for name, message in items:
            if limit is not None and len(message.body) + len(name) + 64 > limit:
                raise PublishFailed(
                    f"the message is too large for the broker ({len(message.body)} bytes, "
                    f"packets of at most {limit} bytes)"
                )
            if largest is not None and len(message.body) > largest:
                raise PublishFailed(
                    f"the message has {len(message.body)} bytes, max_message_bytes is {largest}"
                )
            props = publish_properties(message) if v5 else None
            self._acquire(deadline, timeout)
            try:
                info = client.publish(name, message.body, qos=1, retain=retain, properties=props)
            except ValueError as exc:  # an illegal topic or a payload beyond MQTT's limit
                self._release()
                raise PublishFailed(f"the MQTT client refused the message: {exc}") from exc
            if info.rc == mqtt.MQTT_ERR_NO_CONN:
                raise AdapterUnavailable("the connection to the MQTT broker was lost")
            if info.rc not in (mqtt.MQTT_ERR_SUCCESS, mqtt.MQTT_ERR_AGAIN):
                raise PublishFailed(f"publishing failed: {mqtt.error_string(info.rc)}")
            infos.append(info)
        receipts: list[PublishReceipt] = []
        for info in infos:
            while not info.is_published():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise PublishFailed(f"the MQTT broker did not confirm within {timeout:g}s")
                if not self.link.connected:
                    raise AdapterUnavailable(
                        "the connection to the MQTT broker was lost before it confirmed"
                    )
                info.wait_for_publish(min(remaining, _POLL))
            receipts.append(self._receipt(self._reasons.pop(info.mid, None)))
        return receipts

    def _acquire(self, deadline: float, timeout: float) -> None:
        """Wait for room in the window of unacknowledged messages."""
        with self._window:
            while self._inflight >= self._limit:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise PublishFailed(f"the MQTT broker did not confirm within {timeout:g}s")
                if not self.link.connected:
                    raise AdapterUnavailable("the connection to the MQTT broker was lost")
                self._window.wait(min(remaining, _POLL))
            self._inflight += 1

    def _release(self) -> None:
        with self._window:
            self._inflight -= 1
            self._window.notify()

    def _receipt(self, reason: ReasonCode | None) -> PublishReceipt:
        if not self.settings.v5 or reason is None:
            return PublishReceipt(routed=None)
        if reason.is_failure:
            raise PublishFailed(f"the MQTT broker refused the message ({reason})")
        return PublishReceipt(routed=reason.value != _NO_SUBSCRIBERS)

    # -- retained messages ------------------------------------------------------------------
    def retained(self, name: str, timeout: float) -> Retained | None:
        """The message retained on MQTT topic ``name``, None when there is none."""
        if not self.link.connected:
            raise AdapterUnavailable("the MQTT broker is not connected")
        client = self.link.client
        with self._read_lock:
            read = _Read(name)
            with self._lock:
                self._read = read
                if self.settings.v5:
                    options = SubscribeOptions(qos=0, retainHandling=0)
                    rc, _ = client.subscribe(name, options=options)
                else:
                    rc, _ = client.subscribe(name, qos=0)
                if rc == mqtt.MQTT_ERR_SUCCESS:
                    rc, self._unsub_mid = client.unsubscribe(name)
            try:
                if rc != mqtt.MQTT_ERR_SUCCESS:
                    raise AdapterUnavailable("the connection to the MQTT broker was lost")
                if not read.done.wait(timeout):
                    raise AdapterUnavailable(f"the MQTT broker did not answer within {timeout:g}s")
                if read.lost:
                    raise AdapterUnavailable("the connection to the MQTT broker was lost")
                if read.found is None and self.settings.retained_wait > 0:
                    time.sleep(self.settings.retained_wait)
            finally:
                with self._lock:
                    self._read = None
                    self._unsub_mid = None
            return read.found

    # -- paho callbacks (network thread) ---------------------------------------------------
    def _connected_cb(self, session_present: bool, properties: Any) -> None:
        size = getattr(properties, "MaximumPacketSize", None) if properties is not None else None
        self.max_packet_size = int(size) if size else None
        if self.settings.v5:
            # MQTT 5: absent means 65,535; what paho resends after a reconnect (at most the
            # old window) goes out at once, so the window never shrinks below it
            receive_max = getattr(properties, "ReceiveMaximum", None) if properties else None
            limit = int(receive_max) if receive_max else 65_535
        else:
            limit = self.settings.publish_window
        with self._window:
            self._limit = max(1, min(limit, self.settings.publish_window))
            self._window.notify_all()

    def _disconnected_cb(self) -> None:
        with self._lock:
            read = self._read
        if read is not None:
            read.lost = True
            read.done.set()
        with self._window:
            self._window.notify_all()  # window waiters check the connection

    def _publish_cb(
        self, client: Any, userdata: Any, mid: int, reason: ReasonCode, properties: Any
    ) -> None:
        # called under paho's message lock, before the message is marked published; the
        # window's lock is never held while paho is called
        self._reasons[mid] = reason
        self._release()

    def _message_cb(self, client: Any, userdata: Any, message: Any) -> None:
        with self._lock:
            read = self._read
        if read is not None and message.retain and message.topic == read.topic:
            read.found = Retained(bytes(message.payload), message.properties)

    def _unsubscribe_cb(
        self, client: Any, userdata: Any, mid: int, reasons: Any, properties: Any
    ) -> None:
        with self._lock:
            read = self._read if mid == self._unsub_mid else None
        if read is not None:
            read.done.set()
