"""Running one call on a thread of its own in a test, keeping what it returned or raised
(a request that blocks while the test arranges what happens meanwhile); serving a test's
own HTTP server on a thread that stops promptly; a load or a probe looping on a thread of
its own while a ``with`` block lasts (``Background``)."""

from __future__ import annotations

import abc
import socketserver
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, Self

__all__ = ["POLL", "Background", "in_thread", "serve"]

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


@dataclass
class Background(abc.ABC):
    """A load or a probe of a test (a dataclass subclass) whose ``_run`` loops on a
    daemon thread of its own until ``_stop`` is set: from ``start`` (entering a ``with``
    block) to ``stop`` (leaving it), which waits up to ``JOIN`` seconds for the thread
    (``_join_within``)."""

    JOIN: ClassVar[float] = 10.0
    _stop: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)

    @abc.abstractmethod
    def _run(self) -> None:
        """The loop: until ``_stop`` is set."""

    def start(self) -> Self:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self._join_within())

    def _join_within(self) -> float:
        """Seconds ``stop`` waits for the thread."""
        return self.JOIN

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
