"""The memory push delivery may hold, in bytes: gateway-wide and per group (the identity
that owns the subscriptions).

Every message an adapter hands to a delivery channel (``core.channel``) is held in memory
until it is settled.  The adapter bounds that by messages (``prefetch`` unsettled per
subscription), which is no bound at all against many subscriptions and large payloads:
500 subscriptions x 64 held x 64 KB is 2 GB.  So a channel *charges* each message's bytes
here before it keeps it, and releases them when it settles or forgets the message.

A message that does not fit (the gateway's ``total`` or its group's ``per_group`` would
be passed) is not kept: the channel forgets it unsettled and *parks*.  Parking stops the
channel's adapter handle, which returns everything unsettled to the middleware (the
adapter contract, as for PauseSubscription), and frees what the channel held.  Messages
beyond the bound therefore stay in the middleware, never dropped and never acknowledged.
Parked channels are started again, oldest first and one group after another, once usage
is below three quarters of both bounds; a started channel gets its messages again from the
middleware, in order.  One at a time: the next is started once the last one has taken a
message (or after half a second, or at once when nothing is held), so that channels
started together do not take the room from each other and park again at once (each
restart costs the middleware a redelivery).  A message is always admitted while nothing
else is held (in the gateway, and in its group), so one larger than a bound still moves.

A channel whose delivery failed and waits for its retry holds its messages for nothing:
while other channels wait for room it parks too (``Channel`` asks), and is started again
in its turn; its retry count is kept.  So consumers that fail cannot keep the room from
the ones that answer.

Parking and unparking call the adapter (``stop``/``start``), which must not happen on the
adapter's own delivery thread: one thread here (``wsnmom-delivery-budget``) does both.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from typing import Protocol

__all__ = ["MemoryBudget", "Parkable"]

log = logging.getLogger(__name__)

#: fixed per-message cost added to the body's length (the Received object, headers)
MESSAGE_OVERHEAD = 512
#: usage (fraction of a bound) below which parked channels are started again
_LOW_WATER = 0.75
#: seconds an unparked channel may take to receive its first message before the next one
#: is unparked anyway
_UNPARK_WAIT = 0.5


class Parkable(Protocol):
    """What the budget needs of a channel (``core.channel.Channel``)."""

    def _park(self) -> bool:
        """Stop the handle and forget what is held; False when it was not active."""

    def _unpark(self) -> None:
        """Start the handle again (no-op unless parked)."""


class MemoryBudget:
    """Bytes held by delivery channels, gateway-wide and per group; thread-safe.

    ``total`` / ``per_group`` None: no bound."""

    def __init__(self, total: int | None = None, per_group: int | None = None) -> None:
        self.total = total
        self.per_group = per_group
        self.used = 0
        #: the most bytes held at once since start
        self.peak = 0
        self._groups: dict[str, int] = {}
        #: group -> parked channels, oldest first; groups in the order they are served
        self._parked: OrderedDict[str, deque[Parkable]] = OrderedDict()
        self._to_park: deque[tuple[str, Parkable]] = deque()
        #: the channel unparked last, until it takes a message, and until when it may
        self._awaiting: object | None = None
        self._awaiting_until = 0.0
        self._cond = threading.Condition()
        self._closed = False
        #: channels parked since start (``wsnmom_delivery_parked_total``)
        self.parks = 0
        self._thread: threading.Thread | None = None
        if total is not None or per_group is not None:
            self._thread = threading.Thread(
                target=self._loop, name="wsnmom-delivery-budget", daemon=True
            )
            self._thread.start()

    @property
    def bounded(self) -> bool:
        """Whether any bound is set (else nothing is ever refused)."""
        return self._thread is not None

    def take(self, group: str, size: int, channel: object = None, *, force: bool = False) -> bool:
        """Charge ``size`` bytes to ``group`` if they fit (see the module docstring), or
        with ``force`` in any case (counted, never refused); ``channel``: who takes them."""
        with self._cond:
            if channel is not None and channel is self._awaiting:
                self._awaiting = None
                self._cond.notify()
            g = self._groups.get(group, 0)
            if not force:
                if self.total is not None and self.used and self.used + size > self.total:
                    return False
                if self.per_group is not None and g and g + size > self.per_group:
                    return False
            self.used += size
            self.peak = max(self.peak, self.used)
            self._groups[group] = g + size
            return True

    def release(self, group: str, size: int) -> None:
        """Give back ``size`` bytes of ``group``."""
        if size <= 0:
            return
        with self._cond:
            self.used -= size
            left = self._groups.get(group, 0) - size
            if left > 0:
                self._groups[group] = left
            else:
                self._groups.pop(group, None)
            if self._parked:
                self._cond.notify()

    def park(self, group: str, channel: Parkable) -> None:
        """Have ``channel`` parked (by the budget's thread) until there is room."""
        with self._cond:
            self._to_park.append((group, channel))
            self._cond.notify()

    def has_parked(self) -> bool:
        """Whether some channel waits for room (read without the lock)."""
        return bool(self._parked)

    def parked(self) -> int:
        """Channels waiting for room now."""
        with self._cond:
            return sum(len(q) for q in self._parked.values())

    # -- the budget's thread ---------------------------------------------------------------
    def _room(self, group: str) -> bool:
        if self.total is not None and self.used > self.total * _LOW_WATER:
            return False
        return self.per_group is None or self._groups.get(group, 0) <= self.per_group * _LOW_WATER

    def _next_unpark(self) -> Parkable | None:
        """The oldest parked channel of the first group with room (that group then goes
        to the back of the line); None while the last one unparked has not taken a
        message yet."""
        if self._awaiting is not None and self.used and time.monotonic() < self._awaiting_until:
            return None
        for group, waiting in self._parked.items():
            if self._room(group):
                channel = waiting.popleft()
                if waiting:
                    self._parked.move_to_end(group)
                else:
                    del self._parked[group]
                return channel
        return None

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._to_park:
                    unpark = self._next_unpark() if self._parked else None
                    if unpark is not None:
                        break
                    self._cond.wait(0.1 if self._parked else None)
                else:
                    unpark = None
                if self._closed:
                    return
                to_park = list(self._to_park)
                self._to_park.clear()
            for group, channel in to_park:
                try:
                    parked = channel._park()
                except Exception:
                    log.exception("parking a delivery channel failed")
                    parked = False
                if parked:
                    with self._cond:
                        self.parks += 1
                        self._parked.setdefault(group, deque()).append(channel)
            if unpark is not None:
                with self._cond:
                    self._awaiting = unpark
                    self._awaiting_until = time.monotonic() + _UNPARK_WAIT
                try:
                    unpark._unpark()
                except Exception:
                    log.exception("starting a parked delivery channel failed")

    def close(self) -> None:
        """End the budget's thread (parked channels stay parked)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5)
