"""Pull semantics over a push-only subscription handle (``Capabilities.native_pull`` False).

A log- or session-based middleware may offer no "give me the next N messages" call.  Core
then starts the pull point's handle in push mode and keeps what arrives in a buffer, still
unsettled: the middleware keeps every buffered message until GetMessages hands it out, so
nothing is lost if the gateway dies with a full buffer (the messages come again).  ``take``
settles what it hands out, in arrival order (offset and in-order-ack middleware need
that).  The buffer holds at most ``prefetch`` messages: the adapter's own flow control
stops delivering beyond that.

The conformance kit uses the same class to run its pull-based checks on push-only
adapters.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from wsnmom.core.adapter import Received, SubscriptionHandle

__all__ = ["PullBuffer"]


class PullBuffer:
    """A push-mode handle whose messages wait here for ``pull`` / ``take``.  Thread-safe."""

    __slots__ = ("_cv", "_queue", "_started", "handle", "prefetch")

    def __init__(self, handle: SubscriptionHandle, prefetch: int) -> None:
        self.handle = handle
        self.prefetch = prefetch
        self._cv = threading.Condition()
        self._queue: deque[Received] = deque()
        self._started = False

    @property
    def name(self) -> str:
        """The subscription's name."""
        return self.handle.name

    def start(self) -> None:
        """Begin buffering (idempotent)."""
        with self._cv:
            if self._started:
                return
            self._started = True
        self.handle.start(self._arrived, prefetch=self.prefetch)

    def stop(self) -> None:
        """Stop buffering; buffered messages go back to the middleware (redelivered)."""
        with self._cv:
            if not self._started:
                return
            self._started = False
            self._queue.clear()
        self.handle.stop()

    def _arrived(self, received: Received) -> None:
        with self._cv:
            if not self._started:
                stale = True
            else:
                stale = False
                self._queue.append(received)
                self._cv.notify_all()
        if stale:
            received.nack(requeue=True)

    def pull(self, max_messages: int, timeout: float = 0.0) -> list[Received]:
        """Up to ``max_messages`` buffered messages, oldest first, waiting up to ``timeout``
        for the first; the caller settles them."""
        self.start()
        deadline = time.monotonic() + timeout
        with self._cv:
            while not self._queue:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                self._cv.wait(remaining)
            out: list[Received] = []
            while self._queue and len(out) < max_messages:
                out.append(self._queue.popleft())
            return out

    def take(self, max_messages: int) -> list[Received]:
        """Up to ``max_messages`` buffered messages, settled (acked) in order as handed out."""
        out = self.pull(max_messages, timeout=0.0)
        for received in out:
            received.ack()
        return out

    def buffered(self) -> int:
        """Messages waiting in the buffer."""
        with self._cv:
            return len(self._queue)

    def depth(self) -> int | None:
        """Buffered messages plus those the middleware still holds back."""
        held = self.handle.depth()
        return None if held is None else held + self.buffered()
