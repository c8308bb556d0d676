"""A thread dump in the log when stopping takes long.

A SIGTERM hands an instance's work over within 2 s (docs/scale-out.md).  When a stop
takes longer, the log says why by itself: :class:`SlowStopWatch`, started as the
shutdown begins, logs the stack of every thread (WARNING, logger ``wsnmom.server``) once
the stop has taken ``after`` seconds, and again every ``after`` seconds up to ``dumps``
times, unless it is cancelled first (the stop ended).  Its timer is a daemon thread: it
never keeps the process alive.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback

__all__ = ["SLOW_STOP", "SlowStopWatch", "thread_dump"]

log = logging.getLogger("wsnmom.server")

#: seconds of stopping after which the threads are dumped (before the 2 s hand-over)
SLOW_STOP = 1.5


def thread_dump() -> str:
    """Every thread's name and stack, innermost call last, as text."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        stack = "".join(traceback.format_stack(frame))
        parts.append(f'Thread "{names.get(ident, "?")}" ({ident}):\n{stack}')
    return "\n".join(parts)


class SlowStopWatch:
    """Dumps the threads to the log while a stop takes long (see the module docstring)."""

    def __init__(self, what: str, after: float = SLOW_STOP, dumps: int = 3) -> None:
        self.what = what
        self.after = after
        self.dumps = dumps
        #: how many dumps were logged
        self.dumped = 0
        self._done = threading.Event()
        self._started = 0.0
        self._thread = threading.Thread(target=self._watch, name="wsnmom-slow-stop", daemon=True)

    def start(self) -> SlowStopWatch:
        self._started = time.monotonic()
        self._thread.start()
        return self

    def cancel(self) -> None:
        """The stop ended: no more dumps."""
        self._done.set()

    def __enter__(self) -> SlowStopWatch:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.cancel()

    def _watch(self) -> None:
        while self.dumped < self.dumps and not self._done.wait(self.after):
            log.warning(
                "%s still under way after %.1f s; the threads:\n%s",
                self.what,
                time.monotonic() - self._started,
                thread_dump(),
            )
            self.dumped += 1  # after the line is logged: what a reader of the count may see
