"""The ends the broker decides itself (retry give-up, a filter over its budget, a full
backlog, administrative removal) and their SubscriptionEnd notice: a part of
:class:`~wsnmom.core.subscriptions.Subscriptions`.

Decisions:

* SubscriptionEnd (``core.subscription_end``) is published when the broker ends a
  subscription itself; never for Unsubscribe or expiry.
* A subscription the broker ends because its backlog is full or its delivery gave up has
  its whole backlog sent to its dead letters first
  (``SubscriptionHandle.delete_into_dead_letters``, on the instance that delivers it, its
  delivery stopped); when the middleware does not take it, it is not ended yet and a later
  sweep tries again.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from wsnmom.core import errors, metrics
from wsnmom.core.adapter import DROPPED_OVERFLOW_END, AdapterError
from wsnmom.core.delivery import EndSubscription
from wsnmom.core.model import EndpointReference, NotificationMessage, new_resource_id
from wsnmom.core.registry import LiveSubscription
from wsnmom.core.subscription_end import subscription_end_payload
from wsnmom.core.subscription_parts import SubscriptionParts

__all__ = ["DROPPED_FILTER_BUDGET", "DROPPED_GIVE_UP", "SubscriptionEnds"]

#: the logger of ``core.subscriptions`` (one name for all its parts)
log = logging.getLogger(f"{__package__}.subscriptions")

#: the dead-letter reason of the backlog of a subscription ended because its consumer stayed
#: unreachable, and because its filter exceeded its budget: those of the batch given up on
DROPPED_GIVE_UP = "retries-exhausted"
DROPPED_FILTER_BUDGET = "filter-budget"


@dataclass(frozen=True, slots=True)
class _Ending:
    """A subscription given up on, to be ended once its backlog is in its dead letters."""

    #: why it ends (SubscriptionEnd, the log, the dead letters' last error)
    reason: str
    #: the backlog's dead-letter reason
    dropped: str
    #: ``EndSubscription.cause`` (the ended-subscriptions metric's label)
    cause: str


class SubscriptionEnds(SubscriptionParts):
    """Ends the subscriptions the broker gives up on, their backlog to their dead letters
    first (a part of ``Subscriptions``)."""

    #: subscriptions given up on whose backlog the middleware did not take yet (by id)
    _ending: dict[str, _Ending]
    #: the ids whose end runs now, and the lock of both
    _burying: set[str]
    _ending_lock: threading.Lock

    def end(self, subscription_id: str, reason: str) -> None:
        """Administrative removal: destroy and publish SubscriptionEnd (NCIA Annex 1)."""
        self.finish(self._ctx.registry.live_subscription(subscription_id), reason)

    def give_up(self, subscription_id: str, end: EndSubscription) -> None:
        """Delivery cannot go on (the retry policy gave up on the consumer, or the filter
        exceeded its evaluation budget): end the subscription, its backlog to its dead
        letters first.  Runs on a thread of its own (``Channel.on_give_up``; for a pull
        point's feed, ``core.pull_feeds``, once the feed stopped at the breach), after the
        channel stopped and acknowledged the batch it gave up on (that batch went to the
        dead letters already, so the burial here finds it gone).  When the middleware
        does not take the backlog the subscription stays, its delivery stopped, and
        :meth:`retry_ends` (every sweep, on every instance) tries again."""
        state = self._ctx.registry.subscriptions.get(subscription_id)
        if state is None:
            return
        if end.cause == "delivery":
            ending = _Ending(f"consumer unreachable: {end.reason}", DROPPED_GIVE_UP, end.cause)
        else:
            ending = _Ending(end.reason, DROPPED_FILTER_BUDGET, end.cause)
        self._end_given_up(state, ending)

    def _end_given_up(self, state: LiveSubscription, ending: _Ending) -> None:
        """One end at a time per subscription (a give-up and a sweep's retry)."""
        sub_id = state.record.id
        with self._ending_lock:
            if sub_id in self._burying:
                return
            self._burying.add(sub_id)
        try:
            self._end_given_up_now(state, ending)
        finally:
            with self._ending_lock:
                self._burying.discard(sub_id)

    def _end_given_up_now(self, state: LiveSubscription, ending: _Ending) -> None:
        sub_id = state.record.id
        if not self._ctx.delivers(sub_id):
            # the shard moved on since the give-up: the instance delivering it now
            # delivers the backlog, or gives up on it and ends the subscription itself
            log.warning(
                "subscription %s: not ended here (%s): another instance delivers it now",
                sub_id,
                ending.reason,
            )
            self._ending.pop(sub_id, None)
            return
        if self._bury_backlog(state, ending.reason, ending.dropped, resume=False):
            self._ending.pop(sub_id, None)
            metrics.SUBSCRIPTIONS_ENDED.labels(reason=ending.cause).inc()
            self.finish(state, ending.reason)
        else:
            self._ending[sub_id] = ending

    def retry_ends(self) -> None:
        """Try again to end the subscriptions given up on whose backlog the middleware
        did not take (:meth:`give_up`); one that is gone, or that another instance
        delivers now, is no longer this instance's to end."""
        for sub_id, ending in list(self._ending.items()):
            state = self._ctx.registry.subscriptions.get(sub_id)
            if state is None:
                self._ending.pop(sub_id, None)
                continue
            try:
                self._end_given_up(state, ending)
            except Exception:
                log.exception("ending subscription %s failed", sub_id)

    def finish(self, state: LiveSubscription, reason: str) -> None:
        """End a subscription for a reason other than Unsubscribe/expiry."""
        log.warning("ending subscription %s: %s", state.record.id, reason)
        try:
            self.destroy(state)
        except AdapterError:
            log.exception("destroying subscription %s failed", state.record.id)
        self._publish_end(state, reason)

    def end_full(self, state: LiveSubscription, reason: str) -> bool:
        """End a subscription whose backlog is full (``limits.on_full = "end"``) as
        ``finish`` does, after its whole backlog went to its dead letters
        (``SubscriptionHandle.delete_into_dead_letters``, reason ``overflow-end``; what its
        delivery held in memory goes back to the middleware first).  False when the
        middleware did not take the backlog: the subscription goes on as it was, those
        that reached the dead letters gone from it, and the next sweep tries again."""
        if not self._bury_backlog(state, reason, DROPPED_OVERFLOW_END, resume=True):
            return False
        self.finish(state, reason)
        return True

    def _bury_backlog(
        self, state: LiveSubscription, reason: str, dropped: str, resume: bool
    ) -> bool:
        """Before a subscription ends: stop its delivery here (what it held goes back to
        the middleware; a pull point's feed keeps what reached the pull point in it, as a
        pause does: ``PullFeeds.stop``) and have the adapter send its whole backlog to
        its dead letters (``HEADER_DROPPED_REASON`` = ``dropped``, with the consumer and
        "subscription ended: ``reason``") and delete its durable subscription.  True when
        that was done, or cannot be (no handle, dead letters off, an adapter without it:
        then the backlog is deleted with the subscription, as before).  False when the
        middleware did not take it all: the subscription stays, those that reached the
        dead letters gone from it, its delivery started again when ``resume``."""
        ctx = self._ctx
        handle = state.handle
        context = ctx.dead_letters.ending_context(state.record, f"subscription ended: {reason}")
        if handle is None or context is None:
            return True
        # under the subscription's lock, as a Pause's stop and start: a Pause meanwhile
        # waits, and is not undone by the start after a refused backlog
        with state.lock:
            channel = ctx.engine.channel(state.record.id)
            restart = channel is not None and channel.active
            if restart:
                assert channel is not None
                channel.stop()  # what it held goes back to the middleware, then goes too
            # a pull point's feed: what reached the pull point stays there, as at a pause
            try:
                fed = state.feed is not None and self.delivery.feeds.stop(state)
            except AdapterError as exc:
                log.error("subscription %s: its feed did not stop (%s)", state.record.id, exc)
                return False  # tried again at the next sweep (a feed has no channel)
            try:
                sent = handle.delete_into_dead_letters(
                    dropped, context, timeout=ctx.settings.publish_timeout
                )
            except NotImplementedError as exc:
                log.error(
                    "subscription %s: its backlog is deleted, not dead-lettered: %s",
                    state.record.id,
                    exc,
                )
            except AdapterError as exc:
                log.error(
                    "subscription %s: its backlog could not all be sent to its dead "
                    "letters (%s); it is not ended yet, tried again at the next sweep",
                    state.record.id,
                    exc,
                )
                if restart and resume:
                    assert channel is not None
                    channel.start()
                if fed and resume:
                    self.delivery.feeds.sync(state)
                return False
            else:
                log.warning(
                    "subscription %s: %d message(s) of its backlog to its dead letters (%s)",
                    state.record.id,
                    sent,
                    dropped,
                )
        return True

    def _publish_end(self, state: LiveSubscription, reason: str) -> None:
        ctx = self._ctx
        sub = state.record
        if sub.subscription_end_topic is None:
            return
        end_topic = state.end_topic
        if end_topic is None:
            try:
                end_topic = self.end_topic(sub.subscription_end_topic, accepted=True)
            except errors.WsnError:
                log.warning("subscription %s: SubscriptionEndTopic unusable", sub.id)
                return
        if end_topic is None:
            return
        topic, dialect = end_topic
        payload = subscription_end_payload(ctx.subscription_address(sub.id), reason)
        message = NotificationMessage(
            message_id=new_resource_id(),
            payload=payload,
            topic=topic,
            topic_dialect=dialect,
            producer_reference=EndpointReference(ctx.broker_address),
            published_at=ctx.now(),
        )
        try:
            self._inbound.publish([message])
        except errors.WsnError:
            log.exception("publishing SubscriptionEnd for %s failed", sub.id)
