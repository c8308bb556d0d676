"""What one GetMessages answer took from a pull point, not yet settled (``Settlement``).

GetMessages is at-least-once for an answer lost on its way: the messages an answer carries
stay unsettled in the middleware (and, for a pull buffer, held by this instance) until the
HTTP server has accepted the whole answer; then ``settle`` acknowledges them, in the order
they were taken.  An answer that was not written (the client went away, the server failed,
building the answer failed) calls ``give_back`` instead, and the next GetMessages hands the
messages out again, first.  A process killed in between settles nothing: the middleware
hands the messages out again (to this pull point's next reader).  At most one answer's
messages come twice.

An answer may be *cut* (``Settlement.cut``): a message it took and every one taken after
it are not in the answer (a message past ``limits.max_age`` whose dead letter the
middleware did not confirm, ``core.pull_points``), and settling gives them back instead
of acknowledging them, so they are handed out again, first.

Messages an answer took and made dead letters (``Settlement.buried``: past
``limits.max_age``, their dead letters confirmed before the answer was made) are not the
answer's: they are acknowledged whether it is written or not, never given back (else the
next GetMessages made them dead letters again).

A ``Settlement`` is settled or given back once; later calls do nothing.  Whoever drops one
without either leaves its messages unsettled until the handle is stopped (the middleware
then redelivers them).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from wsnmom.core.adapter import Received

__all__ = ["Settlement", "nack_all"]

log = logging.getLogger(__name__)


class Settlement:
    """Settles or gives back, once, what an answer took."""

    __slots__ = ("_back", "_buried", "_cut", "_done", "_items", "_lock", "_open")

    def __init__(
        self,
        items: Sequence[Received],
        give_back: Callable[[Sequence[Received]], None],
        done: Callable[[], None] | None = None,
    ) -> None:
        #: every message taken, in order (a feed's filtered ones too: settled in their place)
        self._items = items
        self._back = give_back
        #: called once the messages were settled or given back (``core.pull_buffer``)
        self._done = done
        self._lock = threading.Lock()
        self._open = True
        #: where the answer was cut: the items from there on go back when settled
        self._cut = len(items)
        #: the ids of the items made dead letters (``buried``): acknowledged, never back
        self._buried: set[int] = set()

    def _close(self) -> bool:
        with self._lock:
            was_open, self._open = self._open, False
            return was_open

    @property
    def open(self) -> bool:
        """Neither settled nor given back yet."""
        return self._open

    def cut(self, first: Received) -> None:
        """``first`` (one of the items) and every item taken after it are not in the
        answer: settling gives them back (handed out again, first) instead."""
        with self._lock:
            for i, item in enumerate(self._items[: self._cut]):
                if item is first:
                    self._cut = i
                    return

    def buried(self, items: Sequence[Received]) -> None:
        """``items`` (some of the items) were made dead letters, confirmed: they are
        acknowledged however the answer ends, written or not, and never given back."""
        with self._lock:
            self._buried.update(id(item) for item in items)

    def settle(self) -> None:
        """The answer was written: acknowledge what it took, in the order taken (what
        follows a cut goes back)."""
        if not self._close():
            return
        try:
            _ack(self._items[: self._cut])
            rest = self._settle_buried(self._items[self._cut :])
            if rest:
                try:
                    self._back(rest)
                except Exception:  # the handle may be gone: then so are its messages
                    log.warning("giving back the messages after a cut failed", exc_info=True)
        finally:
            self._finish()

    def give_back(self) -> None:
        """The answer was not written: its messages are handed out again, first."""
        if not self._close():
            return
        try:
            rest = self._settle_buried(self._items)
            if rest:
                self._back(rest)
        except Exception:  # the handle may be gone: then so are its unsettled messages
            log.warning("giving back the messages of an unwritten answer failed", exc_info=True)
        finally:
            self._finish()

    def _settle_buried(self, items: Sequence[Received]) -> list[Received]:
        """Acknowledge those of ``items`` made dead letters; the others, to give back."""
        if not self._buried:
            return list(items)
        _ack([i for i in items if id(i) in self._buried])
        return [i for i in items if id(i) not in self._buried]

    def _finish(self) -> None:
        if self._done is not None:
            self._done()


def _ack(items: Sequence[Received]) -> None:
    """Acknowledge ``items``, in order."""
    for item in items:
        try:
            item.ack()
        except Exception:  # its connection went: the middleware gives it again
            log.warning("settling a message handed out failed", exc_info=True)


def nack_all(items: Sequence[Received]) -> None:
    """Give ``items`` back to the middleware, newest first (so the oldest is first again)."""
    for item in reversed(items):
        try:
            item.nack(True)
        except Exception:  # the handle may be gone: then so are its unsettled messages
            log.debug("giving a message back failed", exc_info=True)
