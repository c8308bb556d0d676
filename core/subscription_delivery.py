"""How a subscription's messages reach its consumer: the delivery channel of each
subscription, and the message as that subscriber sees it.

A push subscription has a durable native subscription whose messages a delivery channel
(``core.delivery``) decodes, filters (residual topic match, MessageContent, expiry) and
posts to the consumer with the outbound SOAP port.  A subscription whose consumer is one of
the broker's pull points has no delivery channel: its pull point reads its durable
subscription directly (``core.pull_feeds``), or, with ``sole_publisher``, it is routed into
the pull point at publish time (``core.direct_routing``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from wsnmom.core import metrics
from wsnmom.core.adapter import AdapterError, Received, SpecOrigin, SubscriptionSpec
from wsnmom.core.channel_signals import PrepareLater
from wsnmom.core.codec import decode, encode, is_internal_routing, pull_point_inbox
from wsnmom.core.context import BrokerContext
from wsnmom.core.delivery import Channel, EndSubscription
from wsnmom.core.delivery_policy import effective, resolve
from wsnmom.core.direct_routing import DirectRouting
from wsnmom.core.filter_sandbox import FilterBudgetExceeded, FilterBusy
from wsnmom.core.lanes import destination_key
from wsnmom.core.lifetimes import is_expired
from wsnmom.core.model import (
    Delivered,
    EndpointReference,
    NotificationMessage,
    SubscriptionState,
)
from wsnmom.core.ports import DeliveryFailed
from wsnmom.core.pull_feeds import PullFeeds
from wsnmom.core.registry import LiveSubscription
from wsnmom.topic_mapping.dialects import CONCRETE, SIMPLE

__all__ = ["SubscriptionDelivery"]

log = logging.getLogger(__name__)


class SubscriptionDelivery:
    """Opens subscriptions' delivery and renders messages for their subscribers."""

    def __init__(self, ctx: BrokerContext) -> None:
        self._ctx = ctx
        self.direct = DirectRouting(ctx, self.render)
        self.feeds = PullFeeds(ctx, self._for_pull_point, self.forward)

    def render(self, state: LiveSubscription, message: NotificationMessage) -> NotificationMessage:
        """The message as this subscriber sees it: topic dialect (META-04), producer
        reference per configuration, the broker's SubscriptionReference (META-B1)."""
        ctx = self._ctx
        dialect: str | None = None
        if message.topic is not None:
            expression = state.record.topic
            if expression is not None and state.filter.topic is not None:
                # the URI the subscriber wrote (an older alias stays that alias)
                dialect = expression.dialect or state.filter.topic.dialect
            else:
                dialect = SIMPLE if len(message.topic.path) == 1 else CONCRETE
            dialect = ctx.topic_dialect(dialect)
        producer = message.producer_reference if ctx.settings.forward_producer_reference else None
        return replace(
            message,
            topic_dialect=dialect,
            producer_reference=producer,
            subscription_reference=EndpointReference(ctx.subscription_address(state.record.id)),
        )

    def accepted(
        self, state: LiveSubscription, batch: Sequence[Received], *, shared: bool = False
    ) -> list[NotificationMessage | None]:
        """For each message of ``batch``: the message if this subscription is to deliver
        it; None to drop it (acked).

        Drops internal traffic, messages the filters refuse, messages older than
        ``limits.max_age`` where core enforces it (to the subscription's dead letters
        first: ``PrepareLater`` when the middleware did not confirm them, the batch kept
        unsettled and prepared again later; a feed of a pull point stalls at it,
        ``core.pull_stall``), and everything once the subscription has
        expired: clients already get ResourceUnknown for it, so it must not
        deliver in the moments before the sweep destroys it (the sweep is woken now).
        The MessageContent filter is evaluated once for the batch by the context's
        evaluator; a message that exceeds its budget raises ``EndSubscription``.  With
        ``shared`` (a delivery channel) the subscription is charged its evaluation time
        (``filters.cpu_share``) and ``PrepareLater`` says when it may evaluate again (asked
        before decoding too); one that stayed over its share too long is ended.
        """
        ctx = self._ctx
        now = ctx.now()
        if is_expired(state.record.termination_time, now):
            ctx.wake_sweep()
            return [None] * len(batch)
        content = state.filter.content
        key = state.record.id if shared and content is not None else None
        if key is not None:
            try:  # refused before decoding: a pushed-back channel retries often
                ctx.content_evaluator.ready(key)
            except FilterBudgetExceeded as exc:
                raise EndSubscription(exc.reason, exc.cause) from exc
            except FilterBusy as busy:
                raise PrepareLater(busy.delay) from None
        out: list[NotificationMessage | None] = []
        too_old: list[Received] = []
        for received in batch:
            if is_internal_routing(received):
                out.append(None)
                continue
            if ctx.limit_keeper.expired(received, now):
                too_old.append(received)
                out.append(None)
                continue
            message = decode(received)
            out.append(message if state.filter.matches_topic(message) else None)
        buried = not too_old or bury(ctx, state, too_old, "max-age", 0, "older than max_age")
        if not buried:  # kept unsettled: prepared again later (counted once buried)
            raise PrepareLater(ctx.settings.retry.initial_delay.total_seconds() or 1.0)
        ctx.limit_keeper.buried(len(too_old))
        if content is not None:
            kept = [i for i, m in enumerate(out) if m is not None]
            try:
                payloads = [m.payload for m in out if m is not None]
                verdicts = ctx.content_evaluator.evaluate(content, payloads, key)
            except FilterBudgetExceeded as exc:
                raise EndSubscription(exc.reason, exc.cause) from exc
            except FilterBusy as busy:
                raise PrepareLater(busy.delay) from None
            for i, verdict in zip(kept, verdicts, strict=True):
                if verdict is not True:
                    if isinstance(verdict, str):
                        log.debug("MessageContent %r failed: %s", content.text, verdict)
                    out[i] = None
        return out

    def _for_pull_point(
        self, state: LiveSubscription, received: Received
    ) -> NotificationMessage | None:
        """The message as the subscription's pull point is to hold it, or None
        (``EndSubscription`` when its MessageContent filter exceeded its budget)."""
        message = self.accepted(state, [received])[0]
        return None if message is None else self.render(state, message)

    def _spec(self, state: LiveSubscription, origin: SpecOrigin) -> SubscriptionSpec:
        """The durable subscription ``state`` needs."""
        ctx = self._ctx
        sub = state.record
        return SubscriptionSpec(
            name=sub.id,
            patterns=state.filter.native_patterns,
            limits=ctx.limits(),
            dead_letters=ctx.dead_letters.native_target(sub),
            dead_letter_sink=ctx.dead_letters.sink,
            # a feed of a pull point is read by the pull point's GetMessages
            pulled=self.feeds.wanted(sub) and ctx.adapter.capabilities.native_pull,
            origin=origin,
        )

    def make(self, state: LiveSubscription) -> bool:
        """Make a new subscription's durable subscription (``origin`` "new"), before its
        record is stored: another instance of a cluster follows the record and may
        consume the durable subscription at once (it holds its shard), and must find it
        made, not half made (RabbitMQ 3.10 answers a declaration of a quorum queue that
        is still being created as if it existed, and a consume then crashes the channel
        and closes the whole connection).  ``attach`` uses the handle.  False when there
        is nothing to make (routed at publish time).  Its intent is stored first: a
        process killed before the record is stored leaves a durable subscription that the
        orphan sweep finds by it (``core.orphans``)."""
        if self.direct.wanted(state.record):
            return False
        self._ctx.store.put_intent(state.record.id)
        state.handle = self._ctx.adapter.subscription(self._spec(state, "new"))
        return True

    def attach(
        self,
        state: LiveSubscription,
        give_up: Callable[[EndSubscription], None],
        origin: SpecOrigin = "",
    ) -> None:
        """Open the durable subscription (``origin``: ``SubscriptionSpec.origin``; "new":
        the handle :meth:`make` made) and its delivery channel (started unless paused);
        for one feeding a pull point, make it a feed of the pull point instead, or,
        routed at publish time, just index it."""
        ctx = self._ctx
        registry = ctx.registry
        sub = state.record
        if self.direct.wanted(sub):
            with registry.lock:
                registry.subscriptions[sub.id] = state
                self.direct.add(state)
            return
        handle = state.handle
        if origin != "new" or handle is None:
            handle = ctx.adapter.subscription(self._spec(state, origin))
        state.handle = handle
        if self.feeds.wanted(sub):
            self.feeds.attach(state, handle, give_up)
            with registry.lock:
                registry.subscriptions[sub.id] = state
            return
        if not ctx.delivers(sub.id):
            # another instance delivers its shard: the durable subscription exists (made
            # above), the delivery opens here when this instance takes the shard
            with registry.lock:
                registry.subscriptions[sub.id] = state
            return
        batch_size = ctx.settings.delivery.batch_size
        ordered = ctx.adapter.capabilities.settles_in_order
        policy = effective(sub.delivery_policy, ctx.settings.retry, ctx.settings.delivery)
        pusher = _Pusher(self, state, policy.timeout)
        channel: Channel[Any] = ctx.engine.open_channel(
            sub.id,
            handle,
            pusher.prepare,
            pusher.send,
            give_up,
            batch_size=batch_size,
            ordered=ordered,
            destination=destination_key(sub.consumer.address),
            trace=_delivered_request_id,
            group=sub.owner or "",
            in_flight=policy.in_flight if policy.ordering == "unordered" else None,
        )
        if sub.delivery_policy is not None:
            channel.backoff = resolve(sub.delivery_policy, ctx.settings.retry)
        channel.dead_letter = _Burial(ctx, state)
        with registry.lock:
            registry.subscriptions[sub.id] = state
        # under the subscription's lock, which Pause/Resume and their followers change the
        # state under: a pause followed while this opened (a shard gained) is not started
        # over; the start (a middleware round trip) holds no registry lock
        with state.lock:
            if sub.state is SubscriptionState.ACTIVE:
                channel.start()

    def forward(
        self, state: LiveSubscription, pull_point_id: str, batch: Sequence[NotificationMessage]
    ) -> None:
        """Publish a subscription's accepted messages into its pull point's inbox (what
        reached the pull point from a feed that pauses or ends, ``core.pull_feeds``)."""
        ctx = self._ctx
        if pull_point_id not in ctx.registry.pull_points:
            raise DeliveryFailed(f"pull point {pull_point_id} is gone", permanent=True)
        tracing = ctx.tracing
        if tracing is not None:
            with tracing.attempt([m.headers for m in batch], state.record.id, "forward"):
                self._forward(state, pull_point_id, batch)
        else:
            self._forward(state, pull_point_id, batch)

    def _forward(
        self, state: LiveSubscription, pull_point_id: str, batch: Sequence[NotificationMessage]
    ) -> None:
        ctx = self._ctx
        inbox = pull_point_inbox(pull_point_id)
        try:
            ctx.adapter.publish_many([encode(m, route=inbox) for m in batch])
        except AdapterError as exc:
            failure = DeliveryFailed(f"publishing into the pull point failed: {exc}")
            ctx.observers.failed(batch, state.record.id, failure)
            raise failure from exc
        metrics.NOTIFICATIONS_OUT.labels(mode="forward").inc(len(batch))


def bury(
    ctx: BrokerContext,
    state: LiveSubscription,
    messages: Sequence[Received],
    reason: str,
    attempts: int,
    error: str | None,
) -> bool:
    """Publish a subscription's given-up ``messages`` to its dead-letter destination;
    True once the middleware confirmed them (``core.dead_letters``)."""
    return ctx.dead_letters.bury(state.record, messages, reason, attempts, error)


class _Burial:
    """A subscription's ``Channel.dead_letter`` (one small object, not a closure)."""

    __slots__ = ("ctx", "state")

    def __init__(self, ctx: BrokerContext, state: LiveSubscription) -> None:
        self.ctx = ctx
        self.state = state

    def __call__(
        self, messages: Sequence[Received], reason: str, attempts: int, error: str | None
    ) -> bool:
        return bury(self.ctx, self.state, messages, reason, attempts, error)


class _Pusher:
    """The delivery functions of a push subscription: bound methods of one small object
    (not closures), since there is one per subscription."""

    __slots__ = ("delivery", "state", "timeout")

    def __init__(self, delivery: SubscriptionDelivery, state: LiveSubscription, timeout: float):
        self.delivery = delivery
        self.state = state
        #: seconds each attempt may take (the subscription's delivery policy)
        self.timeout = timeout

    def prepare(self, batch: Sequence[Received]) -> list[Delivered | None]:
        """Each message as the consumer is to get it, or None to drop it."""
        out: list[Delivered | None] = []
        sub_id = self.state.record.id
        ctx = self.delivery._ctx
        if not ctx.delivers(sub_id):
            # its shard was lost, the closing of this delivery is queued
            # (``core.ownership``): kept unsettled, not a failed attempt (a give-up would
            # bury what another instance delivers); it goes back to the middleware at
            # the close, or is sent once the shard is held again
            raise PrepareLater(ctx.settings.retry.initial_delay.total_seconds() or 1.0)
        for message in self.delivery.accepted(self.state, batch, shared=True):
            if message is None:
                out.append(None)
            else:
                rendered = self.delivery.render(self.state, message)
                out.append(Delivered(rendered, sub_id, rendered.subscription_reference))
        return out

    def send(self, batch: Sequence[Delivered]) -> None:
        """Post ``batch`` to the consumer (one Notify, or one raw message each)."""
        tracing = self.delivery._ctx.tracing
        if tracing is not None:
            with tracing.attempt([d.message.headers for d in batch], self.state.record.id, "push"):
                self._send(batch)
        else:
            self._send(batch)

    def _send(self, batch: Sequence[Delivered]) -> None:
        ctx = self.delivery._ctx
        sub = self.state.record
        if not ctx.delivers(sub.id):
            # its shard's lease lapsed (not renewed in time): the batch stays unsettled
            raise DeliveryFailed("this instance no longer holds the subscription's shard")
        try:
            with metrics.DELIVERY_SECONDS.time():
                ctx.outbound.notify(
                    sub.consumer,
                    sub.soap_version,
                    list(batch),
                    use_raw=sub.use_raw,
                    timeout=self.timeout,
                    wire_version=sub.wire_version,
                )
        except Exception as exc:
            ctx.observers.failed([d.message for d in batch], sub.id, exc)
            raise
        metrics.NOTIFICATIONS_OUT.labels(mode="push").inc(len(batch))
        ctx.observers.delivered([d.message for d in batch], sub.id)


def _delivered_request_id(item: Delivered) -> str | None:
    return item.message.request_id
