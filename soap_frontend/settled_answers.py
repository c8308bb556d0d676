"""Answers that settle what they carry once the server sent them (GetMessages, ONVIF
PullMessages).

The operation takes its messages unsettled (``core.pull_handout``) and hands its
settlement to :func:`defer`; :func:`collecting`, around the handling of one SOAP request
(``dispatch.soap_post``) or one retry of a long poll (``dispatch._long_poll``), gathers
it, and the answer's body becomes a :class:`SettlingBody`: a one-chunk WSGI iterable
(with an explicit ``Content-Length``) whose ``close`` learns whether the server's
``write`` of the whole body returned (the server asked for the chunk after it).  If it
did not (the server closed it before: the client went away and the write raised, or it
never iterated), the messages are given back.  If it did, a server that can tell when an
answer's bytes left the host puts a callable under :data:`ANSWER_SENT` in the environ
(``wsnmom.sent_answers`` for waitress and for the HTTPS server, cheroot): it settles them
once the bytes were sent and gives them back when the client went away first.  Without one
(in-process callers) they are settled when the write returned.  A fault answer, or a
failure while the answer is made, gives them back at once.

A process killed before the settlement settles nothing: the middleware hands the messages
out again.  What is settled and still lost for the client: bytes on the wire when it
goes, bytes its kernel accepted and it never read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from wsnmom.core.pull_handout import Settlement

__all__ = ["ANSWER_SENT", "Settlements", "SettlingBody", "collecting", "defer"]

#: environ key of a server's ``hook(settlements)``: called once the write of an answer's
#: body returned; the server settles them once the answer's bytes were sent, or gives
#: them back (``wsnmom.sent_answers``)
ANSWER_SENT = "wsnmom.answer_sent"

_PENDING: ContextVar[Settlements | None] = ContextVar("wsnmom_pending_settlements", default=None)


class Settlements:
    """The settlements one answer carries."""

    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items: list[Settlement] = []

    def __bool__(self) -> bool:
        return bool(self._items)

    def add(self, settlement: Settlement) -> None:
        """One more settlement the answer carries."""
        self._items.append(settlement)

    def settle(self) -> None:
        """The answer was written: settle each."""
        for item in self._items:
            item.settle()

    def give_back(self) -> None:
        """The answer was not written: give each back (the newest first)."""
        for item in reversed(self._items):
            item.give_back()


def defer(settlement: Settlement) -> None:
    """Settle ``settlement`` with the answer being made (at once when no answer collects
    settlements: an in-process caller)."""
    pending = _PENDING.get()
    if pending is None:
        settlement.settle()
    else:
        pending.add(settlement)


@contextmanager
def collecting() -> Iterator[Settlements]:
    """Gather the settlements the handling of one request defers."""
    pending = Settlements()
    token = _PENDING.set(pending)
    try:
        yield pending
    finally:
        _PENDING.reset(token)


class SettlingBody:
    """A WSGI response body of one chunk that settles once the server sent it (see the
    module docstring); ``environ`` is the request's (its :data:`ANSWER_SENT`)."""

    __slots__ = ("_body", "_sent", "_settlements", "_written")

    def __init__(
        self, body: bytes, settlements: Settlements, environ: Mapping[str, Any] | None = None
    ) -> None:
        self._body = body
        self._settlements = settlements
        self._written = False
        self._sent: Callable[[Settlements], None] | None = (
            environ.get(ANSWER_SENT) if environ is not None else None
        )

    def __iter__(self) -> Iterator[bytes]:
        yield self._body
        # asked for the next chunk: the server's write of the body returned
        self._written = True

    def close(self) -> None:
        """Called by the server when it is done with the answer (PEP 3333)."""
        if not self._written:
            self._settlements.give_back()
        elif self._sent is not None:
            self._sent(self._settlements)
        else:
            self._settlements.settle()
