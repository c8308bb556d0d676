"""The MQTT session's worker: it takes what the network thread put in the FIFO, up to
``ingest_batch`` at a time, drops retained messages and twins, stores the rest in the
queue store (one transaction) and hands them to the taps, runs the barriers whose
sentinels arrived (after storing what came before them), then sends the PUBACKs on the
connection the messages came on; it also applies the broker's acknowledgements of
filters and reconciles the filters after each CONNACK (see :mod:`.session`)."""

from __future__ import annotations

import functools
import itertools
import logging
import queue
import time
from collections.abc import Callable, Iterable
from typing import Any

from wsnmom.adapters.embedded.store import Engine
from wsnmom.core.adapter import AdapterUnavailable, OutboundMessage

from .filters import SHARED
from .inbox import (
    _STOP,
    SessionParts,
    _Acked,
    _After,
    _Barrier,
    _Connected,
    _Removed,
    _Retire,
    _SentinelRefused,
)
from .taps import Arrival
from .wire import metadata, outbound

log = logging.getLogger("wsnmom.adapters.mqtt")

#: seconds between attempts to commit a batch the queue store refused
_RETRY_DELAY = 0.5


def _topic_of(message: Any) -> str:
    """The message's topic name ("" when it is not UTF-8: no WS topic has it)."""
    try:
        return str(message.topic)
    except UnicodeDecodeError:
        return ""


class Ingest(SessionParts):
    """The worker of a :class:`~wsnmom.adapters.mqtt.session.Session`."""

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
                if message.qos:
                    acks.append((generation, message.mid, message.qos))
                if _topic_of(message) == self.sentinel_topic:
                    barrier = self._arrived(bytes(message.payload))
                    if barrier is not None:
                        if keep:  # everything before the sentinel is stored first
                            self._commit(keep)
                            keep = []
                        _run_barrier(barrier)
                    continue
                stats.received += 1
                if message.retain:
                    stats.dropped_retained += 1
                    continue
                if self._twin(message):
                    stats.dropped_twins += 1
                    continue
                keep.append(self._convert(message))
            elif isinstance(item, _Barrier):  # the fallback (an UNSUBACK)
                if keep:
                    self._commit(keep)
                    keep = []
                _run_barrier(item)
            elif isinstance(item, _SentinelRefused):
                self._sentinel_refused(item.reason)
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

    def _arrived(self, token: bytes) -> _Barrier | None:
        """The barrier whose sentinel carries ``token`` (None: one that is gone, a copy
        through another filter, a previous run's), no longer waited for."""
        with self._lock:
            barrier = self._barriers.pop(token, None)
            if barrier is not None and barrier in self._unacked_barriers:
                self._unacked_barriers.remove(barrier)
            return barrier

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
                    if e.filter.startswith(SHARED):
                        # Mosquitto 2.0.11 does not keep a session's shared subscriptions
                        # across its restart, yet says session present: subscribed again
                        # (a SUBSCRIBE of a filter the session has replaces it)
                        self._send_subscribe(e.filter, e.id)
                    elif known is not None and known.get(e.filter) == e.id:
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
            self._resubscribed = True
            self._cv.notify_all()
        if not connected.session_present:
            try:
                self.state.clear_filters()
            except Exception:
                log.exception("MQTT session: recording the session's filters failed")


def _run_barrier(barrier: _Barrier) -> None:
    """Run a barrier's action (everything queued before its sentinel is stored)."""
    try:
        barrier.result = barrier.action()
    except BaseException as exc:
        barrier.error = exc
    barrier.done.set()
