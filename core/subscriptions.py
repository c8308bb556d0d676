"""Subscription lifecycle: Subscribe, Renew, Unsubscribe, Pause/Resume, and the ends the
broker decides itself (retry give-up, overflow, administrative removal) with their
SubscriptionEnd notice.

Decisions:

* Subscribe without a consumer address, or with a consumer address the outbound policy
  refuses -> SubscribeCreationFailedFault (SUB-05 names no fault).
* A consumer address that is one of this broker's pull points (same address, or a path
  ``/wsn/pullpoints/<id>`` of a live pull point) makes the subscription *feed* that pull
  point (``core.subscription_delivery``).  UseRaw is ignored for such subscriptions: pull
  points always hold NotificationMessages (PP-10).
* PauseSubscription stops delivery and keeps accumulating; ResumeSubscription delivers what
  accumulated, in order.  Both are idempotent.
* SubscriptionEnd (``core.subscription_end``) is published when the broker ends a
  subscription itself; never for Unsubscribe or expiry.
* A subscription the broker ends because its backlog is full or its delivery gave up has
  its whole backlog sent to its dead letters first
  (``SubscriptionHandle.delete_into_dead_letters``, on the instance that delivers it, its
  delivery stopped); when the middleware does not take it, it is not ended yet and a later
  sweep tries again.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any
from urllib.parse import urlsplit

from wsnmom.core import errors, metrics
from wsnmom.core.access import current_principal, may_manage
from wsnmom.core.adapter import DROPPED_OVERFLOW_END, AdapterError, TopicUnavailable
from wsnmom.core.addresses import ResourceKind, parse_resource_path, resource_address
from wsnmom.core.channel import Channel
from wsnmom.core.context import BrokerContext
from wsnmom.core.dead_letters import check_destination
from wsnmom.core.delivery import EndSubscription
from wsnmom.core.delivery_policy import DeliveryChoices
from wsnmom.core.delivery_policy import parse as delivery_choices
from wsnmom.core.filters import (
    CompiledFilter,
    MessageContentFilter,
    check_producer_properties,
    compile_topic_filter,
    concrete_topic,
    probe,
    topic_errors,
)
from wsnmom.core.inbound import Inbound
from wsnmom.core.lifetimes import is_expired
from wsnmom.core.model import (
    EndpointReference,
    ExpressionSource,
    NotificationMessage,
    RequestedTime,
    SubscribeRequest,
    Subscription,
    SubscriptionState,
    new_resource_id,
)
from wsnmom.core.outbound_policy import AddressRefused
from wsnmom.core.redaction import redact_url
from wsnmom.core.registry import LiveSubscription
from wsnmom.core.subscription_delivery import SubscriptionDelivery
from wsnmom.core.subscription_end import subscription_end_payload
from wsnmom.topic_mapping.model import Topic, TopicExpression

__all__ = ["CHANGE_ATTEMPTS", "Subscriptions", "newer"]

log = logging.getLogger(__name__)

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


TopicMemo = dict[tuple[Any, ...], TopicExpression]


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


class Subscriptions:
    """Creates, changes and ends subscriptions."""

    def __init__(self, ctx: BrokerContext, delivery: SubscriptionDelivery, inbound: Inbound):
        self._ctx = ctx
        self.delivery = delivery
        self._inbound = inbound
        #: subscriptions given up on whose backlog the middleware did not take yet (by id)
        self._ending: dict[str, _Ending] = {}
        #: the ids whose end runs now, and the lock of both
        self._burying: set[str] = set()
        self._ending_lock = threading.Lock()

    # -- filters ---------------------------------------------------------------------------
    def compile_filter(
        self,
        topic: ExpressionSource | None,
        content: ExpressionSource | None,
        producer_properties: ExpressionSource | None,
        memo: TopicMemo | None = None,
    ) -> CompiledFilter:
        """The subscription's filters; ``memo`` shares compiled topic expressions between
        calls while the topic set does not change (start-up: thousands of subscriptions
        often use a handful of expressions)."""
        expr: TopicExpression | None = None
        if topic is not None:
            key = (topic.dialect, topic.text, tuple(sorted(topic.namespaces.items(), key=str)))
            expr = memo.get(key) if memo is not None else None
            if expr is None:
                expr = compile_topic_filter(topic, self._ctx.topic_set)
                if memo is not None:
                    memo[key] = expr
        if producer_properties is not None:
            check_producer_properties(producer_properties)
        mc: MessageContentFilter | None = None
        if content is not None:
            mc = MessageContentFilter(content, self._ctx.filter_rules)
            probe(mc, self._ctx.content_evaluator)
        return CompiledFilter(expr, mc)

    def end_topic(self, source: ExpressionSource | None) -> tuple[Topic, str] | None:
        """The SubscriptionEnd topic and dialect of ``source`` (admitted to the topic set)."""
        if source is None:
            return None
        topic, dialect = concrete_topic(source, self._ctx.topic_set)
        with topic_errors():
            self._ctx.topic_set.admit(topic)
        return topic, dialect

    def pull_point_for(self, address: str) -> str | None:
        """The id of the local pull point ``address`` designates, if any."""
        ctx = self._ctx
        base = resource_address(ctx.settings.base_url, ResourceKind.PULL_POINT, "")
        candidates = []
        if address.startswith(base):
            candidates.append(address[len(base) :].split("?", 1)[0].strip("/"))
        try:
            parsed = parse_resource_path(urlsplit(address).path.rstrip("/"))
        except ValueError:
            parsed = None
        if parsed is not None and parsed[0] is ResourceKind.PULL_POINT:
            candidates.append(parsed[1])
        principal = current_principal()
        for c in candidates:  # made through another instance a moment ago: load it now
            if c and c not in ctx.registry.pull_points and ctx.registry.loader is not None:
                ctx.registry.loader("pull_point", c)
        with ctx.registry.lock:
            for c in candidates:
                state = ctx.registry.pull_points.get(c)
                # only the caller's own pull points: anyone else's is just an address
                if state is not None and may_manage(principal, state.record.owner):
                    return c
        return None

    # -- Subscribe -------------------------------------------------------------------------
    def subscribe(self, req: SubscribeRequest) -> Subscription:
        """Create a subscription (BN §4.2)."""
        ctx = self._ctx
        address = (req.consumer.address or "").strip() if req.consumer else ""
        if not address:
            raise errors.SubscribeCreationFailed("Subscribe needs a ConsumerReference address")
        if req.unsupported_policy:
            raise errors.UnrecognizedPolicyRequest(
                "SubscriptionPolicy requests not recognised: " + ", ".join(req.unsupported_policy),
                policies=tuple(req.unsupported_policy),
            )
        dead_letters, delivery_policy = self._delivery_extensions(req)
        compiled = self.compile_filter(req.topic, req.message_content, req.producer_properties)
        ctx.guard.check_subscribe(compiled.topic)
        end_topic = self.end_topic(req.subscription_end_topic)
        if end_topic is not None:
            ctx.guard.check_notify(end_topic[0])
        if req.initial_termination_time_invalid:
            raise errors.UnacceptableInitialTerminationTime(
                "InitialTerminationTime is empty or not a dateTime/duration"
            )
        termination = ctx.termination(
            req.initial_termination_time, errors.UnacceptableInitialTerminationTime
        )
        pull_point_id = self._consumer_checked(address)
        sub = Subscription(
            id=new_resource_id(),
            consumer=req.consumer,
            creation_time=ctx.now(),
            termination_time=termination,
            topic=req.topic,
            message_content=req.message_content,
            producer_properties=req.producer_properties,
            filter_xml=req.filter_xml,
            policy_xml=req.policy_xml,
            use_raw=req.use_raw and pull_point_id is None,
            subscription_end_topic=req.subscription_end_topic,
            dead_letters=dead_letters,
            delivery_policy=delivery_policy,
            soap_version=req.soap_version,
            wire_version=req.wire_version,
            pull_point_id=pull_point_id,
            owner=ctx.guard.owner(),
        )
        state = LiveSubscription(sub, compiled, end_topic)
        try:
            ctx.store.put_subscription(sub)
            self.attach(state)
        except AdapterError as exc:
            self._undo_subscribe(state)
            if isinstance(exc, TopicUnavailable):  # the same answer as Notify on that topic
                raise errors.TopicNotSupported(str(exc)) from exc
            raise ctx.gate.fault(
                exc, errors.SubscribeCreationFailed(f"the middleware refused: {exc}")
            ) from exc
        ctx.registry.update_gauges()
        ctx.wake_demand()
        return replace(sub)

    def _delivery_extensions(
        self, req: SubscribeRequest
    ) -> tuple[str | None, DeliveryChoices | None]:
        """The Subscribe's dead-letter destination and delivery policy, checked against
        the gateway's settings (a precise Subscribe fault when one is invalid)."""
        dead_letters = None
        if req.dead_letters is not None:
            try:
                dead_letters = check_destination(req.dead_letters.strip())
            except ValueError as exc:
                raise errors.SubscribeCreationFailed(f"wsnmom:DeadLetters: {exc}") from None
        delivery_policy = None
        if req.delivery_policy is not None:
            settings = self._ctx.settings
            try:
                delivery_policy = delivery_choices(
                    req.delivery_policy, settings.retry, settings.delivery
                )
            except ValueError as exc:
                raise errors.SubscribeCreationFailed(f"wsnmom:DeliveryPolicy/{exc}") from None
        return dead_letters, delivery_policy

    def _consumer_checked(self, address: str) -> str | None:
        """The pull point ``address`` names (one of the broker's own), or None after the
        address policy admitted it as a push consumer."""
        pull_point_id = self.pull_point_for(address)
        if pull_point_id is None:
            try:
                self._ctx.policy.check(address)
            except AddressRefused as exc:
                error = (
                    errors.SubscribeCreationFailed
                    if exc.temporary
                    else (errors.ConsumerAddressRefused)
                )
                shown = redact_url(address)
                raise error(f"consumer address {shown!r} refused: {exc.reason}") from None
        return pull_point_id

    def _undo_subscribe(self, state: LiveSubscription) -> None:
        """Take back a Subscribe the middleware refused part way: ``attach`` may have
        indexed the subscription, opened its durable subscription and its channel before
        the refusal (a consumer the middleware did not start in time), and none of that
        may outlive the fault."""
        ctx = self._ctx
        sub_id = state.record.id
        with ctx.registry.lock:
            ctx.registry.subscriptions.pop(sub_id, None)
            self.delivery.direct.drop(state)
        ctx.engine.close_channel(sub_id)
        try:
            self.delivery.feeds.detach(state)
        except Exception:
            log.warning("undoing the refused subscription %s failed", sub_id, exc_info=True)
        ctx.delete_native(sub_id)
        ctx.store.delete_subscription(sub_id)
        ctx.registry.update_gauges()

    def attach(self, state: LiveSubscription) -> None:
        """Open the subscription's delivery (see ``SubscriptionDelivery.attach``)."""
        self.delivery.attach(state, partial(self.give_up, state.record.id))

    # -- SubscriptionManager ---------------------------------------------------------------
    def get(self, subscription_id: str) -> Subscription:
        """The subscription (a copy, with the count of messages the middleware lost for
        it); ResourceUnknown when unknown or expired."""
        state = self._ctx.registry.live_subscription(subscription_id)
        lost = 0
        if state.handle is not None:
            try:
                lost = state.handle.lost()
            except Exception:
                log.debug("reading the lost count of %s failed", subscription_id, exc_info=True)
        return replace(state.record, messages_lost=lost)

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

    def unsubscribe(self, subscription_id: str) -> None:
        """Destroy the subscription (BN §6.1.2); no SubscriptionEnd."""
        state = self._ctx.registry.live_subscription(subscription_id)
        try:
            self.destroy(state)
        except AdapterError as exc:
            raise self._ctx.gate.refusal(exc) or errors.UnableToDestroySubscription(
                str(exc)
            ) from exc

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
            self.delivery.feeds.detach(live, here=False)
        except AdapterError:
            log.debug("detaching the feed of %s failed", sub_id, exc_info=True)
        ctx.registry.update_gauges()
        ctx.wake_demand()

    def purge(self, subscription_id: str) -> int | None:
        """An operator's purge: drop every message waiting for the subscription, those
        its delivery holds in memory (a batch being retried) included; returns how many
        the middleware dropped (None: it cannot tell).  A subscription routed at publish
        time into its pull point holds nothing of its own (0).

        :raises NotImplementedError: the middleware can neither purge nor count.
        """
        ctx = self._ctx
        state = ctx.registry.live_subscription(subscription_id)
        try:
            if state.feed is not None:
                # what reached its pull point stays there (see core.pull_feeds)
                dropped = self.delivery.feeds.purge(state)
            else:
                dropped = self._purge_handle(state)
        except AdapterError as exc:
            raise ctx.gate.fault(
                exc, errors.ResourceUnavailable(f"the middleware failed: {exc}")
            ) from exc
        log.warning("subscription %s purged: %s message(s) dropped", subscription_id, dropped)
        if dropped:
            metrics.NOTIFICATIONS_PURGED.inc(dropped)
        return dropped

    def _purge_handle(self, state: LiveSubscription) -> int | None:
        """Purge the durable subscription of a subscription with a delivery channel."""
        ctx = self._ctx
        with state.lock:
            handle = state.handle
            if handle is None:
                return 0
            channel = ctx.engine.channel(state.record.id)
            restart = channel is not None and channel.active
            try:
                if restart:
                    assert channel is not None
                    channel.stop()  # what it held goes back to the middleware, then goes
                return handle.purge()
            finally:
                if restart:
                    assert channel is not None
                    channel.start()

    # -- ends ------------------------------------------------------------------------------
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

    def destroy(self, state: LiveSubscription) -> None:
        """Remove the subscription everywhere: delivery, middleware, store."""
        ctx = self._ctx
        sub_id = state.record.id
        # under the subscription's lock: a Resume or a shard gained that is starting its
        # delivery finishes first, and the channel closed below stays closed.  The store
        # first, then the registry: a lookup meanwhile (the follower reads the registry,
        # then the store) finds it in neither, and does not load it again, its durable
        # subscription made anew after the delete below
        try:
            with state.lock:
                ctx.store.delete_subscription(sub_id)
                with ctx.registry.lock:
                    ctx.registry.subscriptions.pop(sub_id, None)
                    direct = state.direct
                    self.delivery.direct.drop(state)
                ctx.engine.close_channel(sub_id)
                self.delivery.feeds.detach(state)
                if not direct:
                    ctx.adapter.delete_subscription(sub_id)
        finally:
            ctx.registry.update_gauges()
            ctx.wake_demand()

    def _publish_end(self, state: LiveSubscription, reason: str) -> None:
        ctx = self._ctx
        sub = state.record
        if sub.subscription_end_topic is None:
            return
        end_topic = state.end_topic
        if end_topic is None:
            try:
                end_topic = self.end_topic(sub.subscription_end_topic)
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

    # -- demand ----------------------------------------------------------------------------
    def active_topic_filters(self) -> list[TopicExpression | None]:
        """The topic filters of active, unexpired subscriptions (demand-based publishing)."""
        ctx = self._ctx
        now = ctx.now()
        with ctx.registry.lock:
            return [
                s.filter.topic
                for s in ctx.registry.subscriptions.values()
                if s.record.state is SubscriptionState.ACTIVE
                and not is_expired(s.record.termination_time, now)
            ]
