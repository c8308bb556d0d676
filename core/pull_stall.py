"""A buffered feed stalled at a message its ``prepare`` put off (``PrepareLater``), a part
of ``core.pull_buffer.PullBuffer``.

A feed's message older than a ``limits.max_age`` core enforces goes to the subscription's
dead letters as the feed prepares it (``SubscriptionDelivery.accepted``), and is settled
only once the middleware confirmed its dead letter.  When it did not, ``prepare`` raises
``PrepareLater``: the message is neither handed out (it is too old) nor settled (it would
be lost).  The feed *stalls* at it: the message, and every later message of the feed as it
arrives, waits here unprepared and unsettled, while the feed's earlier messages (in the
buffer) and the other feeds go on.  A later message cannot go past it: offset and
in-order-ack middleware (Kafka, the file log, MQTT) cannot settle what follows a message
without settling that message.  The stalled message is prepared again after the delay
``PrepareLater`` gave, doubled at each refusal up to ``STALL_RETRY_MAX`` seconds (a
WARNING each time); once prepared (its dead letter confirmed: dropped, settled in order)
the messages behind it are prepared in turn and the feed is read as before.

Whatever changes the feed meanwhile drops the stall (``Stalls.drop``, ``Stalls.clear``):
a pause or an end takes the feed's buffered messages, the stalled ones are not among
them and go back to the subscription when the feed's handle stops (so a pause brings them
again after the resume, an end sends them to the dead letters with the backlog, a purge
drops them); the buffer's stop gives them back too.  A feed halted by its filter
(``halt_feed``) is not prepared again: its stall waits for the end that drops it.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from wsnmom.core.adapter import Received
from wsnmom.core.channel_signals import PrepareLater
from wsnmom.core.later import later as call_later
from wsnmom.core.pull_fed import Feed

__all__ = ["STALL_RETRY_MAX", "Stalls"]

log = logging.getLogger(__name__)

#: seconds between two preparations of a stalled message, at most
STALL_RETRY_MAX = 30.0


class _Stall:
    """One stalled feed: the put-off message first, then its later ones."""

    __slots__ = ("feed", "tries", "waiting")

    def __init__(self, feed: Feed[Any], received: Received) -> None:
        self.feed = feed
        self.waiting: deque[Received] = deque([received])
        #: refusals so far
        self.tries = 0


class Stalls:
    """A ``PullBuffer``'s stalled feeds, under the buffer's condition ``cv``.  ``reads``
    tells whether the buffer still reads a feed (hold ``cv``); ``enqueue`` puts a prepared
    message in the buffer (hold ``cv``; True: to settle at once)."""

    __slots__ = ("_cv", "_enqueue", "_reads", "_stalls", "owner")

    def __init__(
        self,
        owner: str,
        cv: threading.Condition,
        reads: Callable[[str, Feed[Any]], bool],
        enqueue: Callable[[Feed[Any], Received, object | None], bool],
    ) -> None:
        #: the pull point's name, for the log
        self.owner = owner
        self._cv = cv
        self._reads = reads
        self._enqueue = enqueue
        self._stalls: dict[str, _Stall] = {}

    def behind(self, name: str, received: Received) -> bool:
        """Whether the feed is stalled (hold ``cv``): then ``received`` waits behind."""
        stall = self._stalls.get(name)
        if stall is None:
            return False
        stall.waiting.append(received)
        return True

    def stall(
        self, name: str, feed: Feed[Any], received: Received, later: PrepareLater, epoch: int
    ) -> None:
        """The feed's ``prepare`` put ``received`` off: the feed stalls at it, unless the
        feed was suspended or the buffer stopped since ``epoch`` (``Feed.epoch``, read
        before the preparation): its handle's stop gave it back."""
        with self._cv:
            if not self._reads(name, feed) or feed.epoch != epoch:
                return
            stall = self._stalls[name] = _Stall(feed, received)
        self._later(name, stall, later)

    def drop(self, name: str) -> None:
        """The feed is suspended or removed (hold ``cv``): the stalled messages go back to
        the subscription with its handle's stop."""
        self._stalls.pop(name, None)

    def clear(self) -> None:
        """The buffer stops (hold ``cv``)."""
        self._stalls.clear()

    def _later(self, name: str, stall: _Stall, later: PrepareLater) -> None:
        stall.tries += 1
        delay = min(later.delay * 2 ** (stall.tries - 1), STALL_RETRY_MAX)
        log.warning(
            "pull point %s: feed %s stalls at a message it cannot prepare now (%d time(s)); "
            "it and the %d after it wait unsettled, prepared again in %g s",
            self.owner,
            name,
            stall.tries,
            len(stall.waiting) - 1,
            delay,
        )
        call_later(delay, lambda: self._again(name, stall))

    def _again(self, name: str, stall: _Stall) -> None:
        """Prepare the stalled messages again, in order, until one is put off again or
        none is left (the feed is read as before); nothing once the stall was dropped."""
        feed = stall.feed
        while True:
            with self._cv:
                if self._stalls.get(name) is not stall or not self._reads(name, feed):
                    return
                waiting = stall.waiting
                while waiting and not waiting[0].settleable:
                    waiting.popleft()  # its connection went: the middleware gives it again
                if not waiting:
                    del self._stalls[name]
                    return
                received = waiting[0]
            try:
                message = feed.prepare(received)
            except PrepareLater as later:
                self._later(name, stall, later)
                return
            with self._cv:
                if self._stalls.get(name) is not stall or not self._reads(name, feed):
                    return  # suspended meanwhile: its handle's stop gives it back
                waiting.popleft()
                settle = self._enqueue(feed, received, message)
            if settle:
                received.ack()
