"""A durable subscription in cluster mode: its own persistent MQTT session on the broker
(docs/scale-out.md, "MQTT in cluster mode").

:class:`SubscriptionSessions` (one per adapter in cluster mode) names each subscription's
session, makes sure it exists with the subscription's filters (``declare``, from any
instance) and deletes it.  :class:`ClusterHandle` is core's handle on one of them:
``start`` connects with Receive Maximum = prefetch and hands each message to core,
``stop`` disconnects (the broker keeps queueing), ``delete`` ends the session.

**Declaring without cutting the deliverer off.**  Connecting with a session's client id
cuts off whoever delivers it, so a declare first reads the session's *record*, a
retained message on ``<topic prefix>/wsnmom/sessions/<client id>`` naming the filters the
session was given: when they are the ones wanted (a re-attach), the declare connects
nothing.  The record also tells an instance that re-binds a subscription which filters
to unsubscribe; a delete clears it after ending the session.

**Fencing.**  Whoever connects with the session's client id last receives; the broker cuts
the previous connection off.  Mosquitto does not tell the old connection why, so a
handle reconnects after a loss only while ``may_save(name)`` (core's lease fence, given
to ``Adapter.shared_by_instances``) says this instance still delivers the subscription,
asked just before every reconnect: a zombie woken after SIGSTOP stays off and does not
cut the new deliverer off in turn.  A reconnect that finds no session on the broker
(deleted through another instance, or lost by the broker) is not taken as it is: the
connection ends the empty session it made and the handle starts again after
``RESTART_DELAY`` (as the RabbitMQ adapter restarts a consumer whose channel the broker
closed), by when core has usually followed a deletion and stopped the handle.  The
restart makes the session again only while its record exists: a delete clears it, so a
deliverer that has not followed the deletion yet checks again later and never brings the
session back.

Threads and connections: one connection per subscription this instance delivers (and a
short-lived one per declare and delete), all served by the instance's one network thread
(:mod:`.hub`).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from wsnmom.core.adapter import (
    AdapterError,
    AdapterUnavailable,
    OutboundMessage,
    Received,
    StoredMessage,
    SubscriptionHandle,
    SubscriptionSpec,
    is_internal_namespace,
)
from wsnmom.core.dead_letters import box_name
from wsnmom.topic_mapping.model import PathPattern, Topic

from .config import MqttSettings
from .filters import FilterSet
from .hub import Hub
from .mapping import MqttMapping
from .publisher import Publisher
from .sub_session import SessionConnection

__all__ = ["RESTART_DELAY", "ClusterHandle", "SubscriptionSessions", "session_client_id"]

log = logging.getLogger("wsnmom.adapters.mqtt")

#: seconds a handle waits before it starts again after its session was found gone
RESTART_DELAY = 1.0
#: the client id of every subscription session starts with this
CLIENT_ID_HEAD = "wsnmom-s-"
#: the routing topic of a record (never routed: records are read as retained messages)
_RECORD = Topic("urn:wsnmom:internal:session-record", ("r",))

MayDeliver = Callable[[str], bool]

#: the names of dead-letter boxes (core reads one in every instance)
_BOX_HEAD = box_name("")


def session_client_id(topic_prefix: str, name: str) -> str:
    """The fixed client id of subscription ``name``'s session in the cluster of
    ``topic_prefix`` (28 characters, the same on every instance)."""
    digest = hashlib.blake2b(f"{topic_prefix}\x00{name}".encode(), digest_size=10).hexdigest()
    return CLIENT_ID_HEAD + digest


def planned(name: str, filters: frozenset[str]) -> frozenset[str]:
    """``filters`` made pairwise disjoint (``FilterSet``), so a message comes once."""
    plan = FilterSet()
    plan.assign(name, filters)
    return frozenset(f for f, _ in plan)


def acceptor(patterns: tuple[PathPattern, ...] | None) -> Callable[[Topic], bool]:
    """Whether a topic is one of the subscription's (None: every non-internal one)."""
    if patterns is None:
        return lambda topic: not is_internal_namespace(topic.namespace)
    pats = tuple(patterns)
    return lambda topic: any(p.matches(topic) for p in pats)


class SubscriptionSessions:
    """Names, declares and deletes the subscription sessions of one adapter (module
    docstring).  ``instance_id``: this instance's own client id, for the sessions that
    belong to it rather than to the cluster (dead-letter boxes: each instance reads its
    own, as single instances on one broker do).  ``publisher``: reads and writes the
    sessions' records (:meth:`record_topic`)."""

    def __init__(
        self,
        settings: MqttSettings,
        mapping: MqttMapping,
        instance_id: str,
        may_deliver: MayDeliver | None,
        publisher: Publisher | None = None,
        hub: Hub | None = None,
    ) -> None:
        self.settings = settings
        self.mapping = mapping
        self.publisher = publisher
        #: the one network thread of every session connection (None: one each)
        self.hub = hub
        self.instance_id = instance_id
        self.may_deliver: MayDeliver = may_deliver or (lambda name: True)
        self._lock = threading.Lock()
        #: client id -> the filters this process subscribed in its session
        self._declared: dict[str, frozenset[str]] = {}

    def client_id(self, name: str) -> str:
        """The client id of subscription ``name``'s session."""
        if self.own(name):
            return session_client_id(self.instance_id, name)
        return session_client_id(self.settings.topic_prefix, name)

    def own(self, name: str) -> bool:
        """Whether ``name``'s session belongs to this instance alone (no fence)."""
        return name.startswith(_BOX_HEAD)

    def record_topic(self, client_id: str) -> str:
        """The MQTT topic whose retained message records the filters ``client_id``'s
        session was given (every instance reads it before it declares)."""
        return f"{self.mapping.record_head}{client_id}"

    def recorded(self, client_id: str) -> frozenset[str] | None:
        """The filters the session's record names, None without a record."""
        if self.publisher is None:
            return None
        found = self.publisher.retained(
            self.record_topic(client_id), self.settings.subscribe_timeout
        )
        if found is None or not found.payload:
            return None
        return frozenset(found.payload.decode().split("\n"))

    def _record(self, client_id: str, filters: frozenset[str]) -> None:
        """Write (or with no ``filters``, clear) the session's record."""
        if self.publisher is None:
            return
        body = "\n".join(sorted(filters)).encode()
        message = OutboundMessage(topic=_RECORD, body=body, message_id=client_id)
        self.publisher.publish_many(
            [(self.record_topic(client_id), message)],
            self.settings.subscribe_timeout,
            retain=True,
        )

    def declare(self, client_id: str, filters: frozenset[str], timeout: float) -> None:
        """Make sure ``client_id``'s session exists with ``filters``.  When its record
        says so already (a re-attach: every instance re-attaches every subscription at
        start and when it follows a new one), nothing more: connecting would cut the
        deliverer off.  Otherwise write the record, connect, subscribe them, unsubscribe
        the filters the record (or this process) had and no longer wants, disconnect.
        A take-over that cuts the declaring connection off (the deliverer reconnecting at
        the same moment) is retried until ``timeout``."""
        recorded = self.recorded(client_id)
        if recorded == filters:
            with self._lock:
                self._declared[client_id] = filters
            return
        with self._lock:
            before = self._declared.get(client_id, frozenset()) | (recorded or frozenset())
        # the record first: another instance re-attaching the subscription meanwhile (it
        # follows the store) then connects nothing, so it cannot cut off the instance
        # that already delivers it; a deliverer subscribes the filters itself anyway
        self._record(client_id, filters)
        deadline = time.monotonic() + timeout
        while True:
            conn = SessionConnection(
                self.settings,
                client_id,
                self.mapping,
                lambda t: True,
                receive_maximum=1,
                hub=self.hub,
            )
            try:
                conn.connect()
                conn.subscribe(filters, max(0.5, deadline - time.monotonic()))
                conn.unsubscribe(before - filters, max(0.5, deadline - time.monotonic()))
                break
            except AdapterUnavailable:
                if time.monotonic() >= deadline:
                    raise
                log.debug("declaring %s: cut off, trying again", client_id)
            finally:
                conn.close()
            time.sleep(0.05)
        with self._lock:
            self._declared[client_id] = filters

    def delete(self, client_id: str) -> None:
        """End ``client_id``'s session: connect with clean start and session expiry 0 and
        disconnect; its messages are gone, and a connection still open is cut off."""
        conn = SessionConnection(
            self.settings, client_id, self.mapping, lambda t: True, persistent=False, hub=self.hub
        )
        try:
            conn.connect()
        finally:
            conn.end()
        self._record(client_id, frozenset())
        with self._lock:
            self._declared.pop(client_id, None)


class ClusterHandle(SubscriptionHandle):
    """Core's handle on one subscription session (see the module docstring)."""

    def __init__(self, sessions: SubscriptionSessions, spec: SubscriptionSpec) -> None:
        self.name = spec.name
        self._sessions = sessions
        self.client_id = sessions.client_id(spec.name)
        self.filters = planned(spec.name, sessions.mapping.filters(spec.patterns))
        self._accepts = acceptor(spec.patterns)
        self._lock = threading.RLock()
        self._conn: SessionConnection | None = None
        self._consumer: Callable[[Received], None] | None = None
        self._prefetch = 64
        self._started = False
        self._deleted = False
        self._timer: threading.Timer | None = None
        self._delay = sessions.settings.reconnect_min_delay
        #: connections made by ``start`` and reconnects (tests, stats)
        self.connections = 0
        #: reconnects refused because this instance no longer delivers the subscription
        self.fenced = 0
        #: reconnects that found the session gone on the broker
        self.sessions_lost = 0
        #: restarts refused because the session's record was gone (deleted elsewhere)
        self.unrecorded = 0

    def __repr__(self) -> str:
        return f"<ClusterHandle {self.name} {self.client_id} started={self._started}>"

    # -- delivery ---------------------------------------------------------------------------
    def start(self, on_message: Callable[[Received], None], prefetch: int = 64) -> None:
        """Connect (taking the session over), subscribe the filters, deliver."""
        with self._lock:
            if self._deleted:
                raise AdapterError(f"the subscription session {self.name} was deleted")
            self._consumer = on_message
            self._prefetch = max(1, min(prefetch, 65535))
            self._started = True
            if self._conn is not None and not self._conn.lost:
                return
            self._cancel_timer()
            self._delay = self._sessions.settings.reconnect_min_delay
            try:
                self._connect(first=True)
            except AdapterUnavailable as exc:
                # cut off at once (another instance declaring the session at this
                # moment), or the broker away: connect again shortly, as after a loss
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None
                log.warning("MQTT subscription session of %s: %s; trying again", self.name, exc)
                self._schedule(self._delay, first=True)

    def _connect(self, *, first: bool) -> None:
        """Open a connection and subscribe (lock held).  ``first``: the session may be
        new (made here); otherwise a session gone from the broker is a failure."""
        consumer = self._consumer
        assert consumer is not None
        conn = SessionConnection(
            self._sessions.settings,
            self.client_id,
            self._sessions.mapping,
            self._accepts,
            consumer=consumer,
            receive_maximum=self._prefetch,
            on_lost=lambda: self._lost(conn),
            on_requeue=lambda: self._requeue(conn),
            hub=self._sessions.hub,
        )
        self._conn = conn
        present = conn.connect()
        self.connections += 1
        if not present and not first:
            self.sessions_lost += 1
            log.warning(
                "MQTT subscription session of %s (%s) is gone from the broker (deleted "
                "through another instance, or lost by the broker); starting again in %gs",
                self.name,
                self.client_id,
                RESTART_DELAY,
            )
            conn.end()
            self._conn = None
            self._schedule(RESTART_DELAY, first=True, restart=True)
            return
        conn.subscribe(self.filters)

    def stop(self) -> None:
        """Disconnect cleanly; the broker keeps the session and queues for it."""
        with self._lock:
            self._started = False
            self._cancel_timer()
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    # -- losses and reconnects --------------------------------------------------------------
    def _lost(self, conn: SessionConnection) -> None:
        # on paho's network thread, which must not wait for the handle's lock (a start
        # may hold it while it waits for that very thread)
        threading.Thread(
            target=self._after_loss, args=(conn,), name="wsnmom-mqtt-lost", daemon=True
        ).start()

    def _after_loss(self, conn: SessionConnection) -> None:
        with self._lock:
            if conn is not self._conn or not self._started:
                return
            self._conn = None
            delay = self._delay
            self._delay = min(self._delay * 2, self._sessions.settings.reconnect_max_delay)
            self._schedule(delay, first=False)

    def _requeue(self, conn: SessionConnection) -> None:
        """A message was nacked for requeue: drop the connection, so the broker sends
        everything unacknowledged again, in order, to the next one."""
        with self._lock:
            if conn is not self._conn or not self._started:
                return
            self._conn = None
        threading.Thread(
            target=self._bounce, args=(conn,), name="wsnmom-mqtt-requeue", daemon=True
        ).start()

    def _bounce(self, conn: SessionConnection) -> None:
        conn.close()
        with self._lock:
            if self._started and self._conn is None:
                self._schedule(0.0, first=False)

    def _schedule(self, delay: float, *, first: bool, restart: bool = False) -> None:
        self._cancel_timer()
        timer = threading.Timer(delay, self._reconnect, kwargs={"first": first, "restart": restart})
        timer.daemon = True
        self._timer = timer
        timer.start()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _reconnect(self, *, first: bool, restart: bool = False) -> None:
        with self._lock:
            self._timer = None
            if not self._started or self._deleted or self._conn is not None:
                return
            if not self._sessions.own(self.name) and not self._sessions.may_deliver(self.name):
                # fenced: another instance may deliver it now; connecting would cut it off
                self.fenced += 1
                log.info(
                    "MQTT subscription session of %s: not reconnecting, this instance no "
                    "longer holds its lease",
                    self.name,
                )
                return
            try:
                if restart and self._sessions.recorded(self.client_id) is None:
                    # its record is gone too: deleted through another instance (a delete
                    # ends the session, then clears the record), which core follows and
                    # stops this handle; never made again from here
                    self.unrecorded += 1
                    log.warning(
                        "MQTT subscription session of %s and its record are gone from the "
                        "broker: not delivering it (deleted through another instance, or "
                        "the broker lost its state: a re-attach makes it again)",
                        self.name,
                    )
                    self._schedule(
                        self._sessions.settings.reconnect_max_delay, first=True, restart=True
                    )
                    return
                self._connect(first=first)
            except AdapterError as exc:
                log.warning("MQTT subscription session of %s: reconnect failed: %s", self.name, exc)
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None
                delay = self._delay
                self._delay = min(self._delay * 2, self._sessions.settings.reconnect_max_delay)
                self._schedule(delay, first=first, restart=restart)
            else:
                if self._conn is not None:
                    self._delay = self._sessions.settings.reconnect_min_delay

    @property
    def connected(self) -> bool:
        """Whether a connection delivers now."""
        conn = self._conn
        return conn is not None and not conn.lost

    def unacknowledged(self) -> int:
        """Messages handed out on the current connection and not acknowledged yet."""
        conn = self._conn
        return conn.unacknowledged if conn is not None else 0

    # -- pull, depth, peek: the broker's session cannot answer them ---------------------------
    def pull(self, max_messages: int, timeout: float = 0.0) -> list[Received]:
        raise AdapterError("in cluster mode MQTT has no native pull (core buffers pull points)")

    def depth(self) -> int | None:
        return None

    def peek(self, max_messages: int) -> list[StoredMessage]:
        raise NotImplementedError(
            "in cluster mode the subscription's messages wait in its MQTT session on the "
            "broker, which cannot be read without delivering them"
        )

    def discard(self, count: int, *, newest: bool = False) -> int:
        raise NotImplementedError("an MQTT session's messages cannot be dropped unread")

    def purge(self) -> int | None:
        """Drop every waiting message: the session is ended and made again with its
        filters (delivery, if started, resumes on the new one).  None: MQTT cannot tell
        how many there were."""
        with self._lock:
            was = self._started
            consumer, prefetch = self._consumer, self._prefetch
        self.stop()
        self._sessions.delete(self.client_id)
        self._sessions.declare(
            self.client_id, self.filters, self._sessions.settings.subscribe_timeout
        )
        if was and consumer is not None:
            self.start(consumer, prefetch)
        return None

    # -- end ---------------------------------------------------------------------------------
    def delete(self) -> None:
        """Stop and end the session on the broker (its messages are gone); idempotent."""
        self.stop()
        with self._lock:
            self._deleted = True
        self._sessions.delete(self.client_id)


def describe(handles: Sequence[Any]) -> dict[str, int]:
    """Counts over cluster handles (the adapter's ``stats``)."""
    live = [h for h in handles if isinstance(h, ClusterHandle)]
    return {
        "subscription_sessions": len(live),
        "connected_sessions": sum(1 for h in live if h.connected),
        "fenced_reconnects": sum(h.fenced for h in live),
        "sessions_lost": sum(h.sessions_lost for h in live),
    }
