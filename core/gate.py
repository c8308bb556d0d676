"""``PublishGate``: lets many publishes run at once, or one change of routing, never both.

Core routes a notification to the subscriptions feeding its own pull points while it
publishes (``Capabilities.sole_publisher``).  When such a subscription changes how it is
routed (PauseSubscription gives it a durable subscription of its own), no publish may be
between "computed its routes" and "the middleware stored it", or the message would reach
the subscription twice (once routed, once through the new durable subscription) or not at
all.  Publishes hold the gate shared; a routing change holds it exclusively and waits for
the publishes in flight to finish.  Writers are preferred, so a stream of publishes cannot
starve a routing change.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["PublishGate"]


class PublishGate:
    """A shared/exclusive lock (not reentrant)."""

    __slots__ = ("_cond", "_exclusive", "_shared", "_waiting")

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._shared = 0
        self._exclusive = False
        self._waiting = 0

    @contextmanager
    def shared(self) -> Iterator[None]:
        """Held by a publish, together with other publishes."""
        with self._cond:
            while self._exclusive or self._waiting:
                self._cond.wait()
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                if not self._shared:
                    self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Held by a routing change, alone."""
        with self._cond:
            self._waiting += 1
            try:
                while self._exclusive or self._shared:
                    self._cond.wait()
            finally:
                self._waiting -= 1
            self._exclusive = True
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()
