"""Parked requests on waitress: a long poll that waits without a worker thread.

waitress reads requests in its event loop and runs each on one of its ``threads`` worker
threads until the response is written.  A long poll (ONVIF's PullMessages with a Timeout,
:mod:`wsnmom.soap_frontend.long_poll`) would hold its worker for the whole wait, so a few
dozen waiting clients would take every thread.  :func:`install` gives the server's
connections a channel class that can *park* a request instead:

1. The worker runs the application with ``environ[PARK]`` set.  A view that must wait calls
   it with its poll; it raises ``Parked``, which unwinds the application before anything is
   written.  :meth:`ParkingChannel.service` catches it and returns: the worker is free, and
   the request stays first in the connection's queue, unanswered (waitress reads nothing
   more from that connection while a request is queued, and its idle timeout does not
   apply to a connection with a request; neither do the ``[connections]`` read deadlines,
   which pause while the application works).  The poll is handed to the poller
   (``Poll.begin``) only now, so that it cannot resume a request whose worker has not let
   go of it yet.
2. When the poll answers, ``Poll.resume`` queues the connection for a worker again
   (``server.add_task``), which runs the request once more with ``environ[RESUMED]`` set
   to the answered poll (and the original ``X-Request-Id``): the view answers its reply
   at once, and waitress writes it and goes on with the connection as usual.  A
   connection closed meanwhile is not run again: what the answer took is given back
   (``Poll.abandon``).

This relies on waitress's channel and task classes (``waitress.channel.HTTPChannel``,
``waitress.task.WSGITask``), which the pinned major version (3.x) keeps stable; the
tests in tests/soap_frontend/test_long_poll.py and tests/e2e/test_onvif_events.py fail if it
stops working.
"""

from __future__ import annotations

from typing import Any

from waitress.server import BaseWSGIServer
from waitress.task import WSGITask

from wsnmom.sent_answers import SentAnswersChannel
from wsnmom.soap_frontend.long_poll import PARK, RESUMED, Parked, Poll
from wsnmom.soap_frontend.settled_answers import ANSWER_SENT

__all__ = ["ParkingChannel", "ParkingTask", "install"]

_REQUEST_ID = "HTTP_X_REQUEST_ID"


class ParkingTask(WSGITask):  # type: ignore[misc]
    """waitress's WSGI task with the park function, or the answered poll, in the environ,
    and the channel's settlement of answers once sent (``wsnmom.sent_answers``)."""

    def get_environment(self) -> dict[str, Any]:
        if self.environ is not None:
            return self.environ  # type: ignore[no-any-return]
        environ: dict[str, Any] = super().get_environment()
        channel: ParkingChannel = self.channel
        environ[ANSWER_SENT] = channel.answer_sent
        resumed = channel.resumed
        if resumed is not None:
            channel.resumed = None
            environ[RESUMED] = resumed
            if resumed.request_id:
                environ[_REQUEST_ID] = resumed.request_id
        else:
            environ[PARK] = channel.park
        return environ


class ParkingChannel(SentAnswersChannel):
    """waitress's HTTP channel whose requests can wait without their worker thread (and
    whose answers settle once sent, :class:`~wsnmom.sent_answers.SentAnswersChannel`)."""

    task_class = ParkingTask
    #: the answered poll whose request runs next
    resumed: Poll[Any] | None = None

    def park(self, poll: Poll[Any]) -> None:
        """Park the current request until ``poll`` answers (raises ``Parked``)."""
        poll.resume = lambda: self._resume(poll)
        raise Parked(poll)

    def _resume(self, poll: Poll[Any]) -> None:
        self.resumed = poll
        self.server.add_task(self)

    def service(self) -> None:
        resumed = self.resumed
        try:
            super().service()
        except Parked as parked:
            begin = parked.poll.begin
            if begin is not None:
                begin()
        if resumed is not None and self.resumed is resumed:
            # not run again: the client went away while its poll waited
            self.resumed = None
            resumed.abandon()


def install(server: Any) -> int:
    """Make the HTTP servers of what ``waitress.create_server`` returned (one server, or a
    ``MultiSocketServer`` over several) accept connections as :class:`ParkingChannel`;
    returns how many servers it changed."""
    servers = [server] if isinstance(server, BaseWSGIServer) else list(server.map.values())
    changed = 0
    for candidate in servers:
        if isinstance(candidate, BaseWSGIServer):
            candidate.channel_class = ParkingChannel
            changed += 1
    return changed
