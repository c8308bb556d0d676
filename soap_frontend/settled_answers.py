"""Answers that settle what they carry once the server accepted them (GetMessages).

GetMessages takes its messages unsettled (``core.pull_handout``).  The operation hands
its settlement to :func:`defer`; :func:`collecting`, around the handling of one SOAP
request (``dispatch.soap_post``), gathers it, and the answer's body becomes a
:class:`SettlingBody`: a one-chunk WSGI iterable (with an explicit ``Content-Length``)
that settles when the server asks it for the chunk after the body, i.e. once the server's
``write`` of the whole body returned, and gives the messages back when the server closes
it before that (the client went away: waitress raises ``ClientDisconnected`` from the
write, cheroot a socket error) or never iterates it.  A fault answer, or a failure while
the answer is made, gives them back at once.

What the server accepted may still sit in its output buffer or in the kernel when the
process dies or the client resets the connection: those messages are settled and lost for
the client (waitress sends what the socket takes at once from the writing thread, the
rest from its main loop).  A process killed before the write returned settles nothing:
the middleware hands the messages out again.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from wsnmom.core.pull_handout import Settlement

__all__ = ["Settlements", "SettlingBody", "collecting", "defer"]

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
    """A WSGI response body of one chunk that settles once the server wrote it (see the
    module docstring)."""

    __slots__ = ("_body", "_settlements", "_written")

    def __init__(self, body: bytes, settlements: Settlements) -> None:
        self._body = body
        self._settlements = settlements
        self._written = False

    def __iter__(self) -> Iterator[bytes]:
        yield self._body
        # asked for the next chunk: the server's write of the body returned
        self._written = True

    def close(self) -> None:
        """Called by the server when it is done with the answer (PEP 3333)."""
        if self._written:
            self._settlements.settle()
        else:
            self._settlements.give_back()
