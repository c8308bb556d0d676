"""Routing at publish time into the broker's own pull points (``sole_publisher`` only).

When the adapter declares ``Capabilities.sole_publisher`` (every message reaches the
middleware through this one process), a subscription whose consumer is one of the broker's
pull points needs no durable subscription of its own: when a notification is published,
core finds the feeding subscriptions it matches (a ``TopicIndex`` over their native
patterns, plus the residual filter) and publishes the rendered copies into their pull
points' inboxes in the same ``publish_many`` as the notification, so they are exactly as
durable as the notification.  The first PauseSubscription gives such a subscription a
durable subscription of its own (``Subscription.queued``), which it keeps.

A ``PublishGate`` keeps publishes out while a subscription changes how it is routed:
publishes hold it shared, a routing change exclusively (see ``core.gate``).  Lock order:
the gate before the registry lock.

This is core's one optimisation of the one pull path (``core.pull_feeds``), kept on an A/B
(docs/performance.md, "One pull path"): half the memory and Subscribe cost per feeding
subscription.  Adapters without ``sole_publisher`` never route here: every subscription
has its durable subscription, which its pull point reads.  Neither do subscriptions with
a MessageContent filter: their filter is evaluated when the pull point reads them, never
on the publishing request's thread (``core.filter_sandbox``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from wsnmom.core import metrics
from wsnmom.core.adapter import OutboundMessage, PublishReceipt
from wsnmom.core.codec import encode, pull_point_inbox
from wsnmom.core.context import BrokerContext
from wsnmom.core.gate import PublishGate
from wsnmom.core.lifetimes import is_expired
from wsnmom.core.model import NotificationMessage, Subscription, SubscriptionState
from wsnmom.core.registry import LiveSubscription
from wsnmom.topic_mapping.index import TopicIndex

__all__ = ["DirectRouting"]

Renderer = Callable[[LiveSubscription, NotificationMessage], NotificationMessage]


class DirectRouting:
    """The subscriptions routed at publish time and the gate that guards their routes."""

    def __init__(self, ctx: BrokerContext, render: Renderer) -> None:
        self._ctx = ctx
        self._render = render
        #: routed subscriptions by topic pattern, and those without a topic filter
        self.index: TopicIndex[str] = TopicIndex()
        self.unfiltered: set[str] = set()
        self.gate = PublishGate()

    def wanted(self, sub: Subscription) -> bool:
        """Whether ``sub`` is to be routed at publish time."""
        return (
            sub.pull_point_id is not None
            and sub.message_content is None
            and not sub.queued
            and sub.state is SubscriptionState.ACTIVE
            and self._ctx.adapter.capabilities.sole_publisher
        )

    def add(self, state: LiveSubscription) -> None:
        """Route ``state`` at publish time (hold the registry lock)."""
        state.direct = True
        patterns = state.filter.native_patterns
        if patterns is None:
            self.unfiltered.add(state.record.id)
        else:
            self.index.add(state.record.id, patterns)

    def drop(self, state: LiveSubscription) -> None:
        """Stop routing ``state`` at publish time (hold the registry lock)."""
        if state.direct:
            state.direct = False
            self.unfiltered.discard(state.record.id)
            self.index.remove(state.record.id)

    def publish(
        self,
        outbound: list[OutboundMessage],
        messages: Sequence[NotificationMessage],
        timeout: float,
    ) -> list[PublishReceipt]:
        """Publish ``outbound`` (the encoded ``messages``) together with the copies for the
        routed subscriptions; one receipt per message of ``outbound`` first."""
        with self.gate.shared():
            outbound.extend(self._copies(messages))
            return self._ctx.adapter.publish_many(outbound, timeout)

    def _copies(self, messages: Sequence[NotificationMessage]) -> list[OutboundMessage]:
        """Copies of ``messages`` for the pull points of the routed subscriptions, rendered
        for each (hold the gate shared).  Reads the index and the registry without the
        lock: single dict/set reads are atomic."""
        if not self.unfiltered and not len(self.index):
            return []
        ctx = self._ctx
        subscriptions = ctx.registry.subscriptions
        now = ctx.now()
        copies: list[OutboundMessage] = []
        expired = False
        for message in messages:
            ids = self.index.match(message.topic) if message.topic is not None else set()
            if self.unfiltered:
                ids = ids | self.unfiltered
            for sub_id in sorted(ids):
                state = subscriptions.get(sub_id)
                if state is None or not state.direct:
                    continue
                record = state.record
                if is_expired(record.termination_time, now):
                    expired = True
                    continue
                if not state.filter.matches_topic(message) or record.pull_point_id is None:
                    continue
                copies.append(
                    encode(
                        self._render(state, message), route=pull_point_inbox(record.pull_point_id)
                    )
                )
        if expired:
            ctx.wake_sweep()
        if copies:
            metrics.NOTIFICATIONS_OUT.labels(mode="forward").inc(len(copies))
        return copies
