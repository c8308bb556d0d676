"""A durable subscription in cluster mode: its own persistent MQTT session on the broker
(docs/scale-out.md, "MQTT in cluster mode").

:class:`SubscriptionSessions` (one per adapter in cluster mode) names each subscription's
session, makes sure it exists with the subscription's filters (``declare``, from any
instance) and deletes it.  :class:`ClusterHandle` is core's handle on one of them:
``start`` connects with Receive Maximum = prefetch and hands each message to core,
``stop`` disconnects (the broker keeps queueing), ``delete`` ends the session.

**Declaring without cutting the deliverer off.**  Connecting with a session's client id
cuts off whoever delivers it, so a declare first reads the session's *record*, a
retained message on ``<topic prefix>/wsnmom/sessions/<client id>`` naming the subscription
and the filters the session was given (``SubscriptionSessions.names`` lists them): when
they are the ones wanted (a re-attach), the declare connects nothing.  The record also
tells an instance that re-binds a subscription which filters to unsubscribe; a delete
clears it after ending the session.

**Fencing.**  Whoever connects with the session's client id last receives; the broker cuts
the previous connection off.  Mosquitto does not tell the old connection why, so a
handle reconnects after a loss only while ``may_save(name)`` (core's lease fence, given
to ``Adapter.shared_by_instances``) says this instance still delivers the subscription
(for a feed of a pull point: still reads that pull point), asked just before every
reconnect: a zombie woken after SIGSTOP stays off and does not cut the new deliverer off
in turn.  A reconnect that finds no session on the broker
(deleted through another instance, or lost by the broker) is not taken as it is: the
connection ends the empty session it made and the handle starts again after
``RESTART_DELAY`` (as the RabbitMQ adapter restarts a consumer whose channel the broker
closed), by when core has usually followed a deletion and stopped the handle.  The
restart makes the session again only while its record exists: a delete clears it, so a
deliverer that has not followed the deletion yet checks again later and never brings the
session back.  The same rule holds for a ``start`` (a shard gained, a Resume) that finds
no session: made again only while its record exists.

Locking: a handle holds its lock only to change its state, never across a wait for the
broker: ``start`` and reconnects connect and subscribe outside it and install the
connection only if no ``stop`` came meanwhile (the handle's generation), and ``stop``
closes a connection still being made (core stops handles on its cluster thread).

Threads and connections: one connection per subscription this instance delivers (and a
short-lived one per declare and delete), all served by the instance's one network thread
(:mod:`.hub`).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
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
from .record_scan import retained_under
from .sub_session import SessionConnection

__all__ = [
    "RESTART_DELAY",
    "ClusterHandle",
    "SubscriptionSessions",
    "await_boxes",
    "session_client_id",
]

log = logging.getLogger("wsnmom.adapters.mqtt")

#: seconds a handle waits before it starts again after its session was found gone
RESTART_DELAY = 1.0
#: the client id of every subscription session starts with this
CLIENT_ID_HEAD = "wsnmom-s-"
#: the first line of a record, before the subscription's name
_NAME_LINE = "#name="
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
        #: the one network thread of every session connection (without one given, a hub
        #: of its own)
        self.hub = hub if hub is not None else Hub("mqtt-sessions", tls=settings.tls)
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
        found = self._read_record(client_id)
        return None if found is None else found[1]

    def _read_record(self, client_id: str) -> tuple[str | None, frozenset[str]] | None:
        """The subscription name and the filters the session's record names (the name
        None in a record written before records named it), None without a record."""
        if self.publisher is None:
            return None
        found = self.publisher.retained(
            self.record_topic(client_id), self.settings.subscribe_timeout
        )
        if found is None or not found.payload:
            return None
        return self._parse_record(client_id, found.payload)

    def _parse_record(
        self, client_id: str, payload: bytes
    ) -> tuple[str | None, frozenset[str]] | None:
        try:
            lines = payload.decode().split("\n")
        except UnicodeDecodeError:
            # not written by a gateway (any client allowed to publish under the topic
            # prefix can): no record, so the declare connects and writes one
            log.warning("the MQTT session record of %s is not readable: ignored", client_id)
            return None
        name: str | None = None
        if lines and lines[0].startswith(_NAME_LINE):
            name = lines.pop(0)[len(_NAME_LINE) :]
        return name, frozenset(line for line in lines if line or name is None)

    def names(self, timeout: float) -> list[str]:
        """The names of the subscriptions whose sessions have a record (read from the
        retained records under ``<prefix>/wsnmom/sessions/+`` by a short-lived clean
        session): every cluster subscription whose session a delete has not ended, and
        this instance's own dead-letter boxes.  A record whose name does not hash to its
        client id (another instance's box, or not written by a gateway) is not counted.
        AdapterUnavailable when the broker does not answer; AdapterError when a record
        names no subscription (written before records named one: the list would be
        incomplete until every instance re-attached its subscriptions)."""
        head = self.mapping.record_head
        found = retained_under(self.settings, self.instance_id, head + "+", timeout)
        names: list[str] = []
        for topic, payload in found.items():
            client_id = topic[len(head) :]
            if not client_id.startswith(CLIENT_ID_HEAD):
                continue
            record = self._parse_record(client_id, payload)
            if record is None:
                continue
            name = record[0]
            if name is None:
                raise AdapterError(
                    f"the MQTT session record of {client_id} names no subscription "
                    "(written by an older version): the subscriptions cannot be listed"
                )
            if self.client_id(name) == client_id:
                names.append(name)
        return sorted(names)

    def _record(self, client_id: str, filters: frozenset[str], name: str | None = None) -> None:
        """Write (or with neither ``filters`` nor ``name``, clear) the session's record:
        the subscription's ``name`` on a first line of its own (no MQTT filter starts
        with ``#`` followed by more), then the filters, one a line."""
        if self.publisher is None:
            return
        lines = sorted(filters)
        if name is not None and "\n" not in name:
            lines.insert(0, _NAME_LINE + name)
        body = "\n".join(lines).encode()
        message = OutboundMessage(topic=_RECORD, body=body, message_id=client_id)
        self.publisher.publish_many(
            [(self.record_topic(client_id), message)],
            self.settings.subscribe_timeout,
            retain=True,
        )

    def declare(
        self,
        client_id: str,
        filters: frozenset[str],
        timeout: float,
        name: str | None = None,
        *,
        new: bool = False,
    ) -> None:
        """Make sure ``client_id``'s session (of subscription ``name``) exists with
        ``filters``.  When its record says so already (a re-attach: every instance
        re-attaches every subscription at start and when it follows a new one), nothing
        more: connecting would cut the deliverer off (a record that does not name the
        subscription yet is written again, naming it).  Otherwise write the record,
        connect, subscribe them, unsubscribe the filters the record (or this process) had
        and no longer wants, disconnect.  A take-over that cuts the declaring connection
        off (the deliverer reconnecting at the same moment) is retried until
        ``timeout``.  A ``new`` subscription (a Subscribe made its name a moment ago) has
        no record: none is read (a round trip on the publisher's connection, one read at
        a time for all request threads)."""
        found = None if new else self._read_record(client_id)
        recorded = None if found is None else found[1]
        if recorded == filters:
            if name is not None and found is not None and found[0] != name:
                self._record(client_id, filters, name)
            with self._lock:
                self._declared[client_id] = filters
            return
        with self._lock:
            before = self._declared.get(client_id, frozenset()) | (recorded or frozenset())
        # the record first: another instance re-attaching the subscription meanwhile (it
        # follows the store) then connects nothing, so it cannot cut off the instance
        # that already delivers it; a deliverer subscribes the filters itself anyway
        self._record(client_id, filters, name)
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
        #: notified when a connection is installed or the handle stops
        self._changed = threading.Condition(self._lock)
        #: the connection that delivers (installed by ``_attempt``)
        self._conn: SessionConnection | None = None
        #: the connection being made outside the lock (``stop`` closes it)
        self._pending: SessionConnection | None = None
        #: a connection being made on which a message was nacked for requeue
        self._bounced: SessionConnection | None = None
        #: bumped by ``stop``: an attempt of an older generation installs nothing
        self._generation = 0
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
        """Connect (taking the session over), subscribe the filters, deliver.  The lock
        is held only to change state: a ``stop`` meanwhile (core's cluster thread, a
        shard moving) does not wait for the broker's answers (see ``_attempt``)."""
        with self._lock:
            if self._deleted:
                raise AdapterError(f"the subscription session {self.name} was deleted")
            self._consumer = on_message
            self._prefetch = max(1, min(prefetch, 65535))
            self._started = True
            if self._conn is not None and not self._conn.lost:
                return
            if self._pending is not None:
                return  # a connection of this start's generation is under way
            self._cancel_timer()
            self._delay = self._sessions.settings.reconnect_min_delay
            generation = self._generation
        self._attempt(generation, first=True, restart=False, starting=True)

    def _live(self, generation: int) -> bool:
        """Whether an attempt of ``generation`` may still install its connection (lock
        held): started, not deleted, and no ``stop`` since it began."""
        return self._started and not self._deleted and generation == self._generation

    def _attempt(self, generation: int, *, first: bool, restart: bool, starting: bool) -> None:
        """Connect and subscribe outside the lock, then install the connection if the
        handle is still started on ``generation`` (else close it).  ``first``: the
        session may be new (made here); ``restart``: made again only while its record
        exists; ``starting``: a ``start`` (a refusal is raised to core, not retried)."""
        with self._lock:
            if not self._live(generation) or self._pending is not None:
                return
            if self._conn is not None:
                if not self._conn.lost:
                    return
                self._conn = None
            consumer = self._consumer
            assert consumer is not None
            conn = self._connection(consumer, self._prefetch)
            self._pending = conn
        try:
            verdict = self._open(conn, first=first, restart=restart)
        except AdapterError as exc:
            conn.close()
            with self._lock:
                if self._pending is conn:
                    self._pending = None
                live = self._live(generation)
                bounced, self._bounced = self._bounced is conn, None
                if not live or (starting and not isinstance(exc, AdapterUnavailable)):
                    pass  # stopped meanwhile, or a refusal core hears of (start raises it)
                elif bounced:
                    self._schedule(0.0, first=False)
                else:
                    delay = self._delay
                    self._delay = min(delay * 2, self._sessions.settings.reconnect_max_delay)
                    self._schedule(delay, first=first, restart=restart)
            if not live:
                return
            if starting and not isinstance(exc, AdapterUnavailable):
                raise
            # cut off at once (another instance declaring the session at this moment),
            # or the broker away: connect again shortly, as after a loss
            log.warning("MQTT subscription session of %s: %s; trying again", self.name, exc)
            return
        installed = False
        with self._lock:
            if self._pending is conn:
                self._pending = None
            bounced, self._bounced = self._bounced is conn, None
            if self._live(generation):
                if verdict == "gone":
                    self._schedule(RESTART_DELAY, first=True, restart=True)
                elif verdict == "unrecorded":
                    max_delay = self._sessions.settings.reconnect_max_delay
                    self._schedule(max_delay, first=True, restart=True)
                elif bounced or conn.lost:
                    # a nack while it subscribed, or cut off already: the next one
                    # gets every unacknowledged message again
                    self._schedule(0.0 if bounced else self._delay, first=False)
                else:
                    self._conn = conn
                    self._delay = self._sessions.settings.reconnect_min_delay
                    installed = True
                    self._changed.notify_all()
        if not installed and verdict == "ok":
            conn.close()  # stopped meanwhile: this connection delivers nothing

    def _connection(self, consumer: Callable[[Received], None], prefetch: int) -> SessionConnection:
        """A new connection to the session, delivering to ``consumer``."""
        conn = SessionConnection(
            self._sessions.settings,
            self.client_id,
            self._sessions.mapping,
            self._accepts,
            consumer=consumer,
            receive_maximum=prefetch,
            on_lost=lambda: self._lost(conn),
            on_requeue=lambda: self._requeue(conn),
            hub=self._sessions.hub,
        )
        return conn

    def _open(self, conn: SessionConnection, *, first: bool, restart: bool) -> str:
        """Connect ``conn`` and subscribe (lock not held): ``"ok"``, or ``"gone"`` /
        ``"unrecorded"`` when the session (and its record) are gone, ``conn`` ended."""
        if restart and self._sessions.recorded(self.client_id) is None:
            # its record is gone too: deleted through another instance (a delete ends the
            # session, then clears the record), which core follows and stops this
            # handle; never made again from here
            self.unrecorded += 1
            log.warning(
                "MQTT subscription session of %s and its record are gone from the "
                "broker: not delivering it (deleted through another instance, or "
                "the broker lost its state: a re-attach makes it again)",
                self.name,
            )
            return "unrecorded"
        present = conn.connect()
        self.connections += 1
        if not present and first and not self._still_recorded(conn):
            # deleted through another instance (a delete ends the session, then clears
            # its record) before this one followed: a session made here would outlive
            # the subscription (core's follower only stops this handle)
            self.unrecorded += 1
            log.warning(
                "MQTT subscription session of %s and its record are gone from the broker: "
                "not making it again (deleted through another instance)",
                self.name,
            )
            conn.end()
            return "unrecorded"
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
            return "gone"
        conn.subscribe(self.filters)
        return "ok"

    def _still_recorded(self, conn: SessionConnection) -> bool:
        """Whether the session's record exists (``conn``, connected to a session it found
        absent, is ended when the record cannot be read)."""
        try:
            return self._sessions.recorded(self.client_id) is not None
        except AdapterError:
            conn.end()
            raise

    def stop(self) -> None:
        """Disconnect cleanly; the broker keeps the session and queues for it.  Never
        waits for the broker: a connection still being made is closed, and its attempt
        (of an older generation) installs nothing."""
        with self._lock:
            self._started = False
            self._generation += 1
            self._changed.notify_all()
            self._cancel_timer()
            conn, self._conn = self._conn, None
            pending, self._pending = self._pending, None
        for c in (conn, pending):
            if c is not None:
                c.close()

    # -- losses and reconnects --------------------------------------------------------------
    def _lost(self, conn: SessionConnection) -> None:
        # on the network thread, which must not wait for the handle's lock (kept short,
        # but a thread of its own keeps the network thread free of it altogether)
        threading.Thread(
            target=self._after_loss, args=(conn,), name="wsnmom-mqtt-lost", daemon=True
        ).start()

    def _after_loss(self, conn: SessionConnection) -> None:
        with self._lock:
            if conn is not self._conn or not self._started:
                return  # a connection still being made: its attempt sees it lost
            self._conn = None
            delay = self._delay
            self._delay = min(self._delay * 2, self._sessions.settings.reconnect_max_delay)
            self._schedule(delay, first=False)

    def _requeue(self, conn: SessionConnection) -> None:
        """A message was nacked for requeue: drop the connection, so the broker sends
        everything unacknowledged again, in order, to the next one.  Often called on the
        network thread (a nack in the consumer's callback): done on a thread of its own,
        so the network thread never waits for the handle's lock.  Messages queued in the
        session arrive before the SUBACK a start waits for: a nack then marks the
        connection being made, which its attempt drops instead of installing."""
        threading.Thread(
            target=self._bounce, args=(conn,), name="wsnmom-mqtt-requeue", daemon=True
        ).start()

    def _bounce(self, conn: SessionConnection) -> None:
        with self._lock:
            if conn is self._pending:
                self._bounced = conn
                return
            if conn is not self._conn or not self._started:
                return
            self._conn = None
        conn.close()
        with self._lock:
            if self._started and self._conn is None and self._pending is None:
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
            busy = self._conn is not None or self._pending is not None
            if not self._started or self._deleted or busy:
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
            generation = self._generation
        self._attempt(generation, first=first, restart=restart, starting=False)

    @property
    def connected(self) -> bool:
        """Whether a connection delivers now."""
        conn = self._conn
        return conn is not None and not conn.lost

    def await_connection(self, timeout: float) -> bool:
        """Whether a connection delivers, or the handle is not started (nothing to wait
        for), waiting up to ``timeout`` seconds for one; a connection is installed once
        the broker acknowledged its SUBSCRIBE (the filters are subscribed again).  The
        lock is held by others only to change state, never across a wait for the
        broker."""
        with self._changed:
            return self._changed.wait_for(lambda: self.connected or not self._started, timeout)

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
            self.client_id, self.filters, self._sessions.settings.subscribe_timeout, self.name
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


def await_boxes(handles: Iterable[ClusterHandle], boxes: set[str], timeout: float) -> None:
    """Wait until this instance's started dead-letter boxes named in ``boxes`` have a
    connection whose SUBSCRIBE the broker acknowledged, up to ``timeout`` seconds in all;
    AdapterUnavailable when one has none by then (the dead letters then stay with core,
    which publishes them again later).

    Why: Mosquitto 2.0.11 drops a session's shared subscriptions across its restart (it
    keeps the plain ones and the queued messages), and a box reads ``$share/…``: a dead
    letter published after the broker came back and before any box subscribed again is
    queued for nobody.  The publisher may reconnect before the box does; its dead letters
    wait for the box (docs/scale-out.md, "Dead-letter boxes")."""
    deadline = time.monotonic() + timeout
    for handle in [h for h in handles if h.name in boxes]:
        if not handle.await_connection(max(0.0, deadline - time.monotonic())):
            raise AdapterUnavailable(
                f"the dead-letter box {handle.name} has not subscribed again since its "
                "connection was lost: its dead letters wait"
            )
