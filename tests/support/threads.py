"""Running one call on a thread of its own in a test, keeping what it returned or raised
(a request that blocks while the test arranges what happens meanwhile)."""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["in_thread"]


def in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """Run ``fn`` in a daemon thread; the list gets its result or exception."""
    out: list[object] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out
