"""One deadline for everything the Kafka adapter's close waits for.

Closing saves every cursor's position (one consumer-group request each), commits the head
reader's position and closes the clients.  Each request has a timeout of its own (30 s for
the position store), so a broker that stopped answering -- paused, overloaded, or tansu
after it dropped a connection, which left later requests unanswered -- held a gateway's
shutdown for 30 s and more; an orchestrator kills it first, and the hand-over to another
instance waits for that.  Once ``begin`` is called, every wait of the close ends by one
deadline (``close_timeout`` after the start of the close).  A wait that was already under
way on another thread when the close began (the engine's commit thread saving positions)
ends at once: the close saves those positions again itself, and a periodic save stuck on a
connection the broker no longer answers took the whole deadline, so that the close's own
save of 131 subscriptions found no time left and gave up at once.  What was not saved is
delivered again after the next start (at least once), as after a crash.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Iterable

__all__ = ["Closing"]

log = logging.getLogger("wsnmom.adapters.kafka")


class Closing:
    """The adapter's close, once begun: its deadline, and waits that end by it."""

    def __init__(self) -> None:
        self._deadline: float | None = None
        #: completed by ``begin``: wakes the waits under way
        self._begun: concurrent.futures.Future[object] = concurrent.futures.Future()

    @property
    def begun(self) -> bool:
        """Whether the close has begun."""
        return self._deadline is not None

    def begin(self, budget: float) -> None:
        """The close begins: every wait ends within ``budget`` seconds from now."""
        self._deadline = time.monotonic() + budget
        if not self._begun.done():
            self._begun.set_result(None)

    def remaining(self, timeout: float) -> float:
        """``timeout``, or less once the close has begun (never below 0)."""
        deadline = self._deadline
        if deadline is None:
            return timeout
        return max(0.0, min(timeout, deadline - time.monotonic()))

    def wait(
        self, futures: Iterable[concurrent.futures.Future[object]], timeout: float
    ) -> set[concurrent.futures.Future[object]]:
        """Wait until every future is done, ``timeout`` seconds have passed, or the
        close's deadline has (a wait begun before the close: the close has begun); the
        futures done by then."""
        futures = list(futures)
        end = time.monotonic() + timeout
        before_close = not self.begun
        pending = {f for f in futures if not f.done()}
        while pending:
            left = end - time.monotonic()
            if self._deadline is not None:
                left = min(left, self._deadline - time.monotonic())
            if left <= 0:
                break
            waiting: set[concurrent.futures.Future[object]] = set(pending)
            if not self._begun.done():
                waiting.add(self._begun)
            _, pending = concurrent.futures.wait(
                waiting, timeout=left, return_when=concurrent.futures.FIRST_COMPLETED
            )
            pending.discard(self._begun)
            if before_close and self.begun:
                break
        return {f for f in futures if f.done()}

    def run(self, work: Callable[[], None], what: str, timeout: float) -> None:
        """Run ``work`` (a client's close, which may wait for the broker) on a thread of
        its own and wait for it up to ``timeout``, or less once the close has begun; a
        ``work`` still running then finishes in the background."""
        done = threading.Event()

        def run() -> None:
            try:
                work()
            except Exception:
                log.debug("%s failed", what, exc_info=True)
            finally:
                done.set()

        threading.Thread(target=run, name=f"wsnmom-kafka-{what}", daemon=True).start()
        if not done.wait(self.remaining(timeout)):
            log.warning("%s did not end within the close's time; left to finish", what)
