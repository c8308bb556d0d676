"""Subscriptions feeding one of the broker's pull points, read by the pull point directly.

A subscription whose consumer is one of the broker's pull points needs its messages in
that pull point.  With ``sole_publisher`` core routes them there when they are published
(``core.direct_routing``).  Otherwise the subscription has a durable subscription of its
own, and on a middleware whose pull points core buffers (``Capabilities.native_pull``
False: the log adapters, Kafka among them) the pull point's buffer reads that durable
subscription itself, as a *feed* (``core.pull_buffer``).  Before, a delivery channel
published a copy of every message into the pull point's inbox, waited for the
middleware's confirmation on a delivery thread, and the pull point read the copy back: two
trips through the middleware per message, and a one-message fan-out to 10,000 pull points
bounded by eight threads waiting for confirmations.  The copy added nothing: on a log the
subscription's position already keeps the message until it is settled.

What a pull point fed this way guarantees, as before:

* GetMessages returns each message as its subscription renders it (SubscriptionReference,
  topic dialect, producer reference) and filters it (topic, MessageContent, expiry,
  ``limits.max_age``).
* At least once: a fed message stays unsettled in the subscription until GetMessages
  hands it out; after a crash it comes again, marked redelivered.
* PauseSubscription keeps what reached the pull point in it: the feed's waiting messages
  are published into the pull point's inbox (as forwarding did) and settled, then the
  feed stops; the subscription accumulates until ResumeSubscription starts it again.
  Unsubscribe, expiry and the broker's own ends do the same before the durable
  subscription is deleted (unless the pull point itself is being destroyed).  Should that
  publish fail, the messages stay in the subscription and come after the resume.
* Limits: the subscription's QueueLimits apply to its durable subscription as before, the
  pull point's to its inbox; the buffer holds at most ``get_messages_cap`` messages per
  feed.
* Order: each subscription's messages in its order; between feeds and the inbox, the
  order they reached the buffer.
* A MessageContent filter that exceeds its evaluation budget ends the subscription, as
  on a delivery channel: the message is dropped, later ones are not evaluated, and the
  subscription's ``give_up`` runs on a thread of its own (it detaches the feed).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from functools import partial

from wsnmom.core import metrics
from wsnmom.core.adapter import AdapterError, Received, SubscriptionHandle
from wsnmom.core.channel import EndSubscription
from wsnmom.core.context import BrokerContext
from wsnmom.core.model import NotificationMessage, Subscription, SubscriptionState
from wsnmom.core.ports import DeliveryFailed
from wsnmom.core.pull_buffer import Fed
from wsnmom.core.registry import LiveSubscription

__all__ = ["PullFeeds"]

log = logging.getLogger(__name__)

#: the pull point's message of one of the subscription's messages (None: dropped)
Prepare = Callable[[LiveSubscription, Received], NotificationMessage | None]
#: publishes messages into a pull point's inbox (DeliveryFailed when it cannot)
Forward = Callable[[LiveSubscription, str, Sequence[NotificationMessage]], None]


class PullFeeds:
    """Attaches, pauses, resumes and ends feeding subscriptions (see the module
    docstring).  Thread-safe; changes of one broker's feeds are serialised."""

    def __init__(self, ctx: BrokerContext, prepare: Prepare, forward: Forward) -> None:
        self._ctx = ctx
        self._prepare = prepare
        self._forward = forward
        self._lock = threading.Lock()
        #: subscriptions whose filter ended them, until their give-up detached the feed
        self._ending: set[str] = set()

    def wanted(self, sub: Subscription) -> bool:
        """Whether ``sub`` is to be read by its pull point directly."""
        caps = self._ctx.adapter.capabilities
        return sub.pull_point_id is not None and not caps.native_pull and not caps.sole_publisher

    def attach(
        self,
        state: LiveSubscription,
        handle: SubscriptionHandle,
        give_up: Callable[[EndSubscription], None],
    ) -> None:
        """Make the subscription's durable ``handle`` a feed of its pull point's buffer
        (started unless the subscription is paused); ``give_up`` ends the subscription."""
        sub = state.record
        assert sub.pull_point_id is not None
        live = self._ctx.registry.pull_points.get(sub.pull_point_id)
        if live is None or live.buffer is None:
            raise AdapterError(f"pull point {sub.pull_point_id} is gone")
        with self._lock:
            state.feed = live.buffer
            live.buffer.add_feed(
                sub.id,
                handle,
                partial(self._prepared, state, give_up),
                active=sub.state is SubscriptionState.ACTIVE,
            )

    def _prepared(
        self,
        state: LiveSubscription,
        give_up: Callable[[EndSubscription], None],
        received: Received,
    ) -> NotificationMessage | None:
        sub_id = state.record.id
        if sub_id in self._ending:
            return None
        try:
            message = self._prepare(state, received)
        except EndSubscription as end:
            with self._lock:
                first = sub_id not in self._ending
                self._ending.add(sub_id)
            if first:
                log.warning("subscription %s: %s", sub_id, end.reason)
                # the message is settled as filtered when this returns: a dead letter the
                # middleware did not confirm is only logged here (core.dead_letters)
                self._ctx.dead_letters.bury(
                    state.record, [received], "filter-budget", 0, end.reason
                )
                threading.Thread(
                    target=self._give_up, args=(sub_id, give_up, end), daemon=True
                ).start()
            return None
        except Exception:
            log.exception("subscription %s: cannot prepare a message; dropped", state.record.id)
            return None
        if message is None:
            metrics.NOTIFICATIONS_FILTERED.inc()
        else:
            metrics.NOTIFICATIONS_OUT.labels(mode="forward").inc()
        return message

    def _give_up(
        self, sub_id: str, give_up: Callable[[EndSubscription], None], end: EndSubscription
    ) -> None:
        try:
            give_up(end)
        except Exception:
            log.exception("subscription %s: ending it failed", sub_id)
        finally:
            with self._lock:
                self._ending.discard(sub_id)

    def sync(self, state: LiveSubscription) -> None:
        """Bring the feed in line with the subscription's state after a pause or resume:
        started when active; when paused, what reached the pull point kept in it and the
        feed stopped."""
        with self._lock:
            buffer, handle = state.feed, state.handle
            if buffer is None or handle is None:
                return
            if state.record.state is SubscriptionState.ACTIVE:
                buffer.resume_feed(state.record.id)
                return
            self._keep(state, buffer.suspend_feed(state.record.id))
            handle.stop()

    def detach(self, state: LiveSubscription) -> None:
        """The subscription ends: what reached the pull point stays in it (unless the pull
        point is gone), the feed is forgotten; the caller deletes the durable
        subscription."""
        with self._lock:
            buffer, handle = state.feed, state.handle
            if buffer is None:
                return
            state.feed = None
            self._keep(state, buffer.remove_feed(state.record.id))
            if handle is not None:
                handle.stop()

    def purge(self, state: LiveSubscription) -> int | None:
        """An operator's purge of a feeding subscription: what reached the pull point
        stays there, what waits in the subscription is dropped."""
        with self._lock:
            buffer, handle = state.feed, state.handle
            if buffer is None or handle is None:
                return 0
            self._keep(state, buffer.suspend_feed(state.record.id))
            handle.stop()
            try:
                return handle.purge()
            finally:
                if state.record.state is SubscriptionState.ACTIVE:
                    buffer.resume_feed(state.record.id)

    def _keep(self, state: LiveSubscription, waiting: list[Fed[object]]) -> None:
        """Publish the waiting messages into the pull point's inbox and settle them (in
        order); when the pull point is gone or the publish fails they stay unsettled."""
        if not waiting:
            return
        sub = state.record
        pull_point_id = sub.pull_point_id
        if pull_point_id is None or pull_point_id not in self._ctx.registry.pull_points:
            return
        messages = [w.message for w in waiting if isinstance(w.message, NotificationMessage)]
        if messages:
            try:
                self._forward(state, pull_point_id, messages)
            except DeliveryFailed as exc:
                log.warning(
                    "subscription %s: %d message(s) waiting in pull point %s go back to "
                    "the subscription: %s",
                    sub.id,
                    len(messages),
                    pull_point_id,
                    exc.reason,
                )
                return
        for item in waiting:
            try:
                item.ack()
            except Exception:  # the handle may be gone; the copies are in the inbox
                log.debug("settling a fed message failed", exc_info=True)
