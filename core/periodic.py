"""A daemon thread that runs one piece of work every ``interval`` seconds, or as soon as it is
woken; used by the lifetime sweep, the orphan sweep and the demand reconciler."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class PeriodicTask:
    """Calls ``work`` every ``interval`` seconds and whenever ``wake`` is called.

    An exception from ``work`` is logged and the next round runs as usual.

    ``min_spacing`` coalesces wake-ups: a round starts at least that many seconds after
    the previous one started, however often ``wake`` is called meanwhile (all wake-ups in
    between are served by that one round).  ``stop`` is not delayed by it.
    """

    def __init__(
        self,
        work: Callable[[], object],
        *,
        name: str,
        interval: float,
        join_timeout: float = 5.0,
        min_spacing: float = 0.0,
    ) -> None:
        self._work = work
        self.name = name
        self.interval = interval
        self.join_timeout = join_timeout
        self.min_spacing = min_spacing
        self._event = threading.Event()
        self._stop_event = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread (idempotent)."""
        if self._thread is not None:
            return
        self._stopping = False
        self._stop_event.clear()
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Run the work soon, without waiting for the interval."""
        self._event.set()

    def stop(self) -> None:
        """Stop the thread, waiting up to ``join_timeout`` for a round in progress."""
        self._stopping = True
        self._stop_event.set()
        self._event.set()
        if self._thread is not None:
            self._thread.join(timeout=self.join_timeout)
            self._thread = None

    def _loop(self) -> None:
        last = float("-inf")
        while not self._stopping:
            self._event.wait(self.interval)
            if self.min_spacing > 0:
                # let further wake-ups accumulate: they are all served by the next round
                remaining = last + self.min_spacing - time.monotonic()
                if remaining > 0:
                    self._stop_event.wait(remaining)
            self._event.clear()
            if self._stopping:
                return
            last = time.monotonic()
            try:
                self._work()
            except Exception:
                log.exception("%s: periodic work failed", self.name)
