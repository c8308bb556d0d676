"""What the parts of :class:`~wsnmom.core.subscriptions.Subscriptions` share:
:class:`SubscriptionParts` declares the state every part reads and the methods one part
calls on another, so each part (a module of one job: :mod:`.subscriptions` creates and
removes subscriptions, :mod:`.subscription_changes` changes them and follows the store,
:mod:`.subscription_ends` ends those the broker gives up on) type-checks on its own;
``Subscriptions`` combines them and sets the state up."""

from __future__ import annotations

from typing import TYPE_CHECKING

from wsnmom.core.context import BrokerContext
from wsnmom.core.inbound import Inbound
from wsnmom.core.model import ExpressionSource
from wsnmom.core.registry import LiveSubscription
from wsnmom.core.subscription_delivery import SubscriptionDelivery
from wsnmom.topic_mapping.model import Topic


class SubscriptionParts:
    """The state of ``Subscriptions`` (set up by its ``__init__``) and the methods its
    parts call on each other (declared here for the type checker only)."""

    _ctx: BrokerContext
    delivery: SubscriptionDelivery
    _inbound: Inbound

    if TYPE_CHECKING:

        def attach(self, state: LiveSubscription) -> None: ...
        def destroy(self, state: LiveSubscription) -> None: ...
        def end_topic(
            self, source: ExpressionSource | None, *, accepted: bool = False
        ) -> tuple[Topic, str] | None: ...
