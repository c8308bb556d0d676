"""Running one call on a thread of its own in a test, keeping what it returned or raised
(a request that blocks while the test arranges what happens meanwhile); serving a test's
own HTTP server on a thread that stops promptly."""

from __future__ import annotations

import socketserver
import threading
from collections.abc import Callable

__all__ = ["POLL", "in_thread", "serve"]

#: seconds between two polls of a served loop for its ``shutdown()``: the default 0.5 s
#: was waited out at nearly every close (the poll starts again after each request), half
#: a second per server a test stops
POLL = 0.02


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


def serve(server: socketserver.BaseServer) -> threading.Thread:
    """``server.serve_forever`` on a daemon thread, polling every :data:`POLL` seconds so
    that ``server.shutdown()`` returns within that."""
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": POLL}, daemon=True
    )
    thread.start()
    return thread
