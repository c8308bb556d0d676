"""Parked requests on the HTTPS server (cheroot): a long poll that waits without a worker.

cheroot runs each connection's request on one of its ``threads`` worker threads
(``HTTPConnection.communicate``) until the answer is written.  A long poll (ONVIF's
PullMessages with a Timeout, :mod:`wsnmom.soap_frontend.long_poll`) would hold its worker
for the whole wait.  As :mod:`wsnmom.parking` does for waitress, the connection class here
can *park* a request instead:

1. The worker runs the application with ``environ[PARK]`` set (:class:`ParkingGateway`).
   A view that must wait calls it with its poll; it raises ``Parked``, which unwinds the
   application before anything is written.  :meth:`ParkingConnection.communicate` catches
   it and returns "keep the connection" with the poll noted on the connection; the
   server's ``put_conn`` (``wsnmom.https``) then calls :func:`let_go`, which hands the poll
   to the poller (``Poll.begin``) instead of giving the connection back to the ingress: the
   worker is free, and nothing reads from the connection while its request waits.
2. When the poll answers, ``Poll.resume`` queues the connection for a worker again
   (``server.requests.put``).  The worker runs the same parsed request through the
   application once more, with ``environ[RESUMED]`` set to the answered poll (and the
   original ``X-Request-Id``): the view answers its reply at once, and the connection
   goes back to the ingress for its next request as usual.

This relies on cheroot's ``HTTPConnection.communicate``, ``wsgi.Gateway_10`` and the
worker loop's ``put_conn`` after ``communicate``, which the pinned versions (10.x,
11.x) keep; tests/e2e/test_onvif_events.py (over HTTPS) fails if it stops working.
"""

from __future__ import annotations

import logging
from typing import Any

from cheroot.errors import MaxSizeExceeded
from cheroot.server import HTTPConnection
from cheroot.wsgi import Gateway_10

from wsnmom.sent_answers import settle_once_sent
from wsnmom.soap_frontend.long_poll import PARK, RESUMED, Parked, Poll
from wsnmom.soap_frontend.settled_answers import ANSWER_SENT, Settlements

__all__ = ["ParkingConnection", "ParkingGateway", "let_go", "read_rest"]

log = logging.getLogger("wsnmom.server")

_REQUEST_ID = "HTTP_X_REQUEST_ID"
_READ = 64 * 1024


def read_rest(req: Any) -> None:
    """Read what the application left of ``req``'s chunked body (cheroot's
    ``HTTPRequest``).  cheroot reads the rest of a body by Content-Length before the next
    request, not of a chunked one: it would read the chunk size line as the next request
    line, where the connection guard (``wsnmom.http_framing``), which read the chunks,
    expects the next request.  A body it cannot read to its end closes the connection."""
    if not req.chunked_read or req.close_connection:
        return
    try:
        while req.rfile.read(_READ):
            pass
    except (OSError, ValueError, MaxSizeExceeded):
        req.close_connection = True


class ParkingGateway(Gateway_10):
    """cheroot's WSGI 1.0 gateway with the park function, or the answered poll, in the
    environ of a :class:`ParkingConnection`'s request; it reads the rest of a chunked
    body the application left (:func:`read_rest`)."""

    def respond(self) -> None:
        super().respond()
        read_rest(self.req)

    def _answer_sent(self, settlements: Settlements) -> None:
        """``environ[ANSWER_SENT]``: the answer's write returned; flush cheroot's buffer
        (the body's last bytes may still be in it) and settle once the kernel sent them
        (``wsnmom.sent_answers``)."""
        conn = self.req.conn
        try:
            conn.wfile.flush()
        except (OSError, ValueError):  # the client went away: nothing more was sent
            settlements.give_back()
            return
        settle_once_sent(conn.socket, settlements)

    def get_environ(self) -> dict[str, Any]:  # type: ignore[override]
        environ: dict[str, Any] = super().get_environ()  # type: ignore[no-untyped-call]
        environ[ANSWER_SENT] = self._answer_sent
        conn = self.req.conn
        if not isinstance(conn, ParkingConnection):
            return environ
        resumed = conn.resumed
        if resumed is not None:
            environ[RESUMED] = resumed
            if resumed.request_id:
                environ[_REQUEST_ID] = resumed.request_id
        else:
            conn.request = self.req  # run again if the application parks it
            environ[PARK] = conn.park
        return environ


class ParkingConnection(HTTPConnection):
    """cheroot's HTTP connection whose request can wait without its worker thread."""

    #: the request being answered (cheroot's ``HTTPRequest``), kept while it is parked
    request: Any = None
    #: parked by the application; its worker has not let go of the connection yet
    parked: Poll[Any] | None = None
    #: the answered poll whose request runs next
    resumed: Poll[Any] | None = None

    def park(self, poll: Poll[Any]) -> None:
        """Park the current request until ``poll`` answers (raises ``Parked``)."""
        poll.resume = lambda: self._resume(poll)
        raise Parked(poll)

    def _resume(self, poll: Poll[Any]) -> None:
        self.resumed = poll
        if not self.server.ready:  # stopping: no worker will take it
            self.resumed = None
            self.close()
            poll.abandon()
            return
        self.server.requests.put(self)

    def communicate(self) -> bool:
        """Answer the next request (or the resumed one); True: keep the connection."""
        if self.resumed is not None:
            return self._answer_resumed()
        self.request = None
        try:
            return bool(super().communicate())  # type: ignore[no-untyped-call]
        except Parked as parked:
            self.parked = parked.poll
            return True  # the worker calls put_conn, which lets go (see let_go)

    def _answer_resumed(self) -> bool:
        req, self.request = self.request, None
        poll = self.resumed
        try:
            gateway = self.server.gateway(req)  # its environ holds the answered poll
            self.resumed = None
            gateway.respond()
            if req.ready:
                req.ensure_headers_sent()
            if req.chunked_write:
                self.wfile.write(b"0\r\n\r\n")
            return not req.close_connection
        except OSError as exc:  # the client went away (timeouts included)
            log.debug("https: answering a parked request failed: %s", exc)
        except Exception:
            log.exception("https: answering a parked request failed")
        finally:
            self.resumed = None
        if poll is not None:  # what an answer not written took comes again (settled: no-op)
            poll.abandon()
        return False


def let_go(conn: Any) -> bool:
    """For the server's ``put_conn``: if ``conn``'s request is parked, hand its poll to
    the poller now that the worker let go of it, and return True (the connection stays
    out of the ingress until the poll answers)."""
    poll = getattr(conn, "parked", None)
    if poll is None:
        return False
    conn.parked = None
    if poll.begin is not None:
        poll.begin()
    return True
