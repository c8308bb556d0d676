"""The gateway's persistent MQTT session and the worker that moves what it receives into
the gateway-kept queues.

One persistent session per gateway instance (clean start false, QoS 1, session expiry
``session_expiry``) subscribes to the effective filters of every subscription
(:mod:`.filters`).  The broker keeps the session's messages while the gateway is away; while
it is connected, paho's network thread hands every message to the worker through one FIFO
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

A new subscription is attached to the queue store by the worker, at a *barrier*: the
UNSUBACK of an UNSUBSCRIBE sent once its filters are acknowledged.  Messages the broker
queued for the session before that reach it before the barrier, so a subscription
receives what was published after it was created, not what was still in flight (unless
the broker holds messages back behind a full Receive Maximum window).

Besides the queue store, *taps* (:mod:`.taps`) may consume the session: their filters join
the same filter set, and the worker hands each tap its messages after the queue store's
commit and before the PUBACKs.  A session may have taps and no queue store (the Spark
bridge's standalone MQTT buffer).

Acknowledgements are sent only on the connection the message came on: after a reconnect
the broker sends unacknowledged messages again, and a late PUBACK could otherwise
acknowledge a different message that reuses the packet id.

Subscribing and unsubscribing happen under ``_lock`` (paho's calls only queue packets);
SUBACK, UNSUBACK and barriers are put in the same FIFO as the messages.  A filter being
replaced is unsubscribed only once its replacements are acknowledged, so its topics are
never uncovered.
"""

from __future__ import annotations

import functools
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from wsnmom.adapters.embedded.store import Engine
from wsnmom.core.adapter import AccessRefused, AdapterUnavailable, OutboundMessage

from .config import MqttSettings
from .filters import Change, FilterSet
from .link import Link, Properties, ReasonCode, mqtt
from .mapping import MqttMapping
from .state import SessionState
from .taps import Arrival, Taps
from .wire import metadata, outbound

__all__ = ["Session"]

log = logging.getLogger("wsnmom.adapters.mqtt")

try:
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.subscribeoptions import SubscribeOptions
except ImportError as exc:  # pragma: no cover - link.py raised already
    raise ImportError('the MQTT adapter needs paho-mqtt: pip install "wsnmom[mqtt]"') from exc

#: seconds between attempts to commit a batch the queue store refused
_RETRY_DELAY = 0.5
#: seconds between two warnings about dropped QoS 0 messages
_WARN_EVERY = 30.0


@dataclass(frozen=True, slots=True)
class _Retire:
    """Unsubscribe these (filter, identifier) pairs now, unless effective again (worker)."""

    items: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class _Acked:
    """The broker acknowledged a filter (state update, worker)."""

    filter: str
    sid: int


@dataclass(frozen=True, slots=True)
class _Removed:
    """The broker acknowledged an UNSUBSCRIBE (state update, worker)."""

    filter: str
    sid: int


@dataclass(frozen=True, slots=True)
class _Connected:
    """A CONNACK: resubscribe what the broker does not have (worker)."""

    session_present: bool
    first: bool


@dataclass(eq=False)
class _Barrier:
    """An action the worker runs when everything the broker sent before the UNSUBACK of
    a no-op UNSUBSCRIBE has been stored."""

    action: Callable[[], Any]
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None


@dataclass(eq=False)
class _After:
    """Filters to retire once every filter in ``waiting`` is acknowledged."""

    waiting: set[tuple[str, int]]
    retire: tuple[tuple[str, int], ...]


@dataclass
class SessionStats:
    """Counters for tests and metrics."""

    received: int = 0
    committed: int = 0
    dropped_retained: int = 0
    dropped_twins: int = 0
    dropped_qos0: int = 0
    batches: int = 0
    refused_filters: dict[str, str] = field(default_factory=dict)


_STOP = object()

#: an UNSUBSCRIBE of this filter (never subscribed) is the session's barrier
BARRIER_TOPIC = "wsnmom/barrier"


def _nothing() -> None:
    return None


def _topic_of(message: Any) -> str:
    """The message's topic name ("" when it is not UTF-8: no WS topic has it)."""
    try:
        return str(message.topic)
    except UnicodeDecodeError:
        return ""


class Session:
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
        #: barriers sent and not acknowledged (sent again after a reconnect)
        self._barriers: dict[int, _Barrier] = {}
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
        self._first = True
        #: the first CONNACK was handled (the broker has or was asked for every filter)
        self._reconciled = False

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
            # when the late UNSUBACK completes the barrier (it ran ``_nothing``)
            if cancelled or not b.done.wait(0.5):
                raise AdapterUnavailable(f"the MQTT broker did not answer within {wait:g}s")
        if b.error is not None:
            raise b.error
        return b.result

    def _send_barrier(self, b: _Barrier) -> None:
        rc, mid = self.link.client.unsubscribe(BARRIER_TOPIC)
        if rc == mqtt.MQTT_ERR_SUCCESS and mid is not None:
            self._barriers[mid] = b

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

    def _unsubscribe_cb(
        self, client: Any, userdata: Any, mid: int, reasons: list[ReasonCode], props: Any
    ) -> None:
        with self._lock:
            barrier = self._barriers.pop(mid, None)
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
            self._sub_mids.clear()
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

    # -- the worker -------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop()
        finally:
            self.taps.close()

    def _loop(self) -> None:
        inbox = self._inbox
        limit = self.settings.ingest_batch
        while True:
            item = inbox.get()
            if item is _STOP:
                return
            items = [item]
            stop = False
            while len(items) < limit:
                try:
                    nxt = inbox.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stop = True
                    break
                items.append(nxt)
            try:
                self._process(items)
            except Exception:  # pragma: no cover - keep the worker alive, the broker resends
                log.exception("MQTT session: processing %d arrivals failed", len(items))
            if stop:
                return

    def _process(self, items: list[Any]) -> None:
        keep: list[Arrival] = []
        acks: list[tuple[int, int, int]] = []
        added: list[tuple[str, int]] = []
        removed: list[tuple[str, int]] = []
        later: list[Callable[[], None]] = []
        stats = self.stats
        for item in items:
            if type(item) is tuple:
                generation, message = item
                stats.received += 1
                if message.qos:
                    acks.append((generation, message.mid, message.qos))
                if message.retain:
                    stats.dropped_retained += 1
                    continue
                if self._twin(message):
                    stats.dropped_twins += 1
                    continue
                keep.append(self._convert(message))
            elif isinstance(item, _Barrier):
                if keep:  # everything before the barrier is stored first
                    self._commit(keep)
                    keep = []
                try:
                    item.result = item.action()
                except BaseException as exc:
                    item.error = exc
                item.done.set()
            elif isinstance(item, _Retire):
                self._retire(item.items)
            elif isinstance(item, _Acked):
                added.append((item.filter, item.sid))
            elif isinstance(item, _Removed):
                removed.append((item.filter, item.sid))
            elif isinstance(item, _Connected):
                self._previous = None
                later.append(functools.partial(self._reconcile, item))
        if keep:
            self._commit(keep)
        if acks:
            client = self.link.client
            with self._lock:
                generation = self._generation
                for gen, mid, qos in acks:
                    if gen == generation:
                        client.ack(mid, qos)
        if added or removed:
            try:
                self.state.update(added, removed)
            except Exception:
                log.exception("MQTT session: recording the session's filters failed")
        for action in later:
            action()

    def _twin(self, message: Any) -> bool:
        """Whether ``message`` is another copy of the message just before it, sent for
        another filter of the session (MQTT 5 subscription identifiers differ, all else is
        equal).  The broker queues the copies of one message together; the same message
        published twice comes again through a filter already seen, which starts a new
        group, so only copies are dropped."""
        props = message.properties
        ids = getattr(props, "SubscriptionIdentifier", None) if props is not None else None
        if not ids:
            self._previous = None
            return False
        mine = frozenset(ids)
        signature = (
            _topic_of(message),
            message.payload,
            tuple(getattr(props, "UserProperty", None) or ()),
            getattr(props, "ContentType", None),
        )
        previous = self._previous
        if previous is None or previous[0] & mine or previous[1] != signature:
            self._previous = (mine, signature)
            return False
        # another copy of the same message (three filters may overlap for a moment)
        self._previous = (previous[0] | mine, signature)
        return True

    def _convert(self, message: Any) -> Arrival:
        body = bytes(message.payload)
        headers, content_type = metadata(message.properties if self.settings.v5 else None, body)
        name = _topic_of(message)
        topic = self.mapping.topic(name, headers)
        return Arrival(name, outbound(topic, body, headers, content_type), bool(message.dup))

    def _commit(self, arrivals: list[Arrival]) -> None:
        """Store ``arrivals`` in the queue store (one transaction), then hand them to the
        taps; each is retried while it refuses, so that nothing is acknowledged to the
        broker before every consumer has it."""
        if self.engine is not None:
            self._store(self.engine, [a.message for a in arrivals])
        if self.taps:
            self.taps.deliver(arrivals, lambda: self._stopping)
        self.stats.committed += len(arrivals)
        self.stats.batches += 1

    def _store(self, engine: Engine, messages: list[OutboundMessage]) -> None:
        for attempt in itertools.count():
            try:
                engine.publish_many(messages)
                return
            except AdapterUnavailable:
                if self._stopping or engine.closed:
                    raise
            except Exception:
                if self._stopping:
                    raise
                if attempt == 0:
                    log.exception(
                        "MQTT session: storing %d messages failed; retrying", len(messages)
                    )
            time.sleep(_RETRY_DELAY)

    def _retire(self, items: Iterable[tuple[str, int]]) -> None:
        """Unsubscribe the filters that are not effective again (a comeback was subscribed
        anew after this retirement was planned: its SUBSCRIBE went out before this
        UNSUBSCRIBE would, which would remove it)."""
        with self._lock:
            for f, sid in items:
                if f not in self.filters.effective:
                    self._send_unsubscribe(f, sid)

    def _reconcile(self, connected: _Connected) -> None:
        """After a CONNACK: make the broker hold exactly the effective filters."""
        with self._lock:
            if connected.session_present:
                known = self._stored if connected.first else None
                for e in self.filters.effective.values():
                    if known is not None and known.get(e.filter) == e.id:
                        e.acked = True  # the broker kept it from the last run
                        self.filters.known[e.filter] = e.id
                    elif not e.acked or e.filter in self._pending_sub:
                        self._send_subscribe(e.filter, e.id)
                stale = (
                    tuple((f, sid) for f, sid in known.items() if f not in self.filters.effective)
                    if known
                    else ()
                )
                pending = [(f, sid) for f, sid in self._pending_sub.items()]
                if stale:
                    if pending:
                        self._after.append(_After(set(pending), stale))
                    else:
                        self._inbox.put(_Retire(stale))
                for f, sid in list(self._pending_unsub.items()):
                    self._send_unsubscribe(f, sid)
            else:
                if not connected.first or self._stored:
                    log.warning(
                        "MQTT session: the broker did not keep the gateway's session; "
                        "messages published while the gateway was away are lost "
                        "(check the broker's persistence and session expiry)"
                    )
                self.filters.reset_acks()
                self._pending_unsub.clear()
                for e in self.filters.effective.values():
                    self._send_subscribe(e.filter, e.id)
            for b in self._unacked_barriers:
                self._send_barrier(b)
            self._stored = {}
            self._reconciled = True
            self._cv.notify_all()
        if not connected.session_present:
            try:
                self.state.clear_filters()
            except Exception:
                log.exception("MQTT session: recording the session's filters failed")

    # -- information ------------------------------------------------------------------------
    def backlog(self) -> int:
        """Arrivals waiting to be stored."""
        return self._inbox.qsize()
