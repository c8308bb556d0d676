"""The gateway's persistent MQTT session and the worker that moves what it receives into
the gateway-kept queues.

One persistent session per gateway instance (clean start false, QoS 1, session expiry
``session_expiry``) subscribes to the effective filters of every subscription
(:mod:`.filters`).  The broker keeps the session's messages while the gateway is away; while
it is connected, the link's network thread hands every message to the worker through one FIFO
(``_inbox``) and never blocks.  The worker takes up to ``ingest_batch`` messages at a time,
routes them by topic into the queue store (``adapters.embedded.store.Engine``: one SQLite
transaction per batch; each subscription's own patterns decide, so a message reaches a
subscription once however many of its filters match) and only then sends their PUBACKs,
in the order the messages arrived.  A gateway killed before that commit gets the messages
again from the broker (at-least-once); nothing the broker acknowledged to a publisher is
lost, as long as the broker keeps the session (see docs/adapters/mqtt.md).

Dropped on arrival (and acknowledged): a message with the RETAIN flag (the broker sends
retained messages on a new subscription; they are not new notifications); the second of
two copies of one message that came through two different filters (while the filter set
changes, old and new filters overlap for a moment: the broker queues one copy per
matching filter, one after the other, and MQTT 5 subscription identifiers tell the
filters apart); and QoS 0 messages beyond ``qos0_backlog`` waiting ones (QoS 0 is at most
once; QoS 1 traffic is bounded by the session's Receive Maximum).

A new subscription is attached to the queue store by the worker, at a *barrier*: a QoS 1
message (its payload a token) that the session publishes, right after the subscription's
SUBSCRIBEs, to a topic of its own (:func:`sentinel_topic`, subscribed before the first
barrier of each connection).  The broker queues it for the session behind everything it
queued before, and the worker stores those before it attaches the subscription, so a
subscription receives what was published after it was created, not what was still on
its way; even behind a backlog longer than the Receive Maximum window (after a
reconnect), which a control packet (an UNSUBACK, a SUBACK) would overtake.  This rests on
the broker sending a session's messages in the order it queued them, across topics (MQTT
promises the order per topic and publisher only; Mosquitto keeps one FIFO per session);
it needs no MQTT 5 feature, so MQTT 3.1.1 gets the same barrier.  Sentinels are
acknowledged and never routed; one whose barrier is gone (a connection lost, a copy
through a second filter, a previous run) is dropped.  A broker that refuses the
sentinel topic (a failed SUBACK or, MQTT 5, PUBACK) gets the former barrier (logged as an
error): the UNSUBACK of a no-op
UNSUBSCRIBE, which is right unless the session has a backlog beyond its window.

Besides the queue store, *taps* (:mod:`.taps`) may consume the session: their filters join
the same filter set, and the worker hands each tap its messages after the queue store's
commit and before the PUBACKs.  A session may have taps and no queue store (the Spark
bridge's standalone MQTT buffer).

After every CONNACK the worker makes the broker hold the effective filters
(``_reconcile``): all of them when the session is new; with ``session present``, those not
acknowledged yet and every *shared* filter (``$share/...``, the dead-letter boxes'):
Mosquitto 2.0.11 does not keep a session's shared subscriptions across its restart, yet
answers ``session present`` and keeps its plain ones and its queued messages (tested in
tests/adapters/test_mqtt_dead_letter_restart.py).

Acknowledgements are sent only on the connection the message came on: after a reconnect
the broker sends unacknowledged messages again, and a late PUBACK could otherwise
acknowledge a different message that reuses the packet id.

Subscribing and unsubscribing happen under ``_lock`` (paho's calls only queue packets);
SUBACK and UNSUBACK are put in the same FIFO as the messages (a barrier's sentinel is one
of the messages).  A filter being replaced is unsubscribed only once its replacements are
acknowledged, so its topics are never uncovered.

Code layout: :class:`Session` (here: lifecycle, subscribing and the network callbacks),
its barriers (:mod:`.barriers`: the sentinels, their fallback, waiting for an action's
result) and its worker (:mod:`.ingest`) share the state and the FIFO's records of
:mod:`.inbox`.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from wsnmom.adapters.embedded.store import Engine
from wsnmom.core.adapter import AccessRefused, AdapterUnavailable

from .barriers import Barriers, sentinel_topic
from .config import MqttSettings
from .filters import SHARED, Change, FilterSet
from .inbox import (
    _STOP,
    SessionStats,
    _Acked,
    _After,
    _Barrier,
    _Connected,
    _nothing,
    _Removed,
    _Retire,
    _SentinelRefused,
)
from .ingest import Ingest
from .link import Link, Properties, ReasonCode, mqtt
from .mapping import MqttMapping
from .state import SessionState
from .taps import Taps

__all__ = ["Session"]

log = logging.getLogger("wsnmom.adapters.mqtt")

try:
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.subscribeoptions import SubscribeOptions
except ImportError as exc:  # pragma: no cover - link.py raised already
    raise ImportError('the MQTT adapter needs paho-mqtt: pip install "wsnmom[mqtt]"') from exc

#: seconds between two warnings about dropped QoS 0 messages
_WARN_EVERY = 30.0


class Session(Barriers, Ingest):
    """The persistent session, its filters and its ingest worker (module docstring)."""

    def __init__(
        self,
        settings: MqttSettings,
        client_id: str,
        engine: Engine | None,
        mapping: MqttMapping,
        state: SessionState,
        taps: Taps | None = None,
    ) -> None:
        self.settings = settings
        #: the gateway's queue store (None: the taps are the only consumers)
        self.engine = engine
        self.taps = taps or Taps()
        self.mapping = mapping
        self.state = state
        self.filters = FilterSet(state.filters())
        self._stored = dict(self.filters.known)
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        #: bumped when a connection is lost: PUBACKs go out on their own connection only
        self._generation = 0
        self._sub_mids: dict[int, tuple[str, int]] = {}
        self._unsub_mids: dict[int, tuple[str, int]] = {}
        #: SUBSCRIBEs / UNSUBSCRIBEs not acknowledged yet (sent again after a reconnect)
        self._pending_sub: dict[str, int] = {}
        self._pending_unsub: dict[str, int] = {}
        self._after: list[_After] = []
        #: the topic of the session's barriers, and the tokens of those sent, not arrived
        self.sentinel_topic = sentinel_topic(mapping.head, client_id)
        self._barriers: dict[bytes, _Barrier] = {}
        self._tokens = itertools.count()
        #: the SUBSCRIBE of the sentinel topic went out on this connection, and its mid
        self._sentinel_subscribed = False
        self._sentinel_mid: int | None = None
        #: when the broker refused the sentinel topic (its ACL): barriers fall back to
        #: UNSUBACKs
        self._sentinel_refused_since: float | None = None
        #: barriers sent as a no-op UNSUBSCRIBE (the fallback), by mid
        self._unsub_barriers: dict[int, _Barrier] = {}
        #: unique to this run: a sentinel of a previous run completes nothing
        self._run_id = uuid.uuid4().hex
        self._unacked_barriers: list[_Barrier] = []
        #: (identifiers, signature) of the last message stored (worker only)
        self._previous: tuple[frozenset[int], tuple[Any, ...]] | None = None
        self._ids = settings.v5
        self.stats = SessionStats()
        self._last_warning = 0.0
        self._worker: threading.Thread | None = None
        self._stopping = False
        self.link = Link(
            settings,
            client_id,
            persistent=True,
            manual_ack=True,
            on_connected=self._connected_cb,
            on_disconnected=self._disconnected_cb,
            label="MQTT session",
        )
        client = self.link.client
        client.on_message = self._message_cb
        client.on_subscribe = self._subscribe_cb
        client.on_unsubscribe = self._unsubscribe_cb
        client.on_publish = self._publish_cb
        self._first = True
        #: the first CONNACK was handled (the broker has or was asked for every filter)
        self._reconciled = False
        #: the CONNACK of this connection was handled (cleared when it is lost)
        self._resubscribed = False

    # -- lifecycle --------------------------------------------------------------------------
    def start(self, subscriptions: Iterable[tuple[str, frozenset[str]]]) -> None:
        """Plan the filters of the stored subscriptions, connect, subscribe what the broker
        lacks and wait (up to ``subscribe_timeout``, longer for many filters) until it has
        every filter."""
        with self._lock:
            for name, wanted in subscriptions:
                self.filters.assign(name, wanted)
            for tap in self.taps.taps:
                self.filters.assign(self.taps.key(tap), self.mapping.filters(tap.patterns))
        self._worker = threading.Thread(target=self._run, name="wsnmom-mqtt-ingest", daemon=True)
        self._worker.start()
        try:
            self.link.start(self.settings.connect_timeout)
            timeout = self.settings.subscribe_timeout + len(self.filters) / 2000
            with self._cv:
                done = self._cv.wait_for(self._all_acked, timeout)
            if not done:
                raise AdapterUnavailable(
                    "the MQTT broker did not acknowledge the session's subscriptions "
                    f"within {timeout:.0f}s"
                )
        except BaseException:
            self.stop()
            raise

    def subscribed(self) -> bool:
        """Whether the broker holds every shared filter now: connected, this
        connection's CONNACK handled (the shared filters, which the broker may have
        dropped, subscribed again) and no SUBSCRIBE of a shared filter waiting for its
        SUBACK.  The dead-letter outbox waits for it, so that a box's shared
        subscription exists when its dead letters arrive."""
        if not (self.link.connected and self._resubscribed):
            return False
        with self._lock:
            return not any(f.startswith(SHARED) for f in self._pending_sub)

    def _all_acked(self) -> bool:
        # O(1): evaluated on every SUBACK while thousands of filters are subscribed again
        return self._reconciled and not self._pending_sub

    def stop(self) -> None:
        """Commit and acknowledge what arrived, then disconnect; idempotent."""
        if self._stopping:
            return
        self._stopping = True
        worker = self._worker
        if worker is not None:
            self._inbox.put(_STOP)
            worker.join(30)
        self.link.stop()

    # -- subscriptions ----------------------------------------------------------------------
    def assign(
        self,
        name: str,
        filters: frozenset[str],
        action: Callable[[], Any] | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Subscription ``name`` needs ``filters``; returns once the broker has every
        filter serving it.  With ``action``, the worker runs it at a barrier sent right
        after the SUBSCRIBEs (one round trip for both: the broker answers in order) and
        its result is returned.  AdapterUnavailable when the session is not connected or
        the broker does not answer in time, AccessRefused when it refuses a filter."""
        if not filters and action is None:
            with self._lock:
                self._apply(self.filters.assign(name, filters))
            return None
        if not self.link.connected:
            raise AdapterUnavailable("the MQTT session is not connected")
        wait = self.settings.subscribe_timeout if timeout is None else timeout
        deadline = time.monotonic() + wait
        barrier = _Barrier(action) if action is not None else None
        with self._lock:
            if not self.link.connected:  # lost meanwhile: nothing changed yet
                raise AdapterUnavailable("the MQTT session is not connected")
            self._apply(self.filters.assign(name, filters))
            if barrier is not None:
                self._unacked_barriers.append(barrier)
                self._send_barrier(barrier)
        result = self._await(barrier, wait) if barrier is not None else None
        with self._cv:
            done = self._cv.wait_for(
                lambda: self._serves(name) or not self.link.connected,
                max(0.0, deadline - time.monotonic()),
            ) and self._serves(name)
            refused = [
                (f, self.stats.refused_filters[f])
                for f, _ in self.filters.serving(name)
                if f in self.stats.refused_filters
            ]
        if refused:
            f, reason = refused[0]
            raise AccessRefused(f"the MQTT broker refused the subscription to {f!r}: {reason}")
        if not done:
            if not self.link.connected:
                raise AdapterUnavailable("the connection to the MQTT broker was lost")
            raise AdapterUnavailable(
                f"the MQTT broker did not acknowledge the subscription within {wait:g}s"
            )
        return result

    def release(self, name: str) -> None:
        """Subscription ``name`` is gone: its filters go when nobody else needs them."""
        with self._lock:
            self._apply(self.filters.release(name))

    def _serves(self, name: str) -> bool:
        return all(
            self.filters.is_acked(f, sid) or f in self.stats.refused_filters
            for f, sid in self.filters.serving(name)
        )

    def _apply(self, change: Change) -> None:
        """Send a change's SUBSCRIBEs and arrange its retirements (``_lock`` held)."""
        if not change:
            return
        for f, sid in change.subscribe:
            self._send_subscribe(f, sid)
        if change.subscribe:
            self._after.append(_After(set(change.subscribe), tuple(change.retire)))
        elif change.retire:
            self._inbox.put(_Retire(tuple(change.retire)))

    def _send_subscribe(self, f: str, sid: int) -> None:
        self._pending_sub[f] = sid
        self.stats.refused_filters.pop(f, None)
        client = self.link.client
        if self.settings.v5:
            props: Properties | None = None
            if self._ids:
                props = Properties(PacketTypes.SUBSCRIBE)  # type: ignore[no-untyped-call]
                props.SubscriptionIdentifier = sid
            options = SubscribeOptions(qos=1, noLocal=False, retainHandling=2)
            rc, mid = client.subscribe(f, options=options, properties=props)
        else:
            rc, mid = client.subscribe(f, qos=1)
        if rc == mqtt.MQTT_ERR_SUCCESS and mid is not None:
            self._sub_mids[mid] = (f, sid)

    def _send_unsubscribe(self, f: str, sid: int) -> None:
        self._pending_unsub[f] = sid
        rc, mid = self.link.client.unsubscribe(f)
        if rc == mqtt.MQTT_ERR_SUCCESS and mid is not None:
            self._unsub_mids[mid] = (f, sid)

    # -- paho callbacks (network thread; never block) ---------------------------------------
    def _message_cb(self, client: Any, userdata: Any, message: Any) -> None:
        if message.qos == 0 and self._inbox.qsize() > self.settings.qos0_backlog:
            self.stats.dropped_qos0 += 1
            now = time.monotonic()
            if now - self._last_warning > _WARN_EVERY:
                self._last_warning = now
                log.warning(
                    "MQTT session: dropping QoS 0 messages, %d wait to be stored "
                    "(%d dropped so far)",
                    self._inbox.qsize(),
                    self.stats.dropped_qos0,
                )
            return
        self._inbox.put((self._generation, message))

    def _subscribe_cb(
        self, client: Any, userdata: Any, mid: int, reasons: list[ReasonCode], props: Any
    ) -> None:
        if mid == self._sentinel_mid:
            if reasons and reasons[0].is_failure:
                self._inbox.put(_SentinelRefused(str(reasons[0])))
            return
        with self._cv:
            op = self._sub_mids.pop(mid, None)
            if op is None:
                return
            f, sid = op
            if self._pending_sub.get(f) == sid:
                del self._pending_sub[f]
            reason = reasons[0] if reasons else None
            if reason is not None and reason.is_failure:
                self.stats.refused_filters[f] = str(reason)
                log.error("MQTT session: the broker refused the subscription to %r (%s)", f, reason)
                self._after = [a for a in self._after if (f, sid) not in a.waiting]
            else:
                if self.filters.acked(f, sid):
                    self._inbox.put(_Acked(f, sid))
                for after in list(self._after):
                    after.waiting.discard((f, sid))
                    if not after.waiting:
                        self._after.remove(after)
                        if after.retire:
                            self._inbox.put(_Retire(after.retire))
            self._cv.notify_all()

    def _publish_cb(
        self, client: Any, userdata: Any, mid: int, reason: ReasonCode, props: Any
    ) -> None:
        # paho holds its own lock here: the worker falls back (the session publishes
        # sentinels only; Mosquitto grants a SUBSCRIBE its ACL denies, and refuses the
        # PUBLISH, on MQTT 5 only)
        if reason is not None and reason.is_failure:
            self._inbox.put(_SentinelRefused(str(reason)))

    def _unsubscribe_cb(
        self, client: Any, userdata: Any, mid: int, reasons: list[ReasonCode], props: Any
    ) -> None:
        with self._lock:
            barrier = self._unsub_barriers.pop(mid, None)
            if barrier is not None:
                if barrier in self._unacked_barriers:
                    self._unacked_barriers.remove(barrier)
                self._inbox.put(barrier)
                return
            op = self._unsub_mids.pop(mid, None)
            if op is None:
                return
            f, sid = op
            if self._pending_unsub.get(f) == sid:
                del self._pending_unsub[f]
            self.filters.unsubscribed(f, sid)
        self._inbox.put(_Removed(f, sid))

    def _connected_cb(self, session_present: bool, properties: Any) -> None:
        if properties is not None:
            available = getattr(properties, "SubscriptionIdentifierAvailable", 1)
            self._ids = self.settings.v5 and bool(available)
        first, self._first = self._first, False
        self._inbox.put(_Connected(session_present, first))

    def _disconnected_cb(self) -> None:
        with self._cv:
            self._generation += 1
            self._resubscribed = False
            self._sentinel_subscribed = False
            self._sub_mids.clear()
            self._unsub_barriers.clear()
            self._unsub_mids.clear()
            self._barriers.clear()
            # fail fast: a subscription being created waits for no reconnect (its filters
            # are subscribed again then; the caller removes what it no longer wants)
            lost = AdapterUnavailable("the connection to the MQTT broker was lost")
            for b in self._unacked_barriers:
                b.action = _nothing
                b.error = lost
                b.done.set()
            self._unacked_barriers.clear()
            self._cv.notify_all()

    # -- information ------------------------------------------------------------------------
    def backlog(self) -> int:
        """Arrivals waiting to be stored."""
        return self._inbox.qsize()
