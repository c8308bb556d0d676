"""A daemon thread that runs one piece of work every ``interval`` seconds, or as soon as it is
woken; used by the lifetime sweep and the demand reconciler."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class PeriodicTask:
    """Calls ``work`` every ``interval`` seconds and whenever ``wake`` is called.

    An exception from ``work`` is logged and the next round runs as usual.
    """

    def __init__(
        self,
        work: Callable[[], None],
        *,
        name: str,
        interval: float,
        join_timeout: float = 5.0,
    ) -> None:
        self._work = work
        self.name = name
        self.interval = interval
        self.join_timeout = join_timeout
        self._event = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread (idempotent)."""
        if self._thread is not None:
            return
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Run the work soon, without waiting for the interval."""
        self._event.set()

    def stop(self) -> None:
        """Stop the thread, waiting up to ``join_timeout`` for a round in progress."""
        self._stopping = True
        self._event.set()
        if self._thread is not None:
            self._thread.join(timeout=self.join_timeout)
            self._thread = None

    def _loop(self) -> None:
        while not self._stopping:
            self._event.wait(self.interval)
            self._event.clear()
            if self._stopping:
                return
            try:
                self._work()
            except Exception:
                log.exception("%s: periodic work failed", self.name)
