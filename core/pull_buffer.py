"""Pull semantics over push-only subscription handles (``Capabilities.native_pull`` False).

A log- or session-based middleware may offer no "give me the next N messages" call.  Core
then starts the pull point's handle in push mode and keeps what arrives in a buffer, still
unsettled: the middleware keeps every buffered message until GetMessages hands it out, so
nothing is lost if the gateway dies with a full buffer (the messages come again).
``hand_out`` takes messages out of the buffer unsettled; its settlement acknowledges
them in arrival order (offset and in-order-ack middleware need that) once the answer
was written, or puts them back at the head of the buffer (``core.pull_handout``);
``take`` does both steps at once.  The buffer holds at most ``prefetch`` messages per
handle: the adapter's own flow control stops delivering beyond that.

**Feeds** (``core.pull_feeds``; docs/architecture.md, "Push delivery", tells a feed's
pause, resume and end).  Each subscription feeding the pull point is read here from its
own durable handle, started in push mode into the same buffer: its messages arrive
prepared for the pull point (a ``Fed``) and are settled in arrival order like the pull
point's own: one its filters dropped is settled at once when nothing of that feed waits
before it, else when GetMessages reaches it (never handed out); one its ``prepare``
puts off (``PrepareLater``: its ``max_age`` dead letter not confirmed) stalls the feed,
unsettled, and is prepared again later (``core.pull_stall``).  The methods say what a
pause (``suspend_feed``, ``wait_settled``), a resume (``expect``, ``resume_feed``: the
kept copies come back first), a filter's end (``halt_feed``) and an answer not sent
(``_put_back``) do.

**A lost connection.**  A message whose connection to the middleware is gone
(``Received.settleable`` false: an MQTT session taken over or cut off) can no longer be
settled, and the middleware gives it again to the handle's next connection; the buffer
drops its copy instead of handing it out (else both copies would be handed out).  What
an answer took just before the loss may still come again: its acknowledgement may not
have reached the middleware.

The conformance kit uses the same class to run its pull-based checks on push-only
adapters.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TypeVar

from wsnmom.core.adapter import HEADER_MESSAGE_ID, Received, SubscriptionHandle
from wsnmom.core.channel_signals import PrepareLater
from wsnmom.core.pull_fed import SETTLE_WAIT, AnswersOnTheirWay, Fed, Feed, give_back_fed
from wsnmom.core.pull_handout import Settlement
from wsnmom.core.pull_stall import Stalls

__all__ = ["KEPT_WAIT", "SETTLE_WAIT", "Fed", "Feed", "PullBuffer", "give_back_fed"]

log = logging.getLogger(__name__)

#: seconds a resumed feed waits at most for its kept copies to be back in the buffer
KEPT_WAIT = 30.0

M = TypeVar("M")


class PullBuffer(AnswersOnTheirWay):
    """A push-mode handle (and its feeds) whose messages wait here for ``pull`` / ``take``.
    Thread-safe."""

    __slots__ = (
        "_cv",
        "_deferred",
        "_feeds",
        "_generation",
        "_kept",
        "_queue",
        "_skips",
        "_stalls",
        "_started",
        "handle",
        "prefetch",
    )

    def __init__(self, handle: SubscriptionHandle, prefetch: int) -> None:
        self.handle = handle
        self.prefetch = prefetch
        self._cv = threading.Condition()
        self._queue: deque[Received] = deque()
        self._started = False
        #: counts the stops: what was handed out before one is not put back after it
        self._generation = 0
        self._feeds: dict[str, Feed[object]] = {}
        #: feeds' filtered messages in the queue (waiting to be settled in order)
        self._skips = 0
        #: kept copies on their way through the inbox: message id -> its feed
        self._kept: dict[str, Feed[object]] = {}
        #: resumed feeds started once their kept copies are back: name -> deadline
        self._deferred: dict[str, float] = {}
        #: feeds stalled at a message their ``prepare`` put off (``core.pull_stall``)
        self._stalls = Stalls(handle.name, self._cv, self._reads, self._enqueue)

    @property
    def name(self) -> str:
        """The subscription's name."""
        return self.handle.name

    def start(self) -> None:
        """Begin buffering, the pull point's own handle and every active feed
        (idempotent)."""
        with self._cv:
            if self._started:
                return
            self._started = True
            feeds = [(name, f) for name, f in self._feeds.items() if f.active]
        self.handle.start(self._arrived, prefetch=self.prefetch)
        for name, feed in feeds:
            self._start_feed(name, feed)

    def stop(self) -> None:
        """Stop buffering; buffered messages go back to the middleware (redelivered), the
        feeds' too."""
        with self._cv:
            if not self._started:
                return
            self._started = False
            self._generation += 1
            self._queue.clear()
            self._skips = 0
            # started again with the buffer; the inbox delivers its copies again too
            self._kept.clear()
            self._deferred.clear()
            self._stalls.clear()
            feeds = [f for f in self._feeds.values() if f.active]
            for feed in self._feeds.values():
                feed.waiting = 0
                feed.kept = 0
                feed.epoch += 1
        self.handle.stop()
        for feed in feeds:
            feed.handle.stop()

    def _arrived(self, received: Received) -> None:
        with self._cv:
            if not self._started:
                stale = True
            else:
                stale = False
                self._queue.append(received)
                if self._kept:
                    feed = self._kept.pop(received.headers.get(HEADER_MESSAGE_ID, ""), None)
                    if feed is not None:
                        feed.kept -= 1
                self._cv.notify_all()
        if stale:
            received.nack(requeue=True)

    # -- feeds ---------------------------------------------------------------------------------
    def add_feed(
        self,
        name: str,
        handle: SubscriptionHandle,
        prepare: Callable[[Received], M | None],
        *,
        active: bool,
    ) -> None:
        """Read the subscription ``name`` through ``handle`` into this buffer; ``prepare``
        makes the pull point's message of each of its messages (None: drop it).  Started
        now when ``active`` (and the buffer is)."""
        feed: Feed[M] = Feed(handle, prepare)
        with self._cv:
            self._feeds[name] = feed  # type: ignore[assignment]
            feed.active = active
            start = active and self._started
        if start:
            self._start_feed(name, feed)

    def _start_feed(self, name: str, feed: Feed[M]) -> None:
        def arrived(received: Received) -> None:
            self._fed(name, feed, received)

        feed.handle.start(arrived, prefetch=self.prefetch)

    def _fed(self, name: str, feed: Feed[M], received: Received) -> None:
        """A feed's message (on the adapter's thread, one at a time per feed)."""
        with self._cv:
            if not self._reads(name, feed):  # its handle's stop gives it back, unprepared
                return
            epoch = feed.epoch
            if self._stalls.behind(name, received):
                return  # waits behind the message the feed is stalled at
        try:
            message = feed.prepare(received)
        except PrepareLater as later:  # neither handed out nor settled: tried again
            self._stalls.stall(name, feed, received, later, epoch)
            return
        with self._cv:
            if not self._reads(name, feed) or feed.epoch != epoch:
                # suspended or stopping (its handle is stopped next, which gives the
                # message back to the middleware; settling it now would reorder), or
                # suspended and read again meanwhile (given back: it came again)
                return
            settle = self._enqueue(feed, received, message)
        if settle:
            received.ack()

    def _reads(self, name: str, feed: Feed[M]) -> bool:
        """Whether the feed's messages are taken into the buffer (hold ``_cv``)."""
        return self._started and feed.active and self._feeds.get(name) is feed

    def _enqueue(self, feed: Feed[M], received: Received, message: M | None) -> bool:
        """Put the feed's prepared message in the buffer (hold ``_cv``); True: a filtered
        one with nothing of its feed before it, to settle at once."""
        if message is None and not feed.waiting:
            return True
        feed.waiting += 1
        self._queue.append(Fed(feed, received, message))
        if message is None:
            self._skips += 1
        else:
            self._cv.notify_all()
        return False

    def suspend_feed(
        self,
        name: str,
        *,
        drain: bool = True,
        keep_late: Callable[[list[Fed[object]]], None] | None = None,
    ) -> list[Fed[object]]:
        """Take the feed's waiting messages out of the buffer, in order (filtered ones
        too), and ignore what it delivers from now on; the caller settles them and stops
        or deletes the feed's handle.  They are taken with or without ``drain``: this
        instance holds them (unsettled) and no other does.  ``keep_late`` keeps what an
        answer handed out before gives back later (set in the same step as the
        suspension: a give-back meanwhile cannot miss it)."""
        with self._cv:
            feed = self._feeds.get(name)
            if feed is None:
                return []
            feed.active = False
            feed.epoch += 1
            feed.late = keep_late
            self._deferred.pop(name, None)
            self._stalls.drop(name)
            if not feed.waiting:
                return []
            mine: list[Fed[object]] = []
            kept: deque[Received] = deque()
            for item in self._queue:
                if isinstance(item, Fed) and item.feed is feed:
                    mine.append(item)
                else:
                    kept.append(item)
            self._queue = kept
            self._skips -= sum(1 for r in mine if r.message is None)
            feed.waiting = 0
        return mine

    def _feed(self, name: str) -> Feed[object] | None:
        with self._cv:
            return self._feeds.get(name)

    def halt_feed(self, name: str) -> None:
        """Ignore what the feed delivers from now on, leaving it unsettled (its handle
        gives it back to the middleware when stopped), and keep its waiting messages in
        the buffer (handed out, or taken by ``suspend_feed``).  Callable from the feed's
        ``prepare``: the message being prepared is ignored too."""
        with self._cv:
            feed = self._feeds.get(name)
            if feed is not None:
                feed.active = False
                self._deferred.pop(name, None)

    def expect(self, name: str, message_ids: Sequence[str]) -> None:
        """Copies of the feed's messages (by message id) are being published into the
        pull point's inbox: a resume waits for them (``resume_feed``, at most
        ``KEPT_WAIT``), so the feed's next messages never overtake them."""
        with self._cv:
            feed = self._feeds.get(name)
            if feed is None or not self._started:
                return
            for message_id in message_ids:
                if self._kept.setdefault(message_id, feed) is feed:
                    feed.kept += 1

    def unexpect(self, name: str, message_ids: Sequence[str]) -> None:
        """The copies ``expect`` named were not published after all."""
        with self._cv:
            feed = self._feeds.get(name)
            for message_id in message_ids:
                if feed is not None and self._kept.get(message_id) is feed:
                    del self._kept[message_id]
                    feed.kept -= 1

    def _drop_kept(self, feed: Feed[M]) -> None:
        """Forget the feed's expected copies (hold ``_cv``)."""
        if feed.kept:
            for message_id in [k for k, f in self._kept.items() if f is feed]:
                del self._kept[message_id]
            feed.kept = 0

    def resume_feed(self, name: str) -> None:
        """Accept the feed's messages again and start its handle (when the buffer is
        started), once the copies it kept at its pause are back in the buffer."""
        with self._cv:
            feed = self._feeds.get(name)
            if feed is None or feed.active:
                return
            feed.active = True
            start = self._started
            if start and feed.kept:
                self._deferred[name] = time.monotonic() + KEPT_WAIT
                return
        if start:
            self._start_feed(name, feed)

    def holding_back(self, name: str) -> bool:
        """Whether the resumed feed waits for its kept copies before it is read."""
        with self._cv:
            return name in self._deferred

    def _start_deferred(self) -> None:
        """Start the resumed feeds whose kept copies are back (or waited long enough)."""
        if not self._deferred:  # unlocked read: a feed deferred meanwhile waits one call
            return
        now = time.monotonic()
        ready: list[tuple[str, Feed[object]]] = []
        with self._cv:
            for name, deadline in list(self._deferred.items()):
                feed = self._feeds.get(name)
                if feed is None or not feed.active:
                    del self._deferred[name]
                elif not feed.kept or now >= deadline:
                    del self._deferred[name]
                    self._drop_kept(feed)
                    ready.append((name, feed))
        for name, feed in ready:
            self._start_feed(name, feed)

    def remove_feed(
        self,
        name: str,
        *,
        drain: bool = True,
        keep_late: Callable[[list[Fed[object]]], None] | None = None,
    ) -> list[Fed[object]]:
        """Forget the feed; returns its waiting messages (see ``suspend_feed``)."""
        waiting = self.suspend_feed(name, drain=drain, keep_late=keep_late)
        with self._cv:
            feed = self._feeds.pop(name, None)
            if feed is not None:
                self._drop_kept(feed)
            self._deferred.pop(name, None)
        return waiting

    @staticmethod
    def give_back(waiting: list[Fed[object]]) -> None:
        """Nothing to do: the feed's handle is stopped or deleted next, which gives its
        unsettled messages back to the middleware."""

    def feeds(self, *, active: bool) -> list[SubscriptionHandle]:
        """The handles of the active (or the suspended) feeds."""
        with self._cv:
            return [f.handle for f in self._feeds.values() if f.active is active]

    # -- pull ----------------------------------------------------------------------------------
    def _pop(self, max_messages: int, timeout: float, *, answer: bool = False) -> list[Received]:
        """Up to ``max_messages`` messages to hand out, oldest first, with the feeds'
        filtered messages met on the way (``Fed`` without a message), in queue order;
        waits up to ``timeout`` for the first message.  ``answer``: counted unsettled."""
        self.start()
        self._start_deferred()
        deadline = time.monotonic() + timeout
        with self._cv:
            self._drop_unsettleable()
            while len(self._queue) <= self._skips:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                self._cv.wait(remaining)
                self._drop_unsettleable()
            out: list[Received] = []
            handed = 0
            while self._queue and handed < max_messages:
                item = self._queue.popleft()
                if isinstance(item, Fed):
                    item.feed.waiting -= 1
                    if item.message is None:
                        self._skips -= 1
                        out.append(item)
                        continue
                if not item.settleable:  # its connection went since the drop above
                    continue
                out.append(item)
                handed += 1
            for item in out if answer else ():
                if isinstance(item, Fed):
                    item.feed.unsettled.add()
            return out

    def _drop_unsettleable(self) -> None:
        """Forget the messages whose connection to the middleware is gone (hold ``_cv``):
        the middleware gives them again, in order, to the handle's next connection, so
        handing out the copy held here would hand the message out twice."""
        if all(item.settleable for item in self._queue):
            return
        kept: deque[Received] = deque()
        for item in self._queue:
            if item.settleable:
                kept.append(item)
            elif isinstance(item, Fed):
                item.feed.waiting -= 1
                if item.message is None:
                    self._skips -= 1
        self._queue = kept

    def pull(self, max_messages: int, timeout: float = 0.0) -> list[Received]:
        """Up to ``max_messages`` buffered messages, oldest first, waiting up to ``timeout``
        for the first; the caller settles them.  A feed's filtered messages met on the way
        are settled here (``take`` settles everything in order instead)."""
        out = []
        for item in self._pop(max_messages, timeout):
            if isinstance(item, Fed) and item.message is None:
                item.ack()
            else:
                out.append(item)
        return out

    def take(self, max_messages: int) -> list[Received]:
        """Up to ``max_messages`` buffered messages, settled (acked) in order as handed out
        (a feed's filtered messages met on the way too, in their place)."""
        out, settlement = self.hand_out(max_messages)
        settlement.settle()
        return out

    def hand_out(self, max_messages: int) -> tuple[list[Received], Settlement]:
        """Up to ``max_messages`` buffered messages, taken out of the buffer but not
        settled: the settlement acknowledges them (a feed's filtered messages met on the
        way too, in their place) or puts them back at the head of the buffer."""
        generation = self._generation
        items = self._pop(max_messages, 0.0, answer=True)
        out = [i for i in items if not isinstance(i, Fed) or i.message is not None]
        fed = [i.feed for i in items if isinstance(i, Fed)]

        def put_back(taken: Sequence[Received]) -> None:
            self._put_back(taken, generation)

        def settled() -> None:
            for feed in fed:
                feed.unsettled.done()

        return out, Settlement(items, put_back, settled if fed else None)

    def _put_back(self, items: Sequence[Received], generation: int) -> None:
        """An unwritten answer's messages, first again.  Those of a feed no longer read
        here go back to its subscription, or into the pull point's inbox when the feed
        was removed (``give_back_fed``: its subscription is being deleted), whatever
        happened to the buffer meanwhile.  Not the others the middleware gives again
        anyway (the buffer was stopped since, or their connection went)."""
        kept: list[Received] = []
        back: list[Received] = []
        with self._cv:
            current = self._started and generation == self._generation
            feeds = list(self._feeds.values())
            for item in items:
                if isinstance(item, Fed) and (not item.feed.active or item.feed not in feeds):
                    back.append(item)
                    continue
                if not current or not item.settleable:
                    continue
                if isinstance(item, Fed):
                    item.feed.waiting += 1
                    if item.message is None:
                        self._skips += 1
                kept.append(item)
            if kept:
                self._queue.extendleft(reversed(kept))
                self._cv.notify_all()
        give_back_fed(back)

    def held(self, limit: int) -> list[Received]:
        """The first ``limit`` buffered messages, oldest first, as GetMessages would hand
        them out (a feed's filtered ones left out); nothing is taken or settled."""
        with self._cv:
            out: list[Received] = []
            for item in self._queue:
                if len(out) >= limit:
                    break
                if (isinstance(item, Fed) and item.message is None) or not item.settleable:
                    continue
                out.append(item)
            return out

    def buffered(self) -> int:
        """Messages waiting in the buffer (a feed's filtered ones not counted)."""
        with self._cv:
            return len(self._queue) - self._skips

    def depth(self) -> int | None:
        """Buffered messages plus those the middleware still holds back."""
        held = self.handle.depth()
        return None if held is None else held + self.buffered()
