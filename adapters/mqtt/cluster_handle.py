"""A durable subscription in cluster mode: its own persistent MQTT session on the broker
(docs/scale-out.md, "MQTT in cluster mode").

:class:`~.cluster_sessions.SubscriptionSessions` (one per adapter in cluster mode, in
:mod:`.cluster_sessions`, re-exported here) names each subscription's session, makes sure
it exists with the subscription's filters (``declare``, from any instance, without cutting
the deliverer off) and deletes it.  :class:`ClusterHandle` is core's handle on one of them:
``start`` connects with Receive Maximum = prefetch and hands each message to core,
``stop`` disconnects (the broker keeps queueing), ``delete`` ends the session.

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
restart makes the session again while its record exists, or, the record gone too, while
core's store still holds the subscription (``Adapter.kept_in_store``: the broker lost its
state), asked after the record was written again (``SubscriptionSessions.record_again``;
the answer, asked in batches off this thread, is handled by :mod:`.cluster_remake`):
core deletes the store's record before the session, and a delete ends the session and
then clears its record, so a deliverer that has not followed the deletion yet checks
again later and never brings the session back.  The same rule holds for a ``start`` (a
shard gained, a Resume) that finds no session.

Locking: a handle holds its lock only to change its state, never across a wait for the
broker: ``start`` and reconnects connect and subscribe outside it and install the
connection only if no ``stop`` came meanwhile (the handle's generation), and ``stop``
closes a connection still being made (core stops handles on its cluster thread).

Threads and connections: one connection per subscription this instance delivers (and a
short-lived one per declare and delete), all served by the instance's one network thread
(:mod:`.hub`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from wsnmom.core.adapter import (
    AdapterError,
    AdapterUnavailable,
    Received,
    StoredMessage,
    SubscriptionHandle,
    SubscriptionSpec,
    is_internal_namespace,
)
from wsnmom.topic_mapping.model import PathPattern, Topic

from .cluster_remake import Remaking
from .cluster_sessions import SubscriptionSessions, session_client_id
from .filters import FilterSet
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


class ClusterHandle(Remaking, SubscriptionHandle):
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
        #: sessions made again with their record because the store still holds the
        #: subscription (the broker lost its state)
        self.remade = 0
        #: a session made again here (record and filters kept on the broker) whose
        #: question to the store is not answered yet: asked again before delivering
        self._unconfirmed = False
        #: a question about a kept session is out (``_ask``)
        self._asking = False

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
            if self._pending is not None or self._asking:
                return  # a connection (or a question) of this start's generation is under way
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
            if not self._live(generation) or self._pending is not None or self._asking:
                return
            if self._conn is not None:
                if not self._conn.lost:
                    return
                self._conn = None
            conn: SessionConnection | None = None
            if self._unconfirmed:  # made again while the store could not say: ask first
                self._asking = True
            else:
                consumer = self._consumer
                assert consumer is not None
                conn = self._connection(consumer, self._prefetch)
                self._pending = conn
        if conn is None:
            self._ask(generation, None)
            return
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
        if verdict == "asking":
            self._ask(generation, conn)  # answered on another thread (cluster_remake)
            return
        self._install(generation, conn, verdict)

    def _install(self, generation: int, conn: SessionConnection, verdict: str) -> None:
        """Install ``conn`` (connected, subscribed) if the handle is still started on
        ``generation``, else close it; or schedule the restart ``verdict`` calls for."""
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
        if self._sessions.own(self.name):
            return self._open_box(conn)
        sessions = self._sessions
        if restart and sessions.recorded(self.client_id) is None and not self._held_now():
            # its record is gone too, and so is the store's (or the store cannot say
            # now): deleted through another instance (core deletes the store's record,
            # then ends the session, then clears the session's record), which core
            # follows and stops this handle; never made again from here
            self.unrecorded += 1
            log.warning(
                "MQTT subscription session of %s and its record are gone from the "
                "broker and the store does not hold it (deleted through another "
                "instance), or cannot say now: not delivering it",
                self.name,
            )
            return "unrecorded"
        present = conn.connect()
        self.connections += 1
        if not present and first and not self._still_recorded(conn):
            if not sessions.record_again(conn, self.client_id, self.filters, self.name):
                self.unrecorded += 1
                log.warning(
                    "MQTT subscription session of %s and its record are gone from the "
                    "broker: not making it again (taken as deleted through another "
                    "instance: core did not tell how to ask its store)",
                    self.name,
                )
                return "unrecorded"
            return "asking"  # the store is asked off this thread (cluster_remake)
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

    def _open_box(self, conn: SessionConnection) -> str:
        """``_open`` for this instance's own dead-letter box: made (again) whatever the
        broker had.  A box session found gone was retired by the instance running
        periodic work while this one looked departed (:mod:`.box_retire`), or lost by the
        broker: this instance is alive, so the box joins the group again and its record,
        naming this instance, is written again."""
        present = conn.connect()
        self.connections += 1
        conn.subscribe(self.filters)
        if not present:
            self._sessions.write_record(self.client_id, self.filters, self.name)
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
            busy = self._conn is not None or self._pending is not None or self._asking
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
        "sessions_remade": sum(h.remade for h in live),
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
