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

Code layout: :class:`Subscriptions` combines parts of one job each, over the state that
:class:`~wsnmom.core.subscription_parts.SubscriptionParts` declares: this module creates
subscriptions (filters, consumer, Subscribe), reads them and removes them (Unsubscribe,
purge); :mod:`.subscription_changes` changes them (Renew, Pause/Resume, and following the
store), :mod:`.subscription_ends` ends those the broker gives up on (their backlog to their
dead letters first, then SubscriptionEnd).  The parts log under this module's logger.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from datetime import datetime
from functools import partial
from typing import Any
from urllib.parse import urlsplit

from wsnmom.core import errors, metrics
from wsnmom.core.access import current_principal, may_manage
from wsnmom.core.adapter import AdapterError, SpecOrigin, TopicUnavailable
from wsnmom.core.addresses import ResourceKind, parse_resource_path, resource_address
from wsnmom.core.context import BrokerContext
from wsnmom.core.dead_letter_records import check_destination
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
    ExpressionSource,
    SubscribeRequest,
    Subscription,
    SubscriptionState,
    new_resource_id,
)
from wsnmom.core.outbound_policy import AddressRefused
from wsnmom.core.redaction import redact_url
from wsnmom.core.registry import LiveSubscription
from wsnmom.core.store import IntentGone
from wsnmom.core.subscription_changes import CHANGE_ATTEMPTS, SubscriptionChanges, newer
from wsnmom.core.subscription_delivery import SubscriptionDelivery
from wsnmom.core.subscription_ends import SubscriptionEnds
from wsnmom.topic_mapping.model import Topic, TopicExpression

__all__ = ["CHANGE_ATTEMPTS", "Subscriptions", "TopicMemo", "newer"]

log = logging.getLogger(__name__)

TopicMemo = dict[tuple[Any, ...], TopicExpression]


class Subscriptions(SubscriptionChanges, SubscriptionEnds):
    """Creates, changes and ends subscriptions."""

    def __init__(self, ctx: BrokerContext, delivery: SubscriptionDelivery, inbound: Inbound):
        self._ctx = ctx
        self.delivery = delivery
        self._inbound = inbound
        self._ending = {}
        self._burying = set()
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

    def end_topic(
        self, source: ExpressionSource | None, *, accepted: bool = False
    ) -> tuple[Topic, str] | None:
        """The SubscriptionEnd topic and dialect of ``source``: an existing subscription's
        (``accepted``: a restart's, another instance's, an ending one's) admitted to the
        topic set, whatever the bound and the caller; a new Subscribe's only checked
        (its caller may notify on it, it fits under ``quotas.ad_hoc_topics``), admitted
        by :meth:`subscribe` once every check passed (a refused Subscribe admits
        nothing)."""
        if source is None:
            return None
        topic, dialect = concrete_topic(source, self._ctx.topic_set)
        with topic_errors():
            if accepted:
                self._ctx.guard.admit_topic(topic, accepted=True)
            else:
                self._ctx.guard.check_notify(topic)
                self._ctx.guard.check_topic(topic)
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
        if req.initial_termination_time_invalid:
            raise errors.UnacceptableInitialTerminationTime(
                "InitialTerminationTime is empty or not a dateTime/duration"
            )
        termination = ctx.termination(
            req.initial_termination_time, errors.UnacceptableInitialTerminationTime
        )
        pull_point_id = self._consumer_checked(address)
        if end_topic is not None:  # every check passed: admitted now
            with topic_errors():
                ctx.guard.admit_topic(end_topic[0])
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
        stored = False
        try:
            # the durable subscription first (after its intent), then the record other
            # instances follow, which replaces the intent
            made = self.delivery.make(state)
            try:
                if made:
                    ctx.store.add_subscription(sub)
                else:
                    ctx.store.put_subscription(sub)
                stored = True
            except IntentGone as exc:  # slower than the orphan grace: swept meanwhile
                raise errors.SubscribeCreationFailed(
                    "making the subscription took longer than the orphan grace; retry"
                ) from exc
            finally:
                if made and not stored:  # the store refused: nothing may stay behind
                    ctx.undo_native(sub.id)
            self.attach(state, origin="new")
        except AdapterError as exc:
            self._undo_subscribe(state, stored)
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

    def _undo_subscribe(self, state: LiveSubscription, stored: bool) -> None:
        """Take back a Subscribe the middleware refused part way: ``attach`` may have
        indexed the subscription, opened its durable subscription and its channel before
        the refusal (a consumer the middleware did not start in time), and none of that
        may outlive the fault; the record goes too when it was ``stored``."""
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
        if stored:
            # an intent again first: the sweep deletes what the undo below may not
            try:
                ctx.store.put_intent(sub_id)
            except Exception:
                log.warning("recording the intent of %s failed", sub_id, exc_info=True)
            ctx.store.delete_subscription(sub_id)
        ctx.undo_native(sub_id)
        ctx.registry.update_gauges()

    def attach(self, state: LiveSubscription, *, origin: SpecOrigin = "") -> None:
        """Open the subscription's delivery (see ``SubscriptionDelivery.attach``)."""
        self.delivery.attach(state, partial(self.give_up, state.record.id), origin)

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

    def unsubscribe(self, subscription_id: str) -> None:
        """Destroy the subscription (BN §6.1.2); no SubscriptionEnd."""
        state = self._ctx.registry.live_subscription(subscription_id)
        try:
            self.destroy(state)
        except AdapterError as exc:
            raise self._ctx.gate.refusal(exc) or errors.UnableToDestroySubscription(
                str(exc)
            ) from exc

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

    # -- removal ---------------------------------------------------------------------------
    def destroy(self, state: LiveSubscription) -> None:
        """Remove the subscription everywhere: delivery, middleware, store."""
        self._remove(state, None)

    def expire(self, state: LiveSubscription, now: datetime, epoch: int) -> bool:
        """The cluster leader's expiry at ``now``, under the leadership ``epoch``
        (``Store.expire_subscription``): removed as :meth:`destroy` does, unless the
        store's record was renewed meanwhile (then kept: False).

        :raises core.store.Deposed: ``epoch`` is not the leadership's any more (nothing
            removed)"""
        return self._remove(state, (now, epoch))

    def _remove(self, state: LiveSubscription, expired: tuple[datetime, int] | None) -> bool:
        """:meth:`destroy` (``expired`` None) or :meth:`expire`."""
        ctx = self._ctx
        sub_id = state.record.id
        # under the subscription's lock: a Resume or a shard gained that is starting its
        # delivery finishes first, and the channel closed below stays closed.  The store
        # first, then the registry: a lookup meanwhile (the follower reads the registry,
        # then the store) finds it in neither, and does not load it again, its durable
        # subscription made anew after the delete below.  The record's delete stores an
        # intent of its durable subscription: a crash or a refusal before the middleware's
        # delete leaves it to the orphan sweep (``core.orphans``)
        try:
            with state.lock:
                if expired is None:
                    removed = ctx.store.delete_subscription(sub_id, intent=True)
                else:
                    removed = ctx.store.expire_subscription(sub_id, expired[0], epoch=expired[1])
                    if not removed and ctx.store.get_subscription(sub_id) is not None:
                        return False  # renewed through another instance: kept
                with ctx.registry.lock:
                    ctx.registry.subscriptions.pop(sub_id, None)
                    direct = state.direct
                    self.delivery.direct.drop(state)
                ctx.engine.close_channel(sub_id)
                self.delivery.feeds.detach(state)
                if not direct:
                    ctx.adapter.delete_subscription(sub_id)
            if removed:
                ctx.drop_intent(sub_id)
        finally:
            ctx.registry.update_gauges()
            ctx.wake_demand()
        return True

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
