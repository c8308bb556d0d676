"""Long polls that hold no request thread while they wait (ONVIF's PullMessages).

A request that must wait for messages is a :class:`Poll`: a function that tries once
(``attempt(final)``: a reply, or None for "nothing yet"; with ``final`` it must answer) and a
deadline.  One :class:`Poller` thread per application tries every waiting poll again every
``interval`` seconds until it answers or its deadline passes.

How the request's thread is let go depends on the HTTP server:

* A server that can park a request (``wsnmom.parking`` for waitress, ``wsnmom.tls_parking``
  for cheroot, the HTTPS server) puts a callable in the
  WSGI environ under :data:`PARK`.  The view calls it with the poll; it raises
  :class:`Parked`, which unwinds the application and leaves the request unanswered on its
  connection, and the server then hands the poll to the poller (``Poll.begin``).  When the
  poll answers, ``Poll.resume`` asks the server to run the request again: the environ then
  holds the finished poll under :data:`RESUMED`, and the view answers its reply at once.
* Any other server (test clients): the view waits on its own thread for the poller's
  answer (:meth:`Poller.wait`).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

__all__ = ["PARK", "RESUMED", "Parked", "Poll", "Poller", "WaitFor"]

log = logging.getLogger("wsnmom.soap.long_poll")

#: environ key of a server's park function: ``park(poll) -> NoReturn`` (raises Parked)
PARK = "wsnmom.park"
#: environ key of a poll that answered, when the server runs its request again
RESUMED = "wsnmom.resumed"

R = TypeVar("R")


class Parked(BaseException):
    """Raised by a server's park function: the request waits without its thread.  A
    BaseException, so that no ``except Exception`` on the way turns it into a 500."""

    def __init__(self, poll: Poll[object]) -> None:
        super().__init__("request parked")
        self.poll = poll


class WaitFor(Exception):
    """Raised by a request handler that has nothing to answer yet: ``attempt(final)``
    tries again (None: still nothing; with ``final`` it answers what it has) until
    ``deadline`` (``time.monotonic()``)."""

    def __init__(self, attempt: Callable[[bool], Any], deadline: float) -> None:
        super().__init__("waiting")
        self.attempt = attempt
        self.deadline = deadline


@dataclass(eq=False)
class Poll(Generic[R]):
    """One waiting request."""

    #: tries once; None: nothing yet (with ``final`` True it must return a reply)
    attempt: Callable[[bool], R | None]
    #: ``time.monotonic()`` at which it answers whatever it has
    deadline: float
    #: the reply, once answered
    reply: R | None = None
    #: the request id the reply is logged and answered with
    request_id: str | None = None
    #: set by a parking server: runs the request again (the poll has answered)
    resume: Callable[[], None] | None = None
    #: set by the view for a parking server: hands the poll to the poller (called by the
    #: server once the request's thread has let go of it)
    begin: Callable[[], None] | None = None
    #: set by the view: gives back what the reply took unsettled, for a server that will
    #: not write it (its client went away while it waited, the server stops)
    unanswered: Callable[[], None] | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def abandon(self) -> None:
        """The server will not write the reply: give back what it took."""
        unanswered, self.unanswered = self.unanswered, None
        if unanswered is not None:
            unanswered()

    def finish(self, reply: R) -> None:
        """Record the answer and wake whoever waits for it."""
        self.reply = reply
        self.done.set()
        resume = self.resume
        if resume is not None:
            try:
                resume()
            except Exception:
                log.exception("resuming a parked request failed")


class Poller:
    """The one thread that retries the waiting polls of an application."""

    def __init__(self, interval: float = 0.1) -> None:
        self.interval = interval
        self._heap: list[tuple[float, int, Poll[Any]]] = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None

    def waiting(self) -> int:
        """Polls waiting now."""
        with self._cv:
            return len(self._heap)

    def add(self, poll: Poll[R]) -> None:
        """Retry ``poll`` until it answers (first retry after ``interval``)."""
        with self._cv:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="wsnmom-long-poll", daemon=True
                )
                self._thread.start()
            due = min(time.monotonic() + self.interval, poll.deadline)
            entry: tuple[float, int, Poll[Any]] = (due, next(self._seq), poll)
            heapq.heappush(self._heap, entry)
            self._cv.notify()

    def wait(self, poll: Poll[R]) -> R:
        """Retry ``poll`` and wait on this thread for its answer (servers that cannot park)."""
        self.add(poll)
        poll.done.wait()
        assert poll.reply is not None
        return poll.reply

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    timeout = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._cv.wait(timeout)
                _, _, poll = heapq.heappop(self._heap)
            self._try(poll)

    def _try(self, poll: Poll[object]) -> None:
        now = time.monotonic()
        final = now >= poll.deadline
        try:
            reply = poll.attempt(final)
        except BaseException:  # an attempt answers its own errors; this is a bug
            log.exception("a long poll failed")
            reply = None
            final = True
        if reply is None and not final:
            with self._cv:
                due = min(now + self.interval, poll.deadline)
                heapq.heappush(self._heap, (due, next(self._seq), poll))
            return
        if reply is None:
            return  # pragma: no cover - attempt(final=True) answers (see above)
        poll.finish(reply)
