"""A pull point's feeds and their messages, shared by the two readers of a pull point
(``core.pull_buffer.PullBuffer`` for push-only middleware, ``core.pull_reader.PullReader``
for native pull): a ``Feed`` is one subscription feeding the pull point, a ``Fed`` one of
its messages with what the feed made of it, and ``give_back_fed`` returns an unsent
answer's messages to their sources."""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from wsnmom.core.adapter import Received, SubscriptionHandle
from wsnmom.core.pull_handout import nack_all

__all__ = ["SETTLE_WAIT", "AnswersOnTheirWay", "Fed", "Feed", "Unsettled", "give_back_fed"]

log = logging.getLogger(__name__)

M = TypeVar("M")

#: seconds a reader's ``wait_settled`` waits at most for a feed's answers on their way
SETTLE_WAIT = 10.0


class Fed(Received, Generic[M]):
    """A feed's message in the buffer: the middleware's message and what the feed made
    of it (``message``; None: dropped by the feed's filters, only waiting to be settled in
    order).  Settling settles the middleware's message."""

    __slots__ = ("feed", "message", "received")

    def __init__(self, feed: Feed[M], received: Received, message: M | None) -> None:
        self.feed = feed
        self.received = received
        self.message = message
        self.topic = received.topic
        self.body = received.body
        self.headers = received.headers
        self.content_type = received.content_type
        self.redelivered = received.redelivered
        self.timestamp = received.timestamp

    def ack(self) -> None:
        """Settle the middleware's message."""
        self.received.ack()

    def nack(self, requeue: bool = True) -> None:
        """Give the middleware's message back (or drop it)."""
        self.received.nack(requeue)

    @property
    def settleable(self) -> bool:
        """Whether settling still reaches the middleware's message."""
        return self.received.settleable


class Unsettled:
    """A feed's messages a ``PullBuffer`` handed out in answers not settled (nor given
    back) yet, filtered ones included; ``wait`` waits until there are none."""

    __slots__ = ("_count", "_cv", "waiting")

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._count = 0
        #: a ``wait`` is under way
        self.waiting = False

    def add(self) -> None:
        with self._cv:
            self._count += 1

    def done(self) -> None:
        with self._cv:
            self._count -= 1
            if not self._count:
                self._cv.notify_all()

    @property
    def pending(self) -> bool:
        """Whether some are not settled yet."""
        with self._cv:
            return self._count > 0

    def wait(self, timeout: float) -> bool:
        """Whether none is left, within ``timeout`` seconds."""
        with self._cv:
            self.waiting = True
            try:
                return self._cv.wait_for(lambda: self._count <= 0, timeout)
            finally:
                self.waiting = False


class Feed(Generic[M]):
    """One feeding subscription of a pull point (of this buffer, or of a
    ``core.pull_reader.PullReader``)."""

    __slots__ = (
        "active",
        "epoch",
        "handle",
        "keeper",
        "kept",
        "late",
        "prepare",
        "unsettled",
        "waiting",
    )

    def __init__(self, handle: SubscriptionHandle, prepare: Callable[[Received], M | None]):
        self.handle = handle
        self.prepare = prepare
        #: accepting messages (started, not suspended)
        self.active = False
        #: counts the suspensions and the buffer's stops, which give back what its handle
        #: delivered: a message prepared across one is not taken (it comes again)
        self.epoch = 0
        #: its messages in the buffer, filtered ones included
        self.waiting = 0
        #: its messages handed out by answers on their way (``PullBuffer.hand_out``)
        self.unsettled = Unsettled()
        #: its kept copies still on their way through the inbox (``PullBuffer.expect``)
        self.kept = 0
        #: a suspended feed: keeps in the pull point what an answer handed out before
        #: the suspension gives back (None: back to the feed).  Set when the feed is
        #: removed, whichever instance ended its subscription, and by a ``PullReader``
        #: also at a pause that drains here (``core.pull_feeds``)
        self.late: Callable[[list[Fed[M]]], None] | None = None
        #: keeps in the pull point what an answer gives back whatever the feed's state
        #: (None: back to the feed unless ``late`` keeps it): a ``PullReader``'s feeds in
        #: a cluster, whose durable subscription another instance may delete before this
        #: one followed the end (``core.pull_feeds``)
        self.keeper: Callable[[list[Fed[M]]], None] | None = None


class AnswersOnTheirWay(ABC):
    """What a pull point's reader (``PullBuffer``, ``PullReader``) tells of the answers on
    their way that took a feed's messages (``Feed.unsettled``); ``_feed`` finds a feed."""

    __slots__ = ()

    @abstractmethod
    def _feed(self, name: str) -> Feed[object] | None:
        """The reader's feed called ``name``, or None."""

    def wait_settled(self, name: str, timeout: float = SETTLE_WAIT) -> bool:
        """Whether the feed's messages handed out in answers on their way were settled
        or given back within ``timeout`` seconds (waited for; ``settling`` meanwhile)."""
        feed = self._feed(name)
        return feed is None or feed.unsettled.wait(timeout)

    def handed_out(self, name: str) -> bool:
        """Whether answers on their way hold some of the feed's messages."""
        feed = self._feed(name)
        return feed is not None and feed.unsettled.pending

    def unsettled(self, name: str) -> Unsettled | None:
        """The count of the feed's messages that answers on their way hold (None: no
        such feed), to wait for them once the feed is removed (``Unsettled.wait``)."""
        feed = self._feed(name)
        return None if feed is None else feed.unsettled

    def settling(self, name: str) -> bool:
        """Whether ``wait_settled`` waits for the feed's answers on their way."""
        feed = self._feed(name)
        return feed is not None and feed.unsettled.waiting


def give_back_fed(items: Sequence[Received]) -> None:
    """An answer not sent (``PullReader``; ``PullBuffer`` for the messages of feeds no
    longer read): its messages back to their sources, newest first; those of a feed
    suspended since it was handed out are kept in the pull point through the feed's
    ``late`` (as the suspension kept what reached it), in order, and those of a feed
    with a ``keeper`` through that, whatever its state."""
    late: dict[int, tuple[Callable[[list[Fed[object]]], None], list[Fed[object]]]] = {}
    rest: list[Received] = []
    for item in items:
        keep = _keeper(item)
        if keep is not None:
            assert isinstance(item, Fed)
            late.setdefault(id(item.feed), (keep, []))[1].append(item)
        else:
            rest.append(item)
    nack_all(rest)
    for keep, fed in late.values():
        try:
            keep(fed)
        except Exception:
            log.warning("keeping the messages of an unsent answer failed", exc_info=True)
            nack_all(fed)


def _keeper(item: Received) -> Callable[[list[Fed[object]]], None] | None:
    """What keeps a given-back message in the pull point (None: back to its source)."""
    if not isinstance(item, Fed):
        return None
    feed = item.feed
    if not feed.active and feed.late is not None:
        return feed.late
    return feed.keeper
