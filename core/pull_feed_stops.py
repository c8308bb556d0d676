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
same way (``_stop_detached``).  An end here waits for them in ``PullFeeds.stop``, also
for the stop of a feed whose end through another instance was followed meanwhile
(``_detached_stop``: the backlog goes once the handle stopped).  The broker's close ends
the stops under way at once and waits for them (``close``): none touches the adapter
after it.

Each feed's changes are serialised by a lock of the feed's own (``_feed_lock``), held
across their middleware calls (a pause's or an end's publish into the pull point's
inbox, a handle's stop, start or purge): a publish the middleware is slow to confirm
holds that feed's changes only, never the other feeds'.  The lock shared by all feeds
(``_lock``) guards the map of those locks and the stops' threads, for a moment at a time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

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


class _FeedLock:
    """A feed's lock and how many changes hold it or wait for it (``FeedStops._lock``)."""

    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0


class _Detached:
    """A feed detached through another instance whose handle stops once the answers on
    their way that hold ``held`` settled (``FeedStops._stop_detached``); ``thens`` run
    after that stop: the ``then`` of every detach of the feed meanwhile, and what an end
    here waiting for that stop set (``FeedStops._detached_stop``)."""

    __slots__ = ("held", "thens")

    def __init__(self, held: Unsettled, then: Callable[[], None] | None) -> None:
        self.held = held
        self.thens: list[Callable[[], None]] = [] if then is None else [then]


class FeedStops:
    """The locks that serialise a broker's feed changes, one per feed, the buffered feeds
    whose handle stops once answers on their way settled, and those stops (see the module
    docstring)."""

    def __init__(self) -> None:
        #: held for a moment at a time, never across a middleware call: guards
        #: ``_feed_locks`` and ``_threads``
        self._lock = threading.Lock()
        #: the feeds' own locks, by subscription id (``_feed_lock``); an entry lives
        #: while a change holds or waits for it
        self._feed_locks: dict[str, _FeedLock] = {}
        #: buffered feeds whose handle stops once the answers on their way that took
        #: their messages settled (a pause's or an end's) -> the stop's token; until
        #: then a resume leaves the feed to that stop (each under its feed's lock)
        self._stopping: dict[str, object] = {}
        #: feeds detached through another instance whose handle stops once the answers
        #: on their way settled (``_stop_detached``; each under its feed's lock)
        self._detaching: dict[str, _Detached] = {}
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

    @contextmanager
    def _feed_lock(self, name: str) -> Iterator[None]:
        """Hold the lock of the feed ``name`` (its changes, one at a time; never taken
        while another feed's lock or ``_lock`` is held)."""
        with self._lock:
            entry = self._feed_locks.get(name)
            if entry is None:
                entry = self._feed_locks[name] = _FeedLock()
            entry.users += 1
        try:
            with entry.lock:
                yield
        finally:
            with self._lock:
                entry.users -= 1
                if not entry.users:
                    del self._feed_locks[name]

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
        with self._feed_lock(name):
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
        ``START_RETRY`` seconds, unless the feed changed meanwhile (under the feed's
        lock)."""
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
        name = state.record.id
        with self._feed_lock(name):
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
        the ``then`` of each detach of the feed meanwhile runs (and an end here waiting
        for it goes on)."""
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
            with self._feed_lock(name):
                detached = self._detaching.pop(name, None)
            for then in [] if detached is None else detached.thens:
                try:
                    then()
                except Exception:
                    log.warning("subscription %s: after its feed stopped", name, exc_info=True)

    def _stops_later(self, name: str, held: Unsettled, then: Callable[[], None] | None) -> None:
        """Under the feed's lock: the handle of the feed ``name``, detached through another
        instance, stops once ``held`` settled (``_stop_detached``, spawned next); ``then``
        runs after that stop."""
        self._detaching[name] = _Detached(held, then)

    def _detached_stop(self, name: str) -> tuple[Unsettled, threading.Event] | None:
        """Under the feed's lock, for an end here: when the feed was detached through
        another instance and its handle's stop waits for answers on their way
        (``_stop_detached``), what to wait for before the backlog goes (else, stopped
        later, the handle gave back into the backlog what it held, or a message handed
        out after it was buried: ``_wait_detached``)."""
        detached = self._detaching.get(name)
        if detached is None:
            return None
        stopped = threading.Event()
        detached.thens.append(stopped.set)
        return detached.held, stopped

    def _wait_detached(self, name: str, pending: tuple[Unsettled, threading.Event]) -> None:
        """Without the feed's lock: until the answers the detached feed's stop waits for
        settled and its handle stopped (at most ``SETTLE_WAIT`` each; the close ends it)."""
        held, stopped = pending
        settled = self._settled(held)
        if not (stopped.wait(SETTLE_WAIT) and settled):
            log.warning(
                "subscription %s: an answer holding its messages is still on its way; its "
                "backlog goes to its dead letters without waiting longer",
                name,
            )
