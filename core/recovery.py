"""Start-up: restore the broker's resources from the store.

Registrations, pull points and subscriptions are loaded; what expired while the broker was
down is removed (native durable subscriptions included); every other subscription re-opens
its durable subscription and its delivery resumes, so what accumulated meanwhile is
delivered.  A subscription whose filter no longer compiles (the topic set changed) is ended
with SubscriptionEnd; one whose pull point is gone is removed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from wsnmom.core import errors
from wsnmom.core.adapter import AdapterError
from wsnmom.core.context import BrokerContext
from wsnmom.core.filters import CompiledFilter
from wsnmom.core.lifetimes import is_expired
from wsnmom.core.pull_points import PullPoints
from wsnmom.core.registrations import Registrations
from wsnmom.core.registry import LiveRegistration, LiveSubscription
from wsnmom.core.subscriptions import Subscriptions, TopicMemo

__all__ = ["restore"]

log = logging.getLogger(__name__)


def restore(
    ctx: BrokerContext,
    subscriptions: Subscriptions,
    pull_points: PullPoints,
    registrations: Registrations,
) -> None:
    """Load every stored resource into the registry and resume delivery.

    The adapter is told before and after (``Adapter.restoring`` / ``restored``), so an
    adapter that dispatches from shared readers holds back until every durable
    subscription is re-attached."""
    ctx.adapter.restoring()
    try:
        _restore_registrations(ctx, registrations)
        _restore_pull_points(ctx, pull_points)
        _restore_subscriptions(ctx, subscriptions)
    finally:
        ctx.adapter.restored()
    ctx.registry.update_gauges()


def _restore_registrations(ctx: BrokerContext, registrations: Registrations) -> None:
    now = ctx.now()
    for reg in ctx.store.list_registrations():
        if is_expired(reg.termination_time, now):
            log.info("registration %s expired while the broker was down", reg.id)
            registrations.remove(LiveRegistration(reg, ()))
            continue
        try:
            topics = registrations.compile_topics(reg.topics, accepted=True)
        except errors.WsnError as exc:
            log.warning("registration %s dropped: %s", reg.id, exc.description)
            registrations.remove(LiveRegistration(reg, ()))
            continue
        ctx.registry.registrations[reg.id] = LiveRegistration(reg, topics)


def _retire(ctx: BrokerContext, name: str, delete: Callable[..., bool]) -> None:
    """Delete a record (``delete``) with an intent of its durable subscription, then the
    durable subscription, then the intent: a failed delete is left to the orphan sweep."""
    removed = delete(name, intent=True)
    if ctx.delete_native(name) and removed:
        ctx.drop_intent(name)


def _restore_pull_points(ctx: BrokerContext, pull_points: PullPoints) -> None:
    now = ctx.now()
    for pp in ctx.store.list_pull_points():
        if is_expired(pp.termination_time, now):
            log.info("pull point %s expired while the broker was down", pp.id)
            _retire(ctx, pp.id, ctx.store.delete_pull_point)
            continue
        try:
            live = pull_points.live(pp, pull_points.open_handle(pp.id))
        except AdapterError:
            log.exception("cannot reopen pull point %s; it stays stored", pp.id)
            continue
        ctx.registry.pull_points[pp.id] = live


def _restore_subscriptions(ctx: BrokerContext, subscriptions: Subscriptions) -> None:
    now = ctx.now()
    sole_publisher = ctx.adapter.capabilities.sole_publisher
    listed = ctx.adapter.subscription_names() if sole_publisher else None
    native_names = set(listed) if listed is not None else None
    memo: TopicMemo = {}
    for sub in ctx.store.list_subscriptions():
        if (
            sole_publisher
            and sub.pull_point_id is not None
            and not sub.queued
            and (native_names is None or sub.id in native_names)
        ):
            # made before routing at publish time, or a pause cut short by a crash:
            # its durable subscription may hold messages, so it keeps using it
            sub.queued = True
            ctx.store.put_subscription(sub)
        if is_expired(sub.termination_time, now):
            log.info("subscription %s expired while the broker was down", sub.id)
            _retire(ctx, sub.id, ctx.store.delete_subscription)
            continue
        if sub.pull_point_id is not None and sub.pull_point_id not in ctx.registry.pull_points:
            log.info("subscription %s feeds a pull point that is gone", sub.id)
            _retire(ctx, sub.id, ctx.store.delete_subscription)
            continue
        try:
            compiled = subscriptions.compile_filter(
                sub.topic, sub.message_content, sub.producer_properties, memo
            )
            end_topic = subscriptions.end_topic(sub.subscription_end_topic, accepted=True)
        except errors.WsnError as exc:
            state = LiveSubscription(sub, CompiledFilter())
            subscriptions.finish(state, f"filter no longer valid: {exc.description}")
            continue
        state = LiveSubscription(sub, compiled, end_topic)
        try:
            subscriptions.attach(state)
        except AdapterError as exc:
            log.error("cannot reopen subscription %s: %s", sub.id, exc)
            ctx.registry.subscriptions[sub.id] = state  # kept; ready() reports the problem
            continue
