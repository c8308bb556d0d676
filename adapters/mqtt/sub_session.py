"""One connection to one subscription's persistent MQTT session (cluster mode,
docs/scale-out.md "MQTT in cluster mode").

In cluster mode every durable subscription is a persistent session of its own on the
broker (a fixed client id, clean start false, QoS 1): the broker's session is the queue.
A :class:`SessionConnection` is one connection to such a session: it connects (taking
the session over from any other connection with the client id: the broker closes that
one), subscribes the subscription's filters (QoS 1, Retain Handling 2: retained messages
are not new notifications) and hands what arrives to its consumer as :class:`Delivery`
objects, core's ``Received``.

**PUBACKs leave in arrival order** (MQTT-4.6.0-2): ``ack`` marks a message settled, and
every settled message at the head of the arrival order is acknowledged; a message acked
before an earlier one waits for it.  A PUBACK belongs to the connection the message came
on: once the connection is gone its messages acknowledge nothing (the broker sends them
again to the next connection, with DUP).  Messages that arrive with the RETAIN flag, and
those a filter brought that the subscription's own patterns reject (a widened filter,
a filter left by an earlier definition), are settled on arrival and never handed out.

A connection **never reconnects by itself**: Mosquitto 2.0.11 closes a taken-over
connection without saying why (no MQTT 5 DISCONNECT 0x8E), exactly as a network failure
looks, and a connection that came back on its own would take the session from the
subscription's new deliverer.  ``on_lost`` tells the owner (:mod:`.cluster_handle`),
which decides.  A connection without a consumer (a declaring one: :meth:`open` then
:meth:`close`) acknowledges nothing it receives meanwhile; the broker sends those
messages again to the next connection.

The connections of an instance share its :class:`~.hub.Hub`'s network thread (without
one, each runs on a :class:`~.driver.Driver` of its own).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from wsnmom.core.adapter import AccessRefused, AdapterUnavailable, Received
from wsnmom.topic_mapping.model import Topic

from .config import MqttSettings
from .hub import Hub
from .link import Link, Properties, mqtt
from .mapping import MqttMapping
from .wire import metadata

__all__ = ["Delivery", "SessionConnection"]

log = logging.getLogger("wsnmom.adapters.mqtt")

try:
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.subscribeoptions import SubscribeOptions
except ImportError as exc:  # pragma: no cover - link.py raised already
    raise ImportError('the MQTT adapter needs paho-mqtt: pip install "wsnmom[mqtt]"') from exc


class Delivery(Received):
    """One QoS 1 message of a subscription session, settled once by its consumer."""

    __slots__ = (
        "_conn",
        "_generation",
        "_handed",
        "_mid",
        "_settled",
        "body",
        "content_type",
        "headers",
        "redelivered",
        "timestamp",
        "topic",
    )

    def __init__(
        self,
        conn: SessionConnection,
        generation: int,
        mid: int,
        topic: Topic,
        body: bytes,
        headers: dict[str, str],
        content_type: str,
        redelivered: bool,
    ) -> None:
        self._conn = conn
        self._generation = generation
        self._mid = mid
        self._settled = False
        #: handed to the consumer (counts against the window until settled)
        self._handed = False
        self.topic = topic
        self.body = body
        self.headers = headers
        self.content_type = content_type
        self.redelivered = redelivered
        self.timestamp = datetime.now(UTC)

    def ack(self) -> None:
        """Done: the PUBACK goes out once every earlier message was acknowledged."""
        self._conn._settle(self)

    def nack(self, requeue: bool = True) -> None:
        """Requeue: MQTT has no per-message requeue, so the connection is dropped and the
        broker sends every unacknowledged message again, in order, to the next one
        (``on_requeue``).  Without ``requeue``: dropped (acknowledged in its turn)."""
        if requeue:
            self._conn._requeue(self)
        else:
            self._conn._settle(self)


Consumer = Callable[[Received], None]


class SessionConnection:
    """See the module docstring.  ``accepts(topic)``: the subscription's own patterns;
    ``consumer``: None for a declaring connection; ``on_lost()`` when the connection ends
    other than by :meth:`close`; ``on_requeue()`` when a message is nacked for requeue
    (the owner drops this connection and opens another)."""

    def __init__(
        self,
        settings: MqttSettings,
        client_id: str,
        mapping: MqttMapping,
        accepts: Callable[[Topic], bool],
        *,
        consumer: Consumer | None = None,
        receive_maximum: int | None = None,
        on_lost: Callable[[], None] | None = None,
        on_requeue: Callable[[], None] | None = None,
        persistent: bool = True,
        hub: Hub | None = None,
    ) -> None:
        self.settings = settings
        self.client_id = client_id
        self.mapping = mapping
        self._accepts = accepts
        self._consumer = consumer
        self._on_lost = on_lost
        self._on_requeue = on_requeue
        self._lock = threading.Condition()
        #: messages in arrival order, until acknowledged
        self._order: collections.deque[Delivery] = collections.deque()
        #: bumped when the connection ends: a settlement of an older one acknowledges
        #: nothing
        self._generation = 0
        self._pending: dict[int, str] = {}
        self._refused: dict[str, str] = {}
        self._unsubscribed: dict[int, threading.Event] = {}
        self._closing = False
        #: messages handed to the consumer at most at once (the Receive Maximum asked
        #: for; Mosquitto 2.0.11 sends more once PUBACKs flow: those wait in ``_held``)
        self._window = receive_maximum or settings.receive_maximum
        self._outstanding = 0
        self._held: collections.deque[Delivery] = collections.deque()
        self._dispatching = False
        #: a message was nacked for requeue (``on_requeue`` called)
        self._requeued = False
        #: the most messages received and not acknowledged at once on this connection
        self.peak_unacknowledged = 0
        self._closing = False
        #: the connection ended (taken over, lost, or closed)
        self.lost = False
        self.received = 0
        self.acked = 0
        self.link = Link(
            settings,
            client_id,
            persistent=persistent,
            manual_ack=True,
            on_disconnected=self._disconnected,
            label=f"MQTT subscription session {client_id}",
            reconnect=False,
            receive_maximum=receive_maximum,
            hub=hub,
        )
        client = self.link.client
        client.on_message = self._message
        client.on_subscribe = self._subscribed
        client.on_unsubscribe = self._unsubscribed_cb

    # -- lifecycle --------------------------------------------------------------------------
    def connect(self) -> bool:
        """Connect (the broker cuts any other connection of the client id off); returns
        whether the broker still had the session (CONNACK session present).
        AdapterUnavailable when :meth:`close` or :meth:`end` came first or meanwhile (from
        another thread: the owner gave the connection up)."""
        with self._lock:
            if self._closing:
                raise AdapterUnavailable(f"{self.client_id}: closed before it connected")
        self.link.start(self.settings.connect_timeout)
        with self._lock:
            closing = self._closing
        if closing:
            # closed while the CONNECT was under way, before the link could be stopped
            self.link.stop()
            raise AdapterUnavailable(f"{self.client_id}: closed while it connected")
        return self.link.session_present

    def subscribe(self, filters: Iterable[str], timeout: float | None = None) -> None:
        """Subscribe ``filters`` (QoS 1, retained messages not sent) and wait for their
        SUBACKs: AdapterUnavailable when the connection ends or the broker does not answer
        in time, AccessRefused when it refuses one."""
        wanted = sorted(filters)
        if not wanted:
            return
        wait = self.settings.subscribe_timeout if timeout is None else timeout
        client = self.link.client
        # lock order: the client's io_lock, then this connection's (as the network
        # thread, which holds the io_lock while it reads, takes them)
        with self.link.io_lock, self._lock:
            for f in wanted:
                options = SubscribeOptions(qos=1, noLocal=False, retainHandling=2)
                rc, mid = client.subscribe(f, options=options)
                if rc != mqtt.MQTT_ERR_SUCCESS or mid is None:
                    raise AdapterUnavailable(f"{self.client_id}: cannot subscribe {f!r} now")
                self._pending[mid] = f
        self.link.wake()
        with self._lock:
            done = self._lock.wait_for(
                lambda: not self._pending or self.lost or self._closing, wait
            )
            refused = [(f, r) for f, r in self._refused.items() if f in wanted]
            lost = self.lost or self._closing
        if refused:
            f, reason = refused[0]
            raise AccessRefused(f"the MQTT broker refused the subscription to {f!r}: {reason}")
        if lost or not done:
            raise AdapterUnavailable(
                f"{self.client_id}: the broker did not acknowledge the subscription"
                + (" (connection lost)" if lost else f" within {wait:g}s")
            )

    def unsubscribe(self, filters: Iterable[str], timeout: float | None = None) -> None:
        """Unsubscribe ``filters`` and wait for the UNSUBACK."""
        gone = sorted(filters)
        if not gone:
            return
        wait = self.settings.subscribe_timeout if timeout is None else timeout
        done = threading.Event()
        with self.link.io_lock, self._lock:
            rc, mid = self.link.client.unsubscribe(gone)
            if rc != mqtt.MQTT_ERR_SUCCESS or mid is None:
                raise AdapterUnavailable(f"{self.client_id}: cannot unsubscribe now")
            self._unsubscribed[mid] = done
        self.link.wake()
        if not done.wait(wait) or self.lost:
            raise AdapterUnavailable(f"{self.client_id}: the broker did not acknowledge it")

    def close(self) -> None:
        """Disconnect cleanly (what is not acknowledged stays in the session); idempotent."""
        with self._lock:
            self._closing = True
            self._generation += 1
            self._order.clear()
            self._held.clear()
            self._lock.notify_all()  # a subscribe waiting for its SUBACK gives up
        self.link.stop()

    def end(self) -> None:
        """Disconnect and have the broker drop the session (MQTT 5 DISCONNECT with
        session expiry 0): its subscriptions and messages are gone."""
        with self._lock:
            self._closing = True
            self._generation += 1
            self._order.clear()
        props = Properties(PacketTypes.DISCONNECT)  # type: ignore[no-untyped-call]
        props.SessionExpiryInterval = 0
        with contextlib.suppress(Exception), self.link.io_lock:
            self.link.client.disconnect(properties=props)
        self.link.wake()
        self.link.stop()

    @property
    def unacknowledged(self) -> int:
        """Messages received on this connection and not acknowledged yet."""
        with self._lock:
            return len(self._order)

    # -- settling ---------------------------------------------------------------------------
    def _settle(self, d: Delivery) -> None:
        with self.link.io_lock, self._lock:
            if d._generation != self._generation or d._settled:
                return
            d._settled = True
            if d._handed:
                self._outstanding -= 1
            self._ack_ready()
        self.link.wake()
        self._dispatch()

    def _dispatch(self) -> None:
        """Hand held messages to the consumer, in arrival order, while the window has
        room; one thread at a time does it (the others only queue)."""
        with self._lock:
            if self._dispatching:
                return
            self._dispatching = True
        try:
            while True:
                with self._lock:
                    if (
                        not self._held
                        or self._outstanding >= self._window
                        or self._consumer is None
                    ):
                        self._dispatching = False
                        return
                    d = self._held.popleft()
                    if d._generation != self._generation:
                        continue
                    d._handed = True
                    self._outstanding += 1
                    consumer = self._consumer
                consumer(d)
        except BaseException:
            with self._lock:
                self._dispatching = False
            raise

    def _ack_ready(self) -> None:
        """Acknowledge, in arrival order, every settled message at the head (the client's
        io_lock and this connection's lock held, in that order)."""
        order = self._order
        if not order or not order[0]._settled:
            return
        client = self.link.client
        while order and order[0]._settled:
            d = order.popleft()
            client.ack(d._mid, 1)
            self.acked += 1
        self._lock.notify_all()

    def _requeue(self, d: Delivery) -> None:
        with self._lock:
            if d._generation != self._generation or d._settled or self._requeued:
                return
            # once: the owner drops this connection, which gives back every message
            self._requeued = True
        if self._on_requeue is not None:
            self._on_requeue()

    # -- paho callbacks (network thread; never block) ---------------------------------------
    def _message(self, client: Any, userdata: Any, message: Any) -> None:
        if message.qos == 0:
            return  # subscribed at QoS 1: nothing to acknowledge
        body = bytes(message.payload)
        headers, content_type = metadata(message.properties if self.settings.v5 else None, body)
        try:
            name = str(message.topic)
        except UnicodeDecodeError:
            name = ""
        topic = self.mapping.topic(name, headers)
        with self.link.io_lock, self._lock:
            if self._closing or self.lost:
                return
            self.received += 1
            d = Delivery(
                self,
                self._generation,
                message.mid,
                topic,
                body,
                headers,
                content_type,
                bool(message.dup),
            )
            self._order.append(d)
            self.peak_unacknowledged = max(self.peak_unacknowledged, len(self._order))
            if self._consumer is None:
                return  # a declaring connection: the next connection gets it again
            if message.retain or not self._accepts(topic):
                d._settled = True
                self._ack_ready()
                return
            self._held.append(d)
        self._dispatch()

    def _subscribed(
        self, client: Any, userdata: Any, mid: int, reasons: Sequence[Any], props: Any
    ) -> None:
        with self._lock:
            f = self._pending.pop(mid, None)
            reason = reasons[0] if reasons else None
            if f is not None and reason is not None and getattr(reason, "is_failure", False):
                self._refused[f] = str(reason)
            self._lock.notify_all()

    def _unsubscribed_cb(
        self, client: Any, userdata: Any, mid: int, reasons: Any, props: Any
    ) -> None:
        with self._lock:
            done = self._unsubscribed.pop(mid, None)
        if done is not None:
            done.set()

    def _disconnected(self) -> None:
        with self._lock:
            self._generation += 1
            self._order.clear()
            self._held.clear()
            for done in self._unsubscribed.values():
                done.set()
            self._unsubscribed.clear()
            report = not self._closing and not self.lost
            self.lost = True
            self._lock.notify_all()
        if report and self._on_lost is not None:
            self._on_lost()
