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

The connections of an instance share its :class:`~.hub.Hub`'s network thread; each is a
:class:`~.sub_client.SessionClient` (the adapter's own MQTT 5 subscriber, not paho), which
hands over the PUBLISH packets of one read in one call (:meth:`SessionConnection.published`).
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Iterable
from datetime import UTC, datetime

from wsnmom.core.adapter import AccessRefused, AdapterUnavailable, Received
from wsnmom.topic_mapping.model import Topic

from .config import MqttSettings
from .hub import Hub
from .mapping import MqttMapping
from .reason_codes import reason_name
from .sub_client import SessionClient
from .sub_codec import Connack, Publish, SubAck
from .wire import metadata_of

__all__ = ["Delivery", "SessionConnection"]

log = logging.getLogger("wsnmom.adapters.mqtt")

#: Subscription Options of every filter: QoS 1, Retain Handling 2 (retained messages are
#: not sent: they are no new notifications), No Local and Retain As Published off
SUBSCRIBE_OPTIONS = 0x21


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

    @property
    def settleable(self) -> bool:
        """False once its connection is gone (ended, cut off, or a requeue dropped it):
        its PUBACK can no longer leave, and the broker sends it again to the next
        connection of the session."""
        return self._generation == self._conn._generation


Consumer = Callable[[Received], None]


class SessionConnection:
    """See the module docstring.  ``accepts(topic)``: the subscription's own patterns;
    ``consumer``: None for a declaring connection; ``on_lost()`` when the connection ends
    other than by :meth:`close`; ``on_requeue()`` when a message is nacked for requeue
    (the owner drops this connection and opens another).  Its ``connected``,
    ``published``, ``acknowledged`` and ``closed`` are its client's callbacks (the hub's
    thread, the client's ``io_lock`` held)."""

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
        hub: Hub,
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
        self._pending: dict[int, list[str]] = {}
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
        self.client = SessionClient(
            settings,
            client_id,
            self,
            hub,
            persistent=persistent,
            receive_maximum=self._window,
            label=f"MQTT subscription session {client_id}",
        )

    # -- lifecycle --------------------------------------------------------------------------
    def connect(self) -> bool:
        """Connect (the broker cuts any other connection of the client id off); returns
        whether the broker still had the session (CONNACK session present).
        AdapterUnavailable when :meth:`close` or :meth:`end` came first or meanwhile (from
        another thread: the owner gave the connection up)."""
        with self._lock:
            if self._closing:
                raise AdapterUnavailable(f"{self.client_id}: closed before it connected")
        present = self.client.start(self.settings.connect_timeout)
        with self._lock:
            closing = self._closing
        if closing:
            # closed while the CONNECT was under way, before the client could be closed
            self.client.close()
            raise AdapterUnavailable(f"{self.client_id}: closed while it connected")
        return present

    def subscribe(self, filters: Iterable[str], timeout: float | None = None) -> None:
        """Subscribe ``filters`` (QoS 1, retained messages not sent) and wait for their
        SUBACKs: AdapterUnavailable when the connection ends or the broker does not answer
        in time, AccessRefused when it refuses one."""
        wanted = sorted(filters)
        if not wanted:
            return
        wait = self.settings.subscribe_timeout if timeout is None else timeout
        client = self.client
        # lock order: the client's io_lock, then this connection's (as the network
        # thread, which holds the io_lock while it reads, takes them)
        with client.io_lock, self._lock:
            if not client.open:
                raise AdapterUnavailable(f"{self.client_id}: cannot subscribe now (not connected)")
            self._pending[client.subscribe(wanted, SUBSCRIBE_OPTIONS)] = wanted
        client.wake()
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
        client = self.client
        with client.io_lock, self._lock:
            if not client.open:
                raise AdapterUnavailable(f"{self.client_id}: cannot unsubscribe now")
            self._unsubscribed[client.unsubscribe(gone)] = done
        client.wake()
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
        self.client.close()

    def end(self) -> None:
        """Disconnect and have the broker drop the session (MQTT 5 DISCONNECT with
        session expiry 0): its subscriptions and messages are gone.  Returns once the
        broker read the DISCONNECT and closed (at most ``DRAIN_TIMEOUT``): what follows
        (a delete clears the session's record) comes after it."""
        with self._lock:
            self._closing = True
            self._generation += 1
            self._order.clear()
        self.client.close(session_expiry=0)
        self.client.await_closed()

    @property
    def unacknowledged(self) -> int:
        """Messages received on this connection and not acknowledged yet."""
        with self._lock:
            return len(self._order)

    # -- settling ---------------------------------------------------------------------------
    def _settle(self, d: Delivery) -> None:
        with self.client.io_lock, self._lock:
            if d._generation != self._generation or d._settled:
                return
            d._settled = True
            if d._handed:
                self._outstanding -= 1
            self._ack_ready()
        self.client.wake()
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
        client = self.client
        while order and order[0]._settled:
            d = order.popleft()
            client.ack(d._mid)
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

    # -- the client's callbacks (the hub's thread, io_lock held; never block) --------------
    def connected(self, connack: Connack) -> None:
        """The CONNACK (``connect`` returns what it says)."""

    def published(self, messages: list[Publish]) -> None:
        """The PUBLISH packets of one read, in arrival order."""
        arrived = []
        for m in messages:
            if m.qos == 0:
                continue  # subscribed at QoS 1: nothing to acknowledge
            headers, content_type = metadata_of(m.user_properties, m.content_type, m.payload)
            arrived.append((m, self.mapping.topic(m.topic, headers), headers, content_type))
        if not arrived:
            return
        handed = False
        with self._lock:
            if self._closing or self.lost:
                return
            for m, topic, headers, content_type in arrived:
                self.received += 1
                d = Delivery(
                    self,
                    self._generation,
                    m.packet_id,
                    topic,
                    m.payload,
                    headers,
                    content_type,
                    m.dup,
                )
                self._order.append(d)
                if self._consumer is None:
                    continue  # a declaring connection: the next connection gets it again
                if m.retain or not self._accepts(topic):
                    d._settled = True
                    continue
                self._held.append(d)
                handed = True
            self.peak_unacknowledged = max(self.peak_unacknowledged, len(self._order))
            self._ack_ready()
        if handed:
            self._dispatch()

    def acknowledged(self, ack: SubAck) -> None:
        """A SUBACK or UNSUBACK."""
        if ack.unsubscribe:
            with self._lock:
                done = self._unsubscribed.pop(ack.packet_id, None)
            if done is not None:
                done.set()
            return
        with self._lock:
            wanted = self._pending.pop(ack.packet_id, None) or []
            for f, code in zip(wanted, ack.reasons, strict=False):
                if code >= 0x80:
                    self._refused[f] = reason_name(code)
            self._lock.notify_all()

    def closed(self, why: str) -> None:
        """The connection ended (closed here, cut off, lost, or refused)."""
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
