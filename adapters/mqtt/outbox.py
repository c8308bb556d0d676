"""Sending the dead letters the queue store's limits drop to the broker.

What a subscription's queue drops for its limits (``max_age``, ``max_messages``,
``max_bytes``) is dead-lettered in the transaction that drops it: with dead letters on the
broker (MQTT 5) the queue store writes it to its ``outbox`` table there
(``Engine(outbox=...)``), and :class:`Outbox` publishes it to its dead-letter MQTT topic
(QoS 1, not retained) and deletes the row once the broker acknowledged it.  A crash or a
lost connection between the PUBACK and the delete sends it again (at least once, never
lost); what waits in the outbox when the gateway starts is sent first.

One thread per node; it sleeps until a transaction wrote to the outbox.  While the
broker is away or refuses for a while (quota exceeded, no PUBACK in time) it tries again
after a delay that doubles from ``_RETRY_FIRST`` at each failed attempt, up to
``_RETRY_MAX``, and starts from the first delay again once a batch went through
(:meth:`Outbox.stats`: the delay now, the failed attempts in a row).

A dead letter the broker refuses for good (``PublishRefused``: not authorized by its ACL,
too large for it, ...) would be refused again each time and keep every later one waiting
behind it: it is *parked* instead, moved from the outbox into the gateway's own queue of
its destination (``Engine.outbox_park``, one transaction keyed on the outbox row: a
repeated park queues nothing twice), as on MQTT 3.1.1, so the gateway still lists,
counts, replays and purges it, and it is logged once; the others go on to the broker.
One whose destination has no box any more (deleted) is kept by the queue store as
*stranded* (:mod:`wsnmom.adapters.embedded.dead_letters`), counted in the stats, until
the box is opened again.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from wsnmom.adapters.embedded.store import Engine
from wsnmom.core.adapter import AdapterError, OutboundMessage
from wsnmom.topic_mapping.errors import NameNotRepresentable

from .mapping import MqttMapping
from .publisher import Publisher, PublishRefused

__all__ = ["Outbox"]

log = logging.getLogger("wsnmom.adapters.mqtt")

#: dead letters published per batch
_BATCH = 100
#: seconds before the first attempt again once publishing failed; doubled at each failed
#: attempt in a row, up to ``_RETRY_MAX``
_RETRY_FIRST = 1.0
_RETRY_MAX = 30.0


class Outbox:
    """The outbox sender of one node (see the module docstring)."""

    def __init__(
        self, engine: Engine, mapping: MqttMapping, publisher: Publisher, timeout: float
    ) -> None:
        self._engine = engine
        self._mapping = mapping
        self._publisher = publisher
        self._timeout = timeout
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        #: dead letters sent and confirmed since start, and parked (stats, tests)
        self.sent = 0
        self.parked = 0
        #: failed attempts in a row, and the wait before the next one (0: none failed)
        self.failures = 0
        self.retry_delay = 0.0

    def kick(self) -> None:
        """Something was written to the outbox (called after the commit)."""
        self._wake.set()

    def start(self) -> None:
        """Send what waits, then whatever comes."""
        self._thread = threading.Thread(target=self._run, name="wsnmom-mqtt-outbox", daemon=True)
        self._wake.set()
        self._thread.start()

    def stop(self) -> None:
        """Stop sending (what is not confirmed stays in the outbox)."""
        self._stopping = True
        self._stopped.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=self._timeout + 5)

    def stats(self) -> dict[str, Any]:
        """The sender's counts for the adapter's stats."""
        return {
            "dead_letters_sent": self.sent,
            "dead_letters_parked": self.parked,
            "dead_letters_stranded": self._engine.stranded_count(),
            "outbox_failures": self.failures,
            "outbox_retry_delay": self.retry_delay,
        }

    def _backoff(self) -> float:
        """Count a failed attempt; the seconds to wait before the next one."""
        self.failures += 1
        self.retry_delay = min(_RETRY_MAX, _RETRY_FIRST * 2 ** min(self.failures - 1, 16))
        return self.retry_delay

    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait()
            self._wake.clear()
            try:
                while not self._stopping and self._send():
                    self.failures, self.retry_delay = 0, 0.0
                self.failures, self.retry_delay = 0, 0.0
            except AdapterError as exc:
                if self._stopping:
                    return
                delay = self._backoff()
                log.warning(
                    "MQTT: dead letters wait in the outbox (attempt %d failed, next in %gs): %s",
                    self.failures,
                    delay,
                    exc,
                )
                self._wake.set()
                self._stopped.wait(delay)
            except Exception:  # pragma: no cover - keep sending later
                log.exception("MQTT: sending the outbox failed")
                self._wake.set()
                self._stopped.wait(self._backoff())

    def _send(self) -> bool:
        """Publish one batch and forget it once confirmed; False when none waited."""
        rows = self._engine.outbox_batch(_BATCH)
        if not rows:
            return False
        items = []
        bad: list[int] = []
        for rid, message in rows:
            try:
                items.append((rid, (self._mapping.name(message.topic), message)))
            except NameNotRepresentable as exc:  # pragma: no cover - names are checked
                log.error("MQTT: a dead letter without an MQTT topic is dropped: %s", exc)
                bad.append(rid)
        parked: list[tuple[int, OutboundMessage]] = []
        why: set[str] = set()
        if items:
            outcomes = self._publisher.publish_each(
                [item for _, item in items], self._timeout, retain=False
            )
            for (rid, (_, message)), outcome in zip(items, outcomes, strict=True):
                if isinstance(outcome, PublishRefused):
                    parked.append((rid, message))
                    why.add(str(outcome))
        if parked:
            homeless = self._engine.outbox_park(parked)
            self.parked += len(parked)
            log.error(
                "MQTT: the broker refuses %d dead letter(s) for good (%s); they are kept in "
                "the gateway's own dead letters instead (listed, replayed and purged as the "
                "others)%s",
                len(parked),
                "; ".join(sorted(why)),
                f"; {homeless} of them have no box (kept until it is opened again)"
                if homeless
                else "",
            )
        kept = {rid for rid, _ in parked}
        self._engine.outbox_remove([rid for rid, _ in items if rid not in kept] + bad)
        self.sent += len(items) - len(parked)
        return True
