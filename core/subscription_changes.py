"""Changing a subscription (Renew, PauseSubscription, ResumeSubscription) and following
the store when another instance changed or destroyed it: a part of
:class:`~wsnmom.core.subscriptions.Subscriptions`.

Decisions:

* PauseSubscription stops delivery and keeps accumulating; ResumeSubscription delivers what
  accumulated, in order.  Both are idempotent.
* Every change is a conditional write (the record's revision): when another instance wrote
  the subscription between this one's read and its write, the stored record is taken over
  and the change applied again, at most :data:`CHANGE_ATTEMPTS` times, then
  ResourceUnavailable (retry later).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

from wsnmom.core import errors
from wsnmom.core.adapter import AdapterError
from wsnmom.core.channel import Channel
from wsnmom.core.model import RequestedTime, Subscription, SubscriptionState
from wsnmom.core.registry import LiveSubscription
from wsnmom.core.subscription_parts import SubscriptionParts

__all__ = ["CHANGE_ATTEMPTS", "SubscriptionChanges", "newer"]

#: the logger of ``core.subscriptions`` (one name for all its parts)
log = logging.getLogger(f"{__package__}.subscriptions")

#: how many times a change is applied again when another instance changed the
#: subscription between this one's read and its conditional write
CHANGE_ATTEMPTS = 5


class _Outcome(enum.Enum):
    """What one attempt of a Pause or Resume did."""

    #: nothing to do (already so), or done without a feed to sync
    DONE = "done"
    #: changed and written
    CHANGED = "changed"
    #: the store had a newer revision: nothing written, nothing changed here
    CONFLICT = "conflict"


def newer(stored: Subscription, held: Subscription) -> bool:
    """Whether the stored record is to be applied over the one held here: a higher
    revision, or an equal one with another state or termination time (a write that failed
    after the record held here changed; a writer that does not bump revisions).  The race
    the revision settles always shows a lower stored revision."""
    if stored.revision != held.revision:
        return stored.revision > held.revision
    return (stored.state, stored.termination_time) != (held.state, held.termination_time)


class SubscriptionChanges(SubscriptionParts):
    """Renew, Pause and Resume, and following the store (a part of ``Subscriptions``)."""

    def renew(
        self, subscription_id: str, termination: RequestedTime, *, invalid: bool = False
    ) -> Subscription:
        """Set a new termination time (BN §6.1.1)."""
        ctx = self._ctx
        # read again: the whole record is written, its state with it (a Renew through
        # this instance right after a Pause through another must not undo the Pause)
        state = ctx.registry.current_subscription(subscription_id)
        if invalid:
            raise errors.UnacceptableTerminationTime(
                "TerminationTime is empty or not a dateTime/duration"
            )
        if termination is None:
            raise errors.UnacceptableTerminationTime("Renew needs a TerminationTime")
        new_time = ctx.termination(termination, errors.UnacceptableTerminationTime)
        for _ in range(CHANGE_ATTEMPTS):
            with state.lock:
                record = state.record
                self._require_live(state)
                before = record.termination_time
                record.termination_time = new_time
                try:
                    written = ctx.store.update_subscription(record)
                except Exception:
                    record.termination_time = before  # as the store still has it
                    raise
                if written:
                    return replace(record)
                record.termination_time = before
            state = self._reread(subscription_id, errors.ResourceUnavailable)
        raise self._contended(subscription_id)

    def pause(self, subscription_id: str) -> None:
        """PauseSubscription: stop delivering, keep accumulating; idempotent."""
        self._change_state(subscription_id, self._pause, errors.PauseFailed)

    def _pause(self, state: LiveSubscription) -> _Outcome:
        ctx = self._ctx
        record = state.record
        with state.lock:
            self._require_live(state)
            if record.state is SubscriptionState.PAUSED:
                return _Outcome.DONE
            if state.direct:
                # the gate before the registry lock: publishes hold the gate while they
                # route (lock order)
                with self.delivery.direct.gate.exclusive(), ctx.registry.lock:
                    queued = state.direct
                    if queued:
                        self._queue_direct(state)
                if queued:  # the write (and its undo) under this subscription's lock only
                    try:
                        written = ctx.store.update_subscription(record)
                    except Exception:
                        self._unpause_queued(state)
                        raise
                    if written:
                        return _Outcome.DONE
                    self._unpause_queued(state)
                    return _Outcome.CONFLICT
            # a channel's stop and start are middleware round trips: under this
            # subscription's lock only, never the registry's
            channel = ctx.engine.channel(record.id)
            try:
                if channel is not None:
                    channel.stop()
            except AdapterError as exc:
                raise self._ctx.gate.fault(exc, errors.PauseFailed(str(exc))) from exc
            record.state = SubscriptionState.PAUSED
            try:
                written = ctx.store.update_subscription(record)
            except Exception:
                # as the store still has it: active, delivering
                record.state = SubscriptionState.ACTIVE
                self._undo(channel, "pause", record.id)
                raise
            if not written:
                record.state = SubscriptionState.ACTIVE
                self._undo(channel, "pause", record.id)
                return _Outcome.CONFLICT
        return _Outcome.CHANGED

    def _sync_feed(self, state: LiveSubscription, fault: type[errors.WsnError]) -> None:
        """A feed follows its subscription's new state (outside the registry lock: a
        pause may publish what reached the pull point into its inbox)."""
        if state.feed is None:
            return
        try:
            self.delivery.feeds.sync(state)
        except AdapterError as exc:
            raise self._ctx.gate.fault(exc, fault(str(exc))) from exc

    def _queue_direct(self, state: LiveSubscription) -> None:
        """Pause a subscription routed at publish time: from now on it has a durable
        subscription of its own, which accumulates while paused (hold the gate)."""
        record = state.record
        direct = self.delivery.direct
        direct.drop(state)
        record.queued = True
        record.state = SubscriptionState.PAUSED
        try:
            self.attach(state)
        except AdapterError as exc:
            record.queued = False
            record.state = SubscriptionState.ACTIVE
            direct.add(state)
            raise self._ctx.gate.fault(exc, errors.PauseFailed(str(exc))) from exc

    def _unpause_queued(self, state: LiveSubscription) -> None:
        """The store write of a Pause that gave a routed subscription a durable
        subscription of its own failed or was refused: active again, as the store still
        has it, delivering through that durable subscription (kept, as a restart keeps
        one it finds, ``core.recovery``)."""
        state.record.state = SubscriptionState.ACTIVE
        self._undo(self._ctx.engine.channel(state.record.id), "pause", state.record.id)
        if state.feed is not None:
            # its pull point reads that durable subscription (attached paused): read it
            try:
                self.delivery.feeds.sync(state)
            except Exception:
                log.warning("undoing the pause of %s failed", state.record.id, exc_info=True)

    def resume(self, subscription_id: str) -> None:
        """ResumeSubscription: deliver what accumulated, in order; no-op when not paused."""
        self._change_state(subscription_id, self._resume, errors.ResumeFailed)

    def _change_state(
        self,
        subscription_id: str,
        step: Callable[[LiveSubscription], _Outcome],
        fault: type[errors.WsnError],
    ) -> None:
        """Pause or Resume (``step``): on a conflicting write elsewhere, read the record
        again and try again, at most ``CHANGE_ATTEMPTS`` times; a change made here brings
        a feed in line and wakes the demand-based publishers."""
        state = self._ctx.registry.current_subscription(subscription_id)
        for _ in range(CHANGE_ATTEMPTS):
            outcome = step(state)
            if outcome is _Outcome.CHANGED:
                self._sync_feed(state, fault)
                self._ctx.wake_demand()
            if outcome is not _Outcome.CONFLICT:
                return
            state = self._reread(subscription_id, fault)
        raise self._contended(subscription_id)

    def _resume(self, state: LiveSubscription) -> _Outcome:
        ctx = self._ctx
        record = state.record
        with state.lock:
            self._require_live(state)
            if record.state is SubscriptionState.ACTIVE:
                return _Outcome.DONE
            channel = ctx.engine.channel(record.id)
            record.state = SubscriptionState.ACTIVE
            try:
                if channel is not None:
                    channel.start()
                elif state.feed is None:
                    self.attach(state)
            except AdapterError as exc:
                record.state = SubscriptionState.PAUSED
                raise self._ctx.gate.fault(exc, errors.ResumeFailed(str(exc))) from exc
            try:
                written = ctx.store.update_subscription(record)
            except Exception:
                # as the store still has it: paused
                record.state = SubscriptionState.PAUSED
                self._undo(ctx.engine.channel(record.id), "resume", record.id)
                raise
            if not written:
                record.state = SubscriptionState.PAUSED
                self._undo(ctx.engine.channel(record.id), "resume", record.id)
                return _Outcome.CONFLICT
        return _Outcome.CHANGED

    @staticmethod
    def _undo(channel: Channel[Any] | None, change: str, subscription_id: str) -> None:
        """Under the subscription's lock: a Pause (restart the channel) or Resume (stop
        it) whose store write failed or was refused is undone here, so that this instance
        does what the store says (its followers, and a retry, compare with the store)."""
        if channel is None:
            return
        try:
            if change == "pause":
                channel.start()
            else:
                channel.stop()
        except Exception:
            log.warning("undoing the %s of %s failed", change, subscription_id, exc_info=True)

    def _require_live(self, state: LiveSubscription) -> None:
        """Under the subscription's lock: ResourceUnknown when it was destroyed since it
        was looked up (an Unsubscribe, expiry or another instance's destroy meanwhile)."""
        if self._ctx.registry.subscriptions.get(state.record.id) is not state:
            raise errors.ResourceUnknown(f"no subscription {state.record.id!r}")

    def _reread(self, subscription_id: str, fault: type[errors.WsnError]) -> LiveSubscription:
        """A conditional write found the subscription changed since it was read (another
        instance wrote it in between): take the stored record over, whatever revision is
        held here, and return the live entry the change is to be applied to again;
        ResourceUnknown when the store no longer has it, ``fault`` (or the gate's
        refusal) when the middleware fails to stop or start its delivery as the stored
        record says."""
        ctx = self._ctx
        stored = ctx.store.get_subscription(subscription_id)
        live = ctx.registry.subscriptions.get(subscription_id)
        if live is not None:
            try:
                if stored is None:
                    self.forget(live)
                else:
                    self.adopt(live, stored, force=True)
            except AdapterError as exc:
                raise ctx.gate.fault(exc, fault(f"the middleware failed: {exc}")) from exc
        return ctx.registry.live_subscription(subscription_id)

    @staticmethod
    def _contended(subscription_id: str) -> errors.WsnError:
        log.warning(
            "subscription %s changed through other instances %d times while a change was "
            "applied to it here; given up",
            subscription_id,
            CHANGE_ATTEMPTS,
        )
        return errors.ResourceUnavailable(
            f"subscription {subscription_id!r} is being changed through other instances; try again",
            retry_after=1.0,
        )

    # -- following the store ---------------------------------------------------------------
    def adopt(self, live: LiveSubscription, stored: Subscription, *, force: bool = False) -> None:
        """Bring the live subscription in line with ``stored``, its record as the store
        holds it: its state (delivery stopped or started here), termination time and
        revision.  Applied only when :func:`newer` says so, unless ``force`` (this
        instance's conditional write was refused: the store's record is the one every
        change applies to).  Under the subscription's lock, so that a record this
        instance wrote after ``stored`` was read (an own Resume a moment after the Pause
        being followed) has the higher revision and is kept."""
        with live.lock:
            record = live.record
            if self._ctx.registry.subscriptions.get(record.id) is not live:
                return  # destroyed since it was looked up: not started, nor attached, again
            if not force and not newer(stored, record):
                return
            changed = stored.state is not record.state
            if changed:
                # first: when stopping or starting fails, nothing is recorded, and the
                # next change or request applies the stored record again
                self._follow_state(live, stored.state)
            record.revision = stored.revision
            record.termination_time = stored.termination_time
        if changed:
            if live.feed is not None:
                # the instance that made the change kept what reached the pull point
                self.delivery.feeds.sync(live, here=False)
            self._ctx.wake_demand()

    def _follow_state(self, live: LiveSubscription, state: SubscriptionState) -> None:
        """Under the subscription's lock: another instance paused or resumed it, stop or
        start here."""
        ctx = self._ctx
        record = live.record
        before = record.state
        record.state = state
        channel = ctx.engine.channel(record.id)
        try:
            if state is SubscriptionState.PAUSED:
                if channel is not None:
                    channel.stop()
            elif channel is not None:
                channel.start()
            elif live.feed is None and not live.direct:
                self.attach(live)
        except BaseException:
            record.state = before  # not followed: what this instance does
            raise

    def forget(self, live: LiveSubscription) -> None:
        """Another instance destroyed it (and its durable subscription): stop here."""
        ctx = self._ctx
        sub_id = live.record.id
        with live.lock:
            with ctx.registry.lock:
                if ctx.registry.subscriptions.get(sub_id) is live:
                    ctx.registry.subscriptions.pop(sub_id, None)
                self.delivery.direct.drop(live)
            ctx.engine.close_channel(sub_id)
        try:
            # the adapter forgets it once the feed's handle stopped (``PullFeeds.detach``)
            self.delivery.feeds.detach(live, here=False, then=partial(ctx.forget_native, sub_id))
        except AdapterError:
            log.debug("detaching the feed of %s failed", sub_id, exc_info=True)
        ctx.registry.update_gauges()
        ctx.wake_demand()
