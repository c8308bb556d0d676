"""A subscription session the broker lost, made again (docs/scale-out.md, "MQTT in
cluster mode"): the steps of :class:`~.cluster_handle.ClusterHandle` that follow the
store's answer, in :class:`Remaking`, which the handle inherits.

A handle that finds its session gone together with its record connects (its CONNECT makes
an empty session), writes the record again (``SubscriptionSessions.record_again``) and only
then asks whether core's store still holds the subscription.  The question goes to the
adapter's :class:`~.store_questions.StoreQuestions`, which asks the store once for every
question of a burst, on a thread of its own: a ``start`` (a shard gained, on core's
opening threads) returns without waiting for the store, its connection still being made
(a ``stop`` meanwhile closes it).  The answer:

* **there**: the connection subscribes the filters and delivers;
* **gone** (deleted through another instance before this CONNECT): the session is ended
  and its record cleared;
* **not known** (the store failed): nothing is ended.  The session and its record stay,
  its filters are subscribed by a connection that delivers nothing (so it queues what is
  published meanwhile), and the store is asked again after the reconnect backoff before
  the handle delivers it.  An instance that stopped the handle meanwhile leaves the
  session as it is: the next deliverer connects to it and delivers; a subscription deleted
  before this CONNECT leaves a session whose record names it, which the orphan sweep
  deletes after ``termination.orphan_grace`` (``own_names``).
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

from wsnmom.core.adapter import AdapterError

from .cluster_sessions import SubscriptionSessions
from .store_questions import Answer
from .sub_session import SessionConnection

__all__ = ["Remaking", "RemakingHost"]

log = logging.getLogger("wsnmom.adapters.mqtt")


class RemakingHost(Protocol):
    """The steps of its own that :class:`Remaking` needs of the handle it is mixed into
    (:class:`~.cluster_handle.ClusterHandle`).  Explicitly subclassed, their trivial
    bodies are abstract to mypy: a handle class that misses one cannot be made."""

    def _live(self, generation: int) -> bool:
        """Whether an attempt of ``generation`` may still install its connection (lock
        held)."""
        ...

    def _schedule(self, delay: float, *, first: bool, restart: bool = False) -> None:
        """Connect again after ``delay`` seconds, on a timer thread (lock held)."""
        ...

    def _install(self, generation: int, conn: SessionConnection, verdict: str) -> None:
        """Install ``conn`` (connected, subscribed) if the handle is still started on
        ``generation``, else close it; or schedule the restart ``verdict`` calls for."""
        ...


class Remaking(RemakingHost):
    """The store's answers about a session made again (module docstring); mixed into
    :class:`~.cluster_handle.ClusterHandle`, whose state (declared here, set by the
    handle) it shares."""

    name: str
    client_id: str
    filters: frozenset[str]
    remade: int
    unrecorded: int
    _sessions: SubscriptionSessions
    _lock: threading.RLock
    _pending: SessionConnection | None
    _conn: SessionConnection | None
    _started: bool
    _deleted: bool
    _delay: float
    _unconfirmed: bool
    _asking: bool

    def _held_now(self) -> bool:
        """Whether the store holds the subscription, asked now (with the questions of
        the moment) by a thread that may wait (a restart's timer thread); False when
        core did not tell how to ask, or the store cannot say now."""
        questions = self._sessions.questions
        if not questions.told:
            return False
        return questions.answer(self.name, self._sessions.settings.subscribe_timeout) is True

    def _ask(self, generation: int, conn: SessionConnection | None) -> None:
        """Ask the store whether the subscription still exists, for the session ``conn``
        made again (connected, not subscribed; it stays the handle's pending connection),
        or, ``conn`` None, the session kept while the store could not say."""
        self._sessions.questions.ask(
            self.name, lambda answer: self._answered(generation, conn, answer)
        )

    def _idle(self) -> bool:
        """Whether the handle is started with nothing under way (lock held)."""
        return (
            self._started
            and not self._deleted
            and self._conn is None
            and self._pending is None
            and not self._asking
        )

    def _answered(self, generation: int, conn: SessionConnection | None, answer: Answer) -> None:
        """The store's ``answer`` (on a reply thread of the questions)."""
        if answer is True:
            self._confirmed(generation, conn)
            return
        settings = self._sessions.settings
        restart = answer is False
        unsure = not restart
        try:
            if restart:
                self._undo(conn)
            else:
                self._keep(generation, conn)
        except AdapterError as exc:
            unsure = True  # asked again, and undone or kept then
            log.warning("MQTT subscription session of %s: %s; trying again", self.name, exc)
        with self._lock:
            if conn is not None and self._pending is conn:
                self._pending = None
            self._asking = False
            self._unconfirmed = unsure
            delay = settings.reconnect_max_delay if restart else self._delay
            if unsure:
                self._delay = min(self._delay * 2, settings.reconnect_max_delay)
            if self._idle():
                self._schedule(delay, first=True, restart=restart and not unsure)

    def _confirmed(self, generation: int, conn: SessionConnection | None) -> None:
        """The store holds the subscription: ``conn`` subscribes and delivers (a kept
        session: a connection is made to deliver it)."""
        log.warning(
            "MQTT subscription session of %s (%s) and its record were gone from the "
            "broker, which lost its state: made again; messages published meanwhile are "
            "lost",
            self.name,
            self.client_id,
        )
        with self._lock:
            self.remade += 1
            self._unconfirmed = False
            self._asking = False
            if conn is None:
                if self._idle():
                    self._schedule(0.0, first=True)
                return
            live = self._live(generation) and self._pending is conn
        if not live:
            conn.close()  # stopped meanwhile: the next start subscribes it
            return
        try:
            conn.subscribe(self.filters)
        except AdapterError as exc:
            conn.close()
            with self._lock:
                if self._pending is conn:
                    self._pending = None
                if self._idle():
                    self._schedule(self._delay, first=True)
            log.warning("MQTT subscription session of %s: %s; trying again", self.name, exc)
            return
        self._install(generation, conn, "ok")

    def _undo(self, conn: SessionConnection | None) -> None:
        """The store does not hold the subscription: deleted through another instance
        before this session was made again.  End it and clear its record (a session made
        here would outlive the subscription: core's follower only stops this handle)."""
        if conn is not None:
            conn.close()
        self._sessions.delete(self.client_id)
        self.unrecorded += 1
        log.warning(
            "MQTT subscription session of %s and its record are gone from the broker and "
            "the store does not hold it: not making it again (deleted through another "
            "instance)",
            self.name,
        )

    def _keep(self, generation: int, conn: SessionConnection | None) -> None:
        """The store cannot say now: keep the session and its record, subscribe its
        filters by a connection that delivers nothing (unless stopped meanwhile), and ask
        again later.  Never ended on an unanswered question."""
        if conn is None:
            return
        conn.close()  # clean: the broker keeps the session
        with self._lock:
            live = self._live(generation)
        log.warning(
            "MQTT subscription session of %s was gone from the broker and the store cannot "
            "say whether it still exists: the session made again is kept%s; asking again",
            self.name,
            ", its filters subscribed" if live else "",
        )
        if live:
            settings = self._sessions.settings
            self._sessions.declare(
                self.client_id, self.filters, settings.subscribe_timeout, self.name, new=True
            )
