"""A report of what a slow shutdown waits for.

``wsnmom serve`` stops within a second or two of SIGTERM; one that does not (an orchestrator
then kills it, and the hand-over to another instance waits for that) logs, once, the stack
of every thread after :data:`AFTER` seconds: the call a stop hangs in, without a debugger.
The report is one WARNING record, so it goes wherever the gateway's logs go.
"""

from __future__ import annotations

import logging
import sys
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["AFTER", "reporting_a_slow_stop", "thread_stacks"]

log = logging.getLogger("wsnmom.server")

#: seconds a shutdown may take before the thread stacks are logged
AFTER = 5.0


def thread_stacks() -> str:
    """The current stack of every thread of the process, by thread name."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        stack = "".join(traceback.format_stack(frame))
        parts.append(f"thread {names.get(ident, '?')} ({ident}):\n{stack}")
    return "\n".join(parts)


@contextmanager
def reporting_a_slow_stop(after: float = AFTER) -> Iterator[None]:
    """Log every thread's stack if the block (a shutdown) is still running after ``after``
    seconds."""

    def report() -> None:
        log.warning(
            "shutdown still under way after %.0f s; the threads are at:\n%s",
            after,
            thread_stacks(),
        )

    timer = threading.Timer(after, report)
    timer.name = "wsnmom-slow-stop"
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()  # at once, unless a report is being written
