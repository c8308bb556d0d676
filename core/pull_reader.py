"""A pull point read through the middleware's own pull (``Capabilities.native_pull``).

Every pull point reads its inbox (Notify sent to the pull point, SetSynchronizationPoint,
what a paused feed kept) and its *feeds*, the durable subscriptions of the subscriptions
that feed it, directly (``core.pull_feeds``): no copy of a feeding subscription's message
is made into the inbox.  Where the middleware has no pull of its own, ``core.pull_buffer``
consumes the inbox and the feeds into memory; where it has one, this reader takes from
them when GetMessages asks, and holds nothing in memory:

* ``take`` takes from the inbox first, then from each active feed in turn (the feed that
  comes first rotates, so a full answer does not starve the others), until the answer is
  full.  A feed's messages are prepared for the pull point (its filters applied, rendered
  with its SubscriptionReference: a ``Fed``) as they are taken; those its filters drop are
  settled with the answer.  Each source's messages come in its order.
* ``suspend_feed`` (a pause, the end of the subscription) takes what reached the pull
  point: the first ``cap`` messages waiting in the feed, unsettled (as the buffer holds at
  most ``cap`` per feed); the caller publishes them into the inbox and settles them, or
  ``give_back`` returns them to the feed.  ``drain=False`` (another instance made the
  change and keeps them) takes nothing.
* ``halt_feed`` (its subscription's filter went over its budget) stops the feed at once,
  from inside a ``take``: that answer takes nothing more from it, and what waits in it
  stays there for the subscription's end (``core.pull_feeds``); what answers took from
  it before and give back goes to its ``keep_late``.
* Reads of the feeds are serialised (``_reading``): ``take`` holds it for a whole answer,
  ``suspend_feed`` to stop the feed and take what reached the pull point.  A pause or an
  end arriving while GetMessages reads the feed waits for that answer, and no answer
  reads a feed once its suspension began (else the answer could hand out the
  subscription's later messages, taken after the pause, ahead of the earlier ones the
  pause keeps in the inbox).
* What an answer took is handed out unsettled (``SubscriptionHandle.hand_out``) and
  settled once the answer was written, or given back to its sources, newest first
  (``core.pull_handout``); a feed's filtered messages are settled with the answer.  What
  it took from a feed suspended meanwhile (a pause, an Unsubscribe or expiry while the
  answer was being sent; an end through another instance too, once this one followed
  it) is kept in the pull point as the suspension kept what reached it
  (``suspend_feed``'s ``keep_late``: into the inbox, after what the suspension kept),
  rather than given back into a subscription that may be deleted; in a cluster, where
  another instance may be deleting it before this one knows, a feed's given-back
  messages always go into the inbox (``Feed.keeper``, ``core.pull_feeds``).  The
  answer that meets the breach of a feed's filter (``halt_feed``): what it took from the
  feed before the breach goes with the answer like the rest, and given back goes to
  ``halt_feed``'s ``keep_late`` (the subscription's dead letters); so do the breaching
  message and those behind it, before the answer is made (``keep_late`` settles them once
  the dead letters are confirmed, else gives them back into the subscription, which ends
  and dead-letters what it still holds).  A feed failing unexpectedly
  ends the answer with what it holds (the failure reaches GetMessages only when the
  answer is empty).
* A feed the middleware cannot read (its subscription destroyed through another instance a
  moment ago) is skipped for that answer; only when nothing at all could be read does the
  failure reach GetMessages.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from wsnmom.core.adapter import AdapterError, Received, SubscriptionHandle
from wsnmom.core.channel_signals import PrepareLater
from wsnmom.core.pull_fed import AnswersOnTheirWay, Fed, Feed, give_back_fed
from wsnmom.core.pull_handout import Settlement, nack_all

__all__ = ["PullReader"]

log = logging.getLogger(__name__)


class PullReader(AnswersOnTheirWay):
    """A pull point's inbox handle and its feeds, read with the middleware's pull.
    Thread-safe (GetMessages on one pull point is serialised by its caller)."""

    __slots__ = ("_feeds", "_lock", "_reading", "_turn", "cap", "handle")

    def __init__(self, handle: SubscriptionHandle, cap: int) -> None:
        self.handle = handle
        #: at most this many of a feed's messages are kept when it is suspended
        self.cap = cap
        self._lock = threading.Lock()
        #: held while the feeds are read (a ``take``, a ``suspend_feed``); before ``_lock``
        self._reading = threading.Lock()
        self._feeds: dict[str, Feed[object]] = {}
        #: where the next ``take`` starts among the feeds
        self._turn = 0

    @property
    def name(self) -> str:
        """The pull point's durable subscription's name."""
        return self.handle.name

    def start(self) -> None:
        """Nothing is consumed ahead of GetMessages."""

    def stop(self) -> None:
        """Stop the inbox's handle (the broker closes)."""
        self.handle.stop()

    # -- feeds ---------------------------------------------------------------------------------
    def add_feed(
        self,
        name: str,
        handle: SubscriptionHandle,
        prepare: Callable[[Received], object | None],
        *,
        active: bool,
        keeper: Callable[[list[Fed[object]]], None] | None = None,
    ) -> None:
        """Read the subscription ``name`` through ``handle``; ``prepare`` makes the pull
        point's message of each of its messages (None: drop it); ``keeper`` keeps in the
        pull point what an answer gives back (``Feed.keeper``)."""
        feed: Feed[object] = Feed(handle, prepare)
        feed.active = active
        feed.keeper = keeper
        with self._lock:
            self._feeds[name] = feed

    def suspend_feed(
        self,
        name: str,
        *,
        drain: bool = True,
        keep_late: Callable[[list[Fed[object]]], None] | None = None,
    ) -> list[Fed[object]]:
        """Stop reading the feed; with ``drain``, the messages that reached the pull point
        (up to ``cap``, unsettled, filtered ones included) for the caller to keep.
        ``keep_late`` keeps what an answer handed out before gives back later."""
        with self._reading:
            with self._lock:
                feed = self._feeds.get(name)
                if feed is None or not feed.active:
                    return []
                feed.active = False
                feed.late = keep_late
            if not drain:
                return []
            received = feed.handle.pull(self.cap, timeout=0.0)
            mine: list[Fed[object]] = []
            _prepare(feed, received, mine)
            return mine

    def halt_feed(
        self, name: str, keep_late: Callable[[list[Fed[object]]], None] | None = None
    ) -> None:
        """Stop reading the feed at once, taking nothing: callable from the feed's
        ``prepare`` inside a ``take`` (its subscription's filter ended it), whose answer
        then takes nothing more from the feed; a later ``suspend_feed`` takes nothing.
        ``keep_late`` takes what an answer handed out before gives back later (as
        ``suspend_feed``'s)."""
        with self._lock:
            feed = self._feeds.get(name)
            if feed is not None:
                feed.active = False
                feed.late = keep_late

    def resume_feed(self, name: str) -> None:
        """Read the feed again."""
        with self._lock:
            feed = self._feeds.get(name)
            if feed is not None:
                feed.active = True
                feed.late = None

    def remove_feed(
        self,
        name: str,
        *,
        drain: bool = True,
        keep_late: Callable[[list[Fed[object]]], None] | None = None,
    ) -> list[Fed[object]]:
        """Forget the feed; returns what reached the pull point (see ``suspend_feed``),
        nothing when the middleware cannot give it (the caller deletes the feed's
        durable subscription next, and fails there when the middleware does)."""
        try:
            waiting = self.suspend_feed(name, drain=drain, keep_late=keep_late)
        except AdapterError as exc:
            # e.g. another instance that declared the durable subscription deleted it as
            # it followed this end: the end goes on (it was answered 503 before, with
            # the subscription's record already deleted)
            log.warning("pull point %s: feed %s not drained at its end: %s", self.name, name, exc)
            waiting = []
        with self._lock:
            self._feeds.pop(name, None)
        return waiting

    @staticmethod
    def give_back(waiting: Sequence[Fed[object]]) -> None:
        """Messages ``suspend_feed`` took that could not be kept go back to their feed."""
        for item in reversed(waiting):
            try:
                item.nack(True)
            except Exception:  # the handle may be gone: then so are the messages
                log.debug("giving a fed message back failed", exc_info=True)

    def feeds(self, *, active: bool) -> list[SubscriptionHandle]:
        """The handles of the active (or the suspended) feeds."""
        with self._lock:
            return [f.handle for f in self._feeds.values() if f.active is active]

    # -- pull ----------------------------------------------------------------------------------
    def take(self, max_messages: int) -> list[Received]:
        """Up to ``max_messages`` messages, settled as they are handed out: the inbox's
        first, then the active feeds' in turn (see the module docstring)."""
        out, settlement = self.hand_out(max_messages)
        settlement.settle()
        return out

    def hand_out(self, max_messages: int) -> tuple[list[Received], Settlement]:
        """Up to ``max_messages`` messages, not settled (``SubscriptionHandle.hand_out``):
        the settlement acknowledges them, or gives them back to their subscriptions."""
        items: list[Received] = []
        out: list[Received] = []
        with self._reading:
            self._take(max_messages, items, out)
            # counted before an end's ``wait_settled`` can read the feed's count
            fed = [i.feed for i in items if isinstance(i, Fed)]
            for feed in fed:
                feed.unsettled.add()

        def settled() -> None:
            for feed in fed:
                feed.unsettled.done()

        return out, Settlement(items, give_back_fed, settled if fed else None)

    def _feed(self, name: str) -> Feed[object] | None:
        with self._lock:
            return self._feeds.get(name)

    def _take(self, max_messages: int, items: list[Received], out: list[Received]) -> None:
        """Fill ``out`` with the messages to hand out and ``items`` with what the answer
        settles (a feed's filtered messages too)."""
        items.extend(self.handle.hand_out(max_messages))
        out.extend(items)
        if len(out) >= max_messages:
            return
        with self._lock:
            feeds = [f for f in self._feeds.values() if f.active]
            if feeds:
                turn = self._turn % len(feeds)
                self._turn = turn + 1
                feeds = feeds[turn:] + feeds[:turn]
        for feed in feeds:
            mine: list[Fed[object]] = []
            #: where in ``mine`` its filter halted the feed (the breach), if it did
            breach: list[int] = []
            try:
                self._read_feed(feed, max_messages - len(out), mine, breach)
            except Exception:
                # an adapter's unexpected failure: the answer goes with what it took
                if not out and not mine:
                    raise
                log.warning(
                    "pull point %s: feed %s failed; answering with what was taken",
                    self.name,
                    feed.handle,
                    exc_info=True,
                )
                self._keep(feed, mine, breach, items, out)
                return
            self._keep(feed, mine, breach, items, out)

    def _read_feed(
        self, feed: Feed[object], wanted: int, mine: list[Fed[object]], breach: list[int]
    ) -> None:
        """Up to ``wanted`` of the feed's messages to hand out into ``mine`` (its filtered
        ones too), while the feed is read; ``breach`` gets the place in ``mine`` of the
        message whose filter halted the feed (``halt_feed``), if one did."""
        handed = 0
        while handed < wanted and feed.active:
            want = wanted - handed
            try:
                got = feed.handle.hand_out(want)
            except AdapterError as exc:
                # gone through another instance, or the middleware failed: the others
                # are still read (the inbox was, so the middleware answers)
                log.debug("pull point %s: feed %s not read: %s", self.name, feed.handle, exc)
                return
            before = len(mine)
            whole = _prepare(feed, got, mine, breach)
            handed += sum(1 for m in mine[before:] if m.message is not None)
            if not whole or len(got) < want:
                return

    @staticmethod
    def _keep(
        feed: Feed[object],
        mine: list[Fed[object]],
        breach: list[int],
        items: list[Received],
        out: list[Received],
    ) -> None:
        out.extend(m for m in mine if m.message is not None)
        if feed.active:
            items.extend(mine)
            return
        # halted by its filter while this answer read it: what the answer took from it
        # before the breach is settled with the answer, and given back to the feed's
        # ``late`` (its subscription's dead letters: given back into its queue, it was
        # lost once the end deleted that); the breaching message and those behind it go
        # to the dead letters now, through ``late`` too: settled once the middleware
        # confirmed them, else given back (still under ``_reading``: the end's stop
        # waits for it, so they are back in the backlog before that goes)
        cut = breach[0] if breach else len(mine)
        items.extend(mine[:cut])
        rest = mine[cut:]
        if not rest:
            return
        if feed.late is None:
            nack_all(rest)
            return
        try:
            feed.late(rest)
        except Exception:
            log.warning("burying the messages met after a feed's end failed", exc_info=True)
            nack_all(rest)

    def held(self, limit: int) -> list[Received]:
        """Nothing is held in memory."""
        return []

    def buffered(self) -> int:
        """Nothing is held in memory."""
        return 0

    def depth(self) -> int | None:
        """Messages waiting in the inbox."""
        return self.handle.depth()


def _prepare(
    feed: Feed[object],
    received: Sequence[Received],
    mine: list[Fed[object]],
    breach: list[int] | None = None,
) -> bool:
    """Prepare the feed's ``received`` into ``mine``, in order; ``breach`` gets the place
    in ``mine`` of the message whose filter halted the feed (``halt_feed``), if one did.
    False when ``prepare`` put one off (``PrepareLater``: its dead letter not confirmed):
    it and those after it go back to the feed, prepared again when read again (not met
    today: the middleware of native pull enforces ``max_age`` itself)."""
    for i, r in enumerate(received):
        try:
            message = feed.prepare(r)
        except PrepareLater:
            nack_all(received[i:])
            return False
        if breach is not None and not feed.active and not breach:
            breach.append(len(mine))
        mine.append(Fed(feed, r, message))
    return True
