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
same way (``_stop_detached``).  An end here waits for them in ``PullFeeds.stop``.  The
broker's close ends the stops under way at once and waits for them (``close``): none
touches the adapter after it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from wsnmom.core.adapter import SubscriptionHandle
from wsnmom.core.later import later
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
#: seconds between two looks of a stop waiting for answers at whether the broker closes
_CLOSE_POLL = 0.2


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
        #: feeds detached through another instance whose handle stops once the answers
        #: on their way settled (``_stop_detached``) -> what runs after that stop: the
        #: ``then`` of every detach of the feed meanwhile (under ``_lock``)
        self._detaching: dict[str, list[Callable[[], None]]] = {}
        #: the stops' threads under way, which ``close`` ends and waits for
        self._threads: set[threading.Thread] = set()
        self._closing = threading.Event()

    def close(self, timeout: float = SETTLE_WAIT) -> None:
        """The broker closes: the stops under way stop their handle now, without waiting
        for the answers on their way (an ack after the close is lost anyway), and run what
        follows them (a detach's ``then``, a resumed feed's start); waited for, at most
        ``timeout`` seconds, so none touches the adapter once the broker closed."""
        self._closing.set()
        deadline = time.monotonic() + timeout
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _spawn(self, target: Callable[..., None], args: tuple[object, ...], name: str) -> None:
        """Run a stop on a thread of its own, which ``close`` waits for."""

        def run() -> None:
            try:
                target(*args)
            finally:
                with self._lock:
                    self._threads.discard(thread)

        thread = threading.Thread(target=run, name=name, daemon=True)
        with self._lock:
            self._threads.add(thread)
        thread.start()

    def _settled(self, held: Unsettled | None) -> bool:
        """Whether the answers on their way that hold ``held`` settled within
        ``SETTLE_WAIT`` (False at once when the broker closes)."""
        deadline = time.monotonic() + SETTLE_WAIT
        while held is not None:
            remaining = deadline - time.monotonic()
            if self._closing.is_set() or remaining <= 0:
                return False
            if held.wait(min(remaining, _CLOSE_POLL)):
                return True
        return True

    def _stop_settled(
        self, state: LiveSubscription, reader: PullBuffer, handle: SubscriptionHandle, token: object
    ) -> None:
        """A paused feed's handle stops once the answers on their way that took its
        messages settled (at most ``pull_fed.SETTLE_WAIT``); read again then if it was
        resumed meanwhile.  Nothing, when an end, an Unsubscribe or a purge stopped it
        meanwhile (they take over its ``_stopping`` token)."""
        name = state.record.id
        if not self._settled(reader.unsettled(name)):
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
        later(START_RETRY, lambda: self._start_again(state, reader, tries + 1))

    def _start_again(self, state: LiveSubscription, reader: PullBuffer, tries: int) -> None:
        """``_start``'s retry: only while the feed is still this reader's, resumed, and
        not being stopped by another pause or an end."""
        with self._lock:
            name = state.record.id
            if (
                state.feed is reader
                and state.record.state is SubscriptionState.ACTIVE
                and name not in self._stopping
                and not self._closing.is_set()
            ):
                self._start(state, reader, tries)

    def _stop_detached(self, name: str, handle: SubscriptionHandle, held: Unsettled) -> None:
        """``detach`` through another instance: the handle stops once the answers on
        their way that took the feed's messages settled (at most ``SETTLE_WAIT``), then
        the ``then`` of each detach of the feed meanwhile runs."""
        if not self._settled(held):
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
            with self._lock:
                thens = self._detaching.pop(name, [])
            for then in thens:
                try:
                    then()
                except Exception:
                    log.warning("subscription %s: after its feed stopped", name, exc_info=True)
