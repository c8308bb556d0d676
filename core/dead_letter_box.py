"""A dead-letter box (``core.dead_letters``): the dead letters of one destination this
gateway holds, consumed from the destination's durable subscription and held unsettled
(at most ``dead_letters.list_max``) until an operator replays or purges them; what is held
goes back to the middleware when the gateway stops.  Where the adapter needs
acknowledgements in order, a settled dead letter is acknowledged once those before it are.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from wsnmom.core import metrics
from wsnmom.core.adapter import (
    HEADER_DROPPED_AT,
    HEADER_DROPPED_ATTEMPTS,
    HEADER_DROPPED_FROM,
    HEADER_DROPPED_REASON,
    HEADER_MESSAGE_ID,
    HEADER_TOPIC_NAMESPACE,
    HEADER_TOPIC_PATH,
    AdapterError,
    Received,
    SubscriptionHandle,
)
from wsnmom.core.dead_letter_records import (
    H_ATTEMPTS,
    H_CONSUMER,
    H_COUNTED,
    H_ERROR,
    H_ID,
    H_REASON,
    H_SUBSCRIPTION,
    H_TIME,
    DeadLetter,
)

__all__ = ["DeadLetterBox"]

# the logger of core.dead_letters, as before the box had a module of its own
log = logging.getLogger("wsnmom.core.dead_letters")


def _letter(destination: str, key: str, received: Received, held_since: str) -> DeadLetter:
    """The dead letter ``key`` of ``received``: the gateway's context headers, or for one
    the middleware dropped itself, the adapter's ``HEADER_DROPPED_*`` (``held_since``:
    when the box received it)."""
    h = received.headers
    ns, path = h.get(HEADER_TOPIC_NAMESPACE), h.get(HEADER_TOPIC_PATH)
    native = H_REASON not in h and HEADER_DROPPED_REASON in h
    try:
        attempts = int(h.get(HEADER_DROPPED_ATTEMPTS if native else H_ATTEMPTS) or 0)
    except ValueError:
        attempts = 0
    return DeadLetter(
        id=key,
        destination=destination,
        subscription_id=h.get(HEADER_DROPPED_FROM if native else H_SUBSCRIPTION) or "",
        consumer=h.get(H_CONSUMER) or "",
        reason=h.get(HEADER_DROPPED_REASON if native else H_REASON) or "",
        attempts=attempts,
        last_error=h.get(H_ERROR) or None,
        time=h.get(HEADER_DROPPED_AT if native else H_TIME) or held_since,
        topic=f"{{{ns}}}{path}" if path else None,
        message_id=h.get(HEADER_MESSAGE_ID),
        content_type=received.content_type or "application/xml",
        body=bytes(received.body),
    )


class DeadLetterBox:
    """The dead letters of one destination this gateway holds (see the module
    docstring)."""

    def __init__(
        self,
        name: str,
        handle: SubscriptionHandle,
        *,
        in_order: bool,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.name = name
        self.handle = handle
        self._in_order = in_order
        self._clock = clock
        self._lock = threading.Lock()
        #: dead-letter id -> (message, settled but waiting for those before it, when the
        #: box received it)
        self._held: OrderedDict[str, list[Any]] = OrderedDict()

    def start(self, prefetch: int) -> None:
        """Consume, holding up to ``prefetch`` dead letters unsettled."""
        self.handle.start(self._on_message, prefetch=prefetch)

    def stop(self) -> None:
        """Stop; what is held goes back to the middleware."""
        with self._lock:
            self._held.clear()
            self._gauge()
        self.handle.stop()

    def _gauge(self) -> None:
        """``wsnmom_dead_letters_held`` of this destination (under the lock)."""
        held = sum(1 for v in self._held.values() if not v[1])
        metrics.DEAD_LETTERS_HELD.labels(destination=self.name).set(held)

    def _on_message(self, received: Received) -> None:
        key = received.headers.get(H_ID) or uuid.uuid4().hex
        since = self._clock().isoformat() if self._clock is not None else ""
        native = H_REASON not in received.headers
        with self._lock:
            self._held[key] = [received, False, since]
            self._gauge()
        if native and not received.redelivered and H_COUNTED not in received.headers:
            # an adapter's drop, counted when first read back (see the module docstring)
            reason = received.headers.get(HEADER_DROPPED_REASON) or "unknown"
            metrics.DEAD_LETTERS.labels(reason=reason, source="middleware").inc()

    def letters(self) -> list[DeadLetter]:
        """The dead letters held, oldest first."""
        with self._lock:
            items = [(k, v[0], v[2]) for k, v in self._held.items() if not v[1]]
        return [_letter(self.name, k, r, since) for k, r, since in items]

    def get(self, letter_id: str) -> DeadLetter | None:
        """The dead letter ``letter_id`` (None when not held)."""
        with self._lock:
            entry = self._held.get(letter_id)
            if entry is None or entry[1]:
                return None
            received, since = entry[0], entry[2]
        return _letter(self.name, letter_id, received, since)

    def received(self, letter_id: str) -> Received | None:
        """The middleware message of ``letter_id`` (None when not held)."""
        with self._lock:
            entry = self._held.get(letter_id)
            return None if entry is None or entry[1] else entry[0]

    def settle(self, letter_ids: Sequence[str]) -> int:
        """Remove these dead letters for good (acknowledged, in order where the adapter
        needs it); how many were held."""
        ack: list[Received] = []
        count = 0
        with self._lock:
            for key in letter_ids:
                entry = self._held.get(key)
                if entry is None or entry[1]:
                    continue
                count += 1
                entry[1] = True
                if not self._in_order:
                    del self._held[key]
                    ack.append(entry[0])
            if self._in_order:
                while self._held:
                    key, entry = next(iter(self._held.items()))
                    if not entry[1]:
                        break
                    del self._held[key]
                    ack.append(entry[0])
            self._gauge()
        for received in ack:
            try:
                received.ack()
            except AdapterError:
                log.warning("dead letters %s: acknowledging failed", self.name, exc_info=True)
        return count
