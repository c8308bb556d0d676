"""The stops of a buffered feed's handle that wait for the answers on their way, and the
start of a paused feed resumed meanwhile: a part of
:class:`~wsnmom.core.pull_feeds.PullFeeds`, whose module docstring tells what a pause, a
resume and an end of a feed do.

A stopped handle gives what it holds unsettled back to the middleware, and an ack made
after the stop is lost: a message an answer on its way holds would come again.  So a
paused feed's handle stops once those answers settled, on a thread of its own
(``_stop_settled``), and the feed is started then if it was resumed meanwhile
(``_start``: a start that fails is tried again, ``START_TRIES`` times every
``START_RETRY`` seconds); the handle of a feed ended through another instance stops the
same way (``_stop_detached``).  An end here waits for them in ``PullFeeds.stop``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from wsnmom.core.adapter import SubscriptionHandle
from wsnmom.core.model import SubscriptionState
from wsnmom.core.pull_buffer import PullBuffer
from wsnmom.core.pull_fed import SETTLE_WAIT, Unsettled
from wsnmom.core.registry import LiveSubscription

__all__ = ["START_RETRY", "START_TRIES", "FeedStops"]

log = logging.getLogger(__name__)

#: a resumed feed whose start failed after its pause's stop is started again this many
#: times at most (``FeedStops._start``), every ``START_RETRY`` seconds
START_TRIES = 5
START_RETRY = 2.0


class FeedStops:
    """The lock that serialises a broker's feed changes, the buffered feeds whose handle
    stops once answers on their way settled, and those stops (see the module
    docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: buffered feeds whose handle stops once the answers on their way that took
        #: their messages settled (a pause's or an end's) -> the stop's token; until
        #: then a resume leaves the feed to that stop (under ``_lock``)
        self._stopping: dict[str, object] = {}

    def _stop_settled(
        self, state: LiveSubscription, reader: PullBuffer, handle: SubscriptionHandle, token: object
    ) -> None:
        """A paused feed's handle stops once the answers on their way that took its
        messages settled (at most ``pull_fed.SETTLE_WAIT``); read again then if it was
        resumed meanwhile.  Nothing, when an end, an Unsubscribe or a purge stopped it
        meanwhile (they take over its ``_stopping`` token)."""
        name = state.record.id
        if not reader.wait_settled(name):
            log.warning(
                "subscription %s: an answer holding its messages is still on its way; its "
                "paused feed stops without waiting longer (they come again after a resume)",
                name,
            )
        with self._lock:
            if self._stopping.get(name) is not token:
                return
            del self._stopping[name]
            try:
                handle.stop()
            except Exception:
                # e.g. the connection dropped during it, which gave back what the handle
                # held: a Resume made meanwhile starts the feed all the same
                log.warning("subscription %s: stopping its paused feed failed", name, exc_info=True)
            if state.feed is reader and state.record.state is SubscriptionState.ACTIVE:
                self._start(state, reader)

    def _start(self, state: LiveSubscription, reader: PullBuffer, tries: int = 0) -> None:
        """Read a resumed feed whose handle the pause's stop stopped; a start that fails
        (the middleware unreachable) is tried again ``START_TRIES`` times at most, every
        ``START_RETRY`` seconds, unless the feed changed meanwhile (under ``_lock``)."""
        name = state.record.id
        try:
            reader.resume_feed(name)
            return
        except Exception as exc:
            # not read (what it took given back, its handle stopped): resumed again below
            reader.give_back(reader.suspend_feed(name, drain=False))
            handle = state.handle
            try:
                if handle is not None:
                    handle.stop()
            except Exception:
                log.debug("stopping a feed not started failed", exc_info=True)
            if tries + 1 >= START_TRIES:
                log.error(
                    "subscription %s: its resumed feed could not be started (%s); it is read "
                    "after its next pause and resume",
                    name,
                    exc,
                )
                return
            log.warning(
                "subscription %s: starting its resumed feed failed (%s); tried again in %g s",
                name,
                exc,
                START_RETRY,
            )
        retry = threading.Timer(START_RETRY, self._start_again, args=(state, reader, tries + 1))
        retry.daemon = True
        retry.start()

    def _start_again(self, state: LiveSubscription, reader: PullBuffer, tries: int) -> None:
        """``_start``'s retry: only while the feed is still this reader's, resumed, and
        not being stopped by another pause or an end."""
        with self._lock:
            name = state.record.id
            if (
                state.feed is reader
                and state.record.state is SubscriptionState.ACTIVE
                and name not in self._stopping
            ):
                self._start(state, reader, tries)

    @staticmethod
    def _stop_detached(
        name: str, handle: SubscriptionHandle, held: Unsettled, then: Callable[[], None] | None
    ) -> None:
        """``detach`` through another instance: the handle stops once the answers on
        their way that took the feed's messages settled (at most ``SETTLE_WAIT``)."""
        if not held.wait(SETTLE_WAIT):
            log.warning(
                "subscription %s: an answer holding its messages is still on its way; its "
                "feed, ended through another instance, stops without waiting longer",
                name,
            )
        try:
            handle.stop()
        except Exception:
            log.warning("subscription %s: stopping its ended feed failed", name, exc_info=True)
        finally:
            if then is not None:
                then()
