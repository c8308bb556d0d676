"""Publishing to the broker (QoS 1, confirmed by PUBACK) and reading retained messages.

One clean (non-persistent) connection per gateway instance, apart from the session, so
that publishing never waits behind the session's traffic, run by the adapter's own network
loop (:class:`~.driver.Driver`).  ``publish_many`` puts a Notify's messages at the end of
one FIFO of messages to send (in one step), wakes the driver's thread (unless it is awake
already) and waits once for the whole batch.  The driver's thread is the only one that
touches the socket: it sends what the window of unacknowledged messages allows (the
broker's Receive Maximum, at most ``publish_window``), reads the PUBACKs, completes the
batches whose last PUBACK came and, in the same pass, sends the next messages of the FIFO
into the room the PUBACKs made: the window stays full under load without waking any
request thread per message, and the messages of one Notify are sent in their order.

A PUBACK with a failure reason (MQTT 5: not authorized, quota exceeded, payload format
invalid, ...) is a ``PublishFailed``, and "no matching subscribers" gives
``routed=False``.  While the connection is down a publish fails at once
(``AdapterUnavailable``), and every batch still waiting fails as soon as the connection is
lost; paho still sends what it had sent again after reconnecting, so a publisher that
retries can cause a duplicate (at-least-once), never a loss.

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
from collections import deque
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

__all__ = ["PublishRefused", "Publisher", "Retained"]

log = logging.getLogger("wsnmom.adapters.mqtt")

try:
    from paho.mqtt.subscribeoptions import SubscribeOptions
except ImportError as exc:  # pragma: no cover - link.py raised already
    raise ImportError('the MQTT adapter needs paho-mqtt: pip install "wsnmom[mqtt]"') from exc

#: PUBACK reason "no matching subscribers" (MQTT 5): accepted, nobody received it
_NO_SUBSCRIBERS = 0x10
#: PUBACK reasons that will not change when the message is sent again: not authorized,
#: topic name invalid, packet too large, payload format invalid (MQTT 5)
_REFUSED_FOR_GOOD = frozenset({0x87, 0x90, 0x95, 0x99})


class PublishRefused(PublishFailed):
    """The broker (or its limits, known from CONNACK) refuses this message for good:
    sending it again would be refused again."""


#: unacknowledged messages before the first CONNACK says what the broker takes
_DEFAULT_WINDOW = 20


@dataclass
class Retained:
    """A retained message read back from the broker."""

    payload: bytes
    properties: Any


@dataclass(eq=False)
class _Batch:
    """The messages of one ``publish_many`` call, waiting for their PUBACKs."""

    remaining: int
    reasons: list[ReasonCode | None]
    #: publish with RETAIN
    retain: bool = True
    done: threading.Event = field(default_factory=threading.Event)
    error: Exception | None = None

    def fail(self, error: Exception) -> None:
        if self.error is None and self.remaining:
            self.error = error
            self.done.set()


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
            own_loop=True,
            after_read=self._pump,
        )
        client = self.link.client
        # the window of unacknowledged messages is ours (``_limit``): paho's own is fixed
        # when it connects, while the broker says its Receive Maximum only then
        client.max_inflight_messages_set(0)
        client.on_publish = self._publish_cb
        client.on_message = self._message_cb
        client.on_unsubscribe = self._unsubscribe_cb
        self._read_lock = threading.Lock()
        self._lock = threading.Lock()
        self._read: _Read | None = None
        self._unsub_mid: int | None = None
        #: the largest packet the broker accepts (MQTT 5 CONNACK), None when unknown
        self.max_packet_size: int | None = None
        #: messages waiting for room in the window: (batch, index, topic, body, properties);
        #: request threads add to it, the driver's thread takes from it
        self._pending: deque[tuple[_Batch, int, str, bytes, Any]] = deque()
        #: the driver was woken and has not looked at ``_pending`` since
        self._kicked = False
        # the rest belongs to the driver's thread (``link.io_lock``):
        #: messages sent and not acknowledged, by packet id: (batch, index)
        self._sent: dict[int, tuple[_Batch, int]] = {}
        #: QoS 1 messages sent and not acknowledged, and how many the broker takes
        self._inflight = 0
        self._limit = _DEFAULT_WINDOW
        #: the most messages that were unacknowledged at once (stats)
        self.peak_inflight = 0

    @property
    def window(self) -> int:
        """How many messages may be unacknowledged at once on this connection."""
        return self._limit

    def start(self) -> None:
        """Connect; see ``Link.start``."""
        self.link.start(self.settings.connect_timeout)

    def stop(self) -> None:
        self.link.stop()

    # -- publishing -------------------------------------------------------------------------
    def publish_many(
        self,
        items: Sequence[tuple[str, OutboundMessage]],
        timeout: float,
        *,
        retain: bool | None = None,
    ) -> list[PublishReceipt]:
        """Publish each (MQTT topic, message) with QoS 1 and wait for every PUBACK; with
        RETAIN as ``retain`` says (None: the setting ``retain``)."""
        return [self._receipt(reason) for reason in self._publish(items, timeout, retain)]

    def publish_each(
        self,
        items: Sequence[tuple[str, OutboundMessage]],
        timeout: float,
        *,
        retain: bool | None = None,
    ) -> list[PublishReceipt | PublishRefused]:
        """``publish_many``, except that a message the broker refuses for good
        (``PublishRefused``) is answered in its place instead of failing the others;
        any other failure (a lost connection, no PUBACK in time, a refusal that may
        pass later) still raises for the whole batch."""
        refused: dict[int, PublishRefused] = {}
        reasons = self._publish(items, timeout, retain, refused)
        out: list[PublishReceipt | PublishRefused] = []
        for i, reason in enumerate(reasons):
            if i in refused:
                out.append(refused[i])
                continue
            try:
                out.append(self._receipt(reason))
            except PublishRefused as exc:
                out.append(exc)
        return out

    def _publish(
        self,
        items: Sequence[tuple[str, OutboundMessage]],
        timeout: float,
        retain: bool | None,
        refused: dict[int, PublishRefused] | None = None,
    ) -> list[ReasonCode | None]:
        """Send ``items`` and wait for their PUBACKs; each one's reason code (None: not
        sent, or MQTT 3.1.1).  ``refused`` None: a message too large raises; else it is
        put there by its index and not sent."""
        if not self.link.connected:
            raise AdapterUnavailable("the MQTT broker is not connected")
        limit = self.max_packet_size
        largest = self.settings.max_message_bytes
        v5 = self.settings.v5
        keep = self.settings.retain if retain is None else retain
        reasons: list[ReasonCode | None] = [None] * len(items)
        sending: list[tuple[int, str, OutboundMessage]] = []
        for i, (name, message) in enumerate(items):
            problem: PublishRefused | None = None
            if limit is not None and len(message.body) + len(name) + 64 > limit:
                problem = PublishRefused(
                    f"the message is too large for the broker ({len(message.body)} bytes, "
                    f"packets of at most {limit} bytes)"
                )
            elif largest is not None and len(message.body) > largest:
                problem = PublishRefused(
                    f"the message has {len(message.body)} bytes, max_message_bytes is {largest}"
                )
            if problem is None:
                sending.append((i, name, message))
            elif refused is None:
                raise problem
            else:
                refused[i] = problem
        if not sending:
            return reasons
        batch = _Batch(len(sending), reasons, keep)
        entries = [
            (batch, i, name, message.body, publish_properties(message) if v5 else None)
            for i, name, message in sending
        ]
        # deque.extend of a list is one step for other threads: a batch is never split
        self._pending.extend(entries)
        if not self._kicked:
            self._kicked = True
            self.link.wake()
        if not batch.done.wait(timeout):
            batch.fail(PublishFailed(f"the MQTT broker did not confirm within {timeout:g}s"))
        if batch.error is not None:
            raise batch.error
        return batch.reasons

    def _pump(self) -> None:
        """Send waiting messages while the window has room (the driver's thread)."""
        self._kicked = False  # before looking: a batch added from now on wakes us again
        pending = self._pending
        if not pending:
            return
        client = self.link.client
        while pending and self._inflight < self._limit:
            batch, i, name, body, props = pending.popleft()
            if batch.error is not None:
                continue
            try:
                info = client.publish(name, body, qos=1, retain=batch.retain, properties=props)
            except ValueError as exc:  # an illegal topic or a payload beyond MQTT's limit
                batch.fail(PublishFailed(f"the MQTT client refused the message: {exc}"))
                continue
            rc = info.rc
            if rc not in (mqtt.MQTT_ERR_SUCCESS, mqtt.MQTT_ERR_NO_CONN):
                batch.fail(PublishFailed(f"publishing failed: {mqtt.error_string(rc)}"))
                continue
            # paho keeps a message it could not send and sends it after reconnecting: it
            # takes a place in the broker's window then
            self._inflight += 1
            if self._inflight > self.peak_inflight:
                self.peak_inflight = self._inflight
            self._sent[info.mid] = (batch, i)
            if rc == mqtt.MQTT_ERR_NO_CONN:
                batch.fail(AdapterUnavailable("the connection to the MQTT broker was lost"))

    def _receipt(self, reason: ReasonCode | None) -> PublishReceipt:
        if not self.settings.v5 or reason is None:
            return PublishReceipt(routed=None)
        if reason.is_failure:
            if reason.value in _REFUSED_FOR_GOOD:
                raise PublishRefused(f"the MQTT broker refused the message ({reason})")
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
            with self.link.io_lock, self._lock:
                self._read = read
                if self.settings.v5:
                    options = SubscribeOptions(qos=0, retainHandling=0)
                    rc, _ = client.subscribe(name, options=options)
                else:
                    rc, _ = client.subscribe(name, qos=0)
                if rc == mqtt.MQTT_ERR_SUCCESS:
                    rc, self._unsub_mid = client.unsubscribe(name)
                self.link.wake()
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
        self._limit = max(1, min(limit, self.settings.publish_window))

    def _disconnected_cb(self) -> None:
        with self._lock:
            read = self._read
        if read is not None:
            read.lost = True
            read.done.set()
        lost = AdapterUnavailable("the connection to the MQTT broker was lost before it confirmed")
        with self.link.io_lock:
            for batch, *_ in self._pending:
                batch.fail(lost)
            self._pending.clear()
            for batch, _ in self._sent.values():
                batch.fail(lost)

    def _publish_cb(
        self, client: Any, userdata: Any, mid: int, reason: ReasonCode, properties: Any
    ) -> None:
        # the driver's thread, ``io_lock`` held (inside ``loop_read``)
        if self._inflight > 0:
            self._inflight -= 1
        sent = self._sent.pop(mid, None)
        if sent is None:
            return
        batch, i = sent
        batch.reasons[i] = reason
        batch.remaining -= 1
        if not batch.remaining and batch.error is None:
            batch.done.set()

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
