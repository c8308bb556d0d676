"""The MQTT session's barriers: run an action on the session's worker once everything the
broker queued for the session before it has been stored (:mod:`.session` describes why).

A barrier is a QoS 1 *sentinel* (its payload a token unique to this run) that the session
publishes to a topic of its own (:func:`sentinel_topic`, subscribed before the first
barrier of each connection); the worker (:mod:`.ingest`) runs the barrier's action when
the sentinel arrives, after storing what arrived before it.  A broker that refuses the
sentinel topic gets the fallback barrier from then on (:meth:`Barriers._sentinel_refused`):
the UNSUBACK of a no-op UNSUBSCRIBE of :data:`FALLBACK_BARRIER_TOPIC`.  A barrier not
answered in time is cancelled (its action never runs); a lost connection fails every
barrier waiting (``Session._disconnected_cb``).

:class:`Barriers` is a part of :class:`~wsnmom.adapters.mqtt.session.Session`, whose
``__init__`` sets up the state it uses (declared here and in :class:`.inbox.SessionParts`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from wsnmom.core.adapter import AdapterUnavailable

from .inbox import SessionParts, _Barrier, _nothing
from .link import mqtt

__all__ = ["FALLBACK_BARRIER_TOPIC", "SENTINEL_ROOT", "Barriers", "sentinel_topic"]

log = logging.getLogger("wsnmom.adapters.mqtt")

try:
    from paho.mqtt.subscribeoptions import SubscribeOptions
except ImportError as exc:  # pragma: no cover - link.py raised already
    raise ImportError('the MQTT adapter needs paho-mqtt: pip install "wsnmom[mqtt]"') from exc

#: the level under the topic prefix of the sessions' sentinel topics
SENTINEL_ROOT = "wsnmom/sentinel"


#: the fallback barrier (:meth:`Barriers._sentinel_refused`) unsubscribes this topic,
#: never subscribed
FALLBACK_BARRIER_TOPIC = "wsnmom/barrier"


def sentinel_topic(head: str, client_id: str) -> str:
    """The topic of the barriers of the session ``client_id`` (``head``: the topic prefix
    and its slash, or ""); characters a topic level cannot hold become ``_``."""
    level = "".join("_" if c in "+#/\x00" else c for c in client_id) or "_"
    return f"{head}{SENTINEL_ROOT}/{level}"


class Barriers(SessionParts):
    """The barriers of a :class:`~wsnmom.adapters.mqtt.session.Session` (module docstring)."""

    _tokens: Iterator[int]
    _sentinel_subscribed: bool
    _sentinel_mid: int | None
    _sentinel_refused_since: float | None
    _unsub_barriers: dict[int, _Barrier]
    _run_id: str

    def at_barrier(self, action: Callable[[], Any], timeout: float | None = None) -> Any:
        """Run ``action`` on the worker once everything the broker queued for the
        session before this call has been stored (a barrier), and return its result: a
        publish the broker confirmed is in the queues it was routed to when ``action``
        runs.  AdapterUnavailable when the session is not connected or the broker does
        not answer in time (``action`` then never runs)."""
        if not self.link.connected:
            raise AdapterUnavailable("the MQTT session is not connected")
        wait = self.settings.subscribe_timeout if timeout is None else timeout
        barrier = _Barrier(action)
        with self._lock:
            if not self.link.connected:
                raise AdapterUnavailable("the MQTT session is not connected")
            self._unacked_barriers.append(barrier)
            self._send_barrier(barrier)
        return self._await(barrier, wait)

    def _await(self, b: _Barrier, wait: float) -> Any:
        """The result of barrier ``b``'s action (waiting up to ``wait`` seconds)."""
        if not b.done.wait(wait):
            cancelled = False
            with self._lock:
                if b in self._unacked_barriers:
                    self._unacked_barriers.remove(b)
                    b.action = _nothing
                    cancelled = True
            # cancelled: the action will never run, so there is no result to return even
            # when the late sentinel completes the barrier (it ran ``_nothing``)
            if cancelled or not b.done.wait(0.5):
                raise AdapterUnavailable(f"the MQTT broker did not answer within {wait:g}s")
        if b.error is not None:
            raise b.error
        return b.result

    def _send_barrier(self, b: _Barrier) -> None:
        if self._sentinel_refused_since is not None:
            self._send_unsubscribe_barrier(b)
            return
        if not self._sentinel_subscribed:
            self._subscribe_sentinel()
        token = f"{self._run_id}:{next(self._tokens)}".encode()
        self._barriers[token] = b
        self.link.client.publish(self.sentinel_topic, token, qos=1)

    def _send_unsubscribe_barrier(self, b: _Barrier) -> None:
        """The fallback barrier: the UNSUBACK of a no-op UNSUBSCRIBE, which overtakes
        messages the broker holds back behind a full Receive Maximum window."""
        rc, mid = self.link.client.unsubscribe(FALLBACK_BARRIER_TOPIC)
        if rc == mqtt.MQTT_ERR_SUCCESS and mid is not None:
            self._unsub_barriers[mid] = b

    def _subscribe_sentinel(self) -> None:
        """Subscribe the sentinel topic (before the connection's first barrier: the broker
        handles a connection's packets in order; ``_lock`` held).  Only sessions that
        attach subscriptions need it (not one of taps only)."""
        self._sentinel_subscribed = True
        client = self.link.client
        if self.settings.v5:
            options = SubscribeOptions(qos=1, noLocal=False, retainHandling=2)
            _, self._sentinel_mid = client.subscribe(self.sentinel_topic, options=options)
        else:
            _, self._sentinel_mid = client.subscribe(self.sentinel_topic, qos=1)

    def _sentinel_refused(self, reason: str) -> None:
        """The broker refused the sentinel topic: the barriers waiting for sentinels and
        all later ones (this run) fall back to UNSUBACKs (worker)."""
        if self._sentinel_refused_since is not None:
            return
        log.error(
            "MQTT session: the broker refused the sentinel topic %r "
            "(%s): a subscription created behind a backlog of more than the Receive "
            "Maximum may receive older messages; allow the gateway to publish and "
            "subscribe it (see the ACLs in docs/adapters/mqtt.md)",
            self.sentinel_topic,
            reason,
        )
        with self._lock:
            self._sentinel_refused_since = time.monotonic()
            waiting, self._barriers = list(self._barriers.values()), {}
            for b in waiting:
                self._send_unsubscribe_barrier(b)
