"""What the broker advertises of itself: its NotificationBroker resource properties, as the
caller may see them (``broker_properties``), and its policy under the adapter's
capabilities (``broker_policy``)."""

from __future__ import annotations

from wsnmom.core.access import current_principal
from wsnmom.core.config import Settings
from wsnmom.core.context import BrokerContext
from wsnmom.core.filters import MESSAGE_CONTENT_DIALECTS
from wsnmom.core.model import ExpressionSource
from wsnmom.core.policy import BrokerPolicy, build_policy
from wsnmom.core.ports import BrokerProperties
from wsnmom.topic_mapping.dialects import FULL, SUPPORTED_DIALECTS
from wsnmom.topic_mapping.topic_set import TopicSet

__all__ = ["broker_policy", "broker_properties"]


def broker_properties(settings: Settings, topic_set: TopicSet) -> BrokerProperties:
    """NotificationBroker resource properties, as the caller may see them: an identity
    with topic ACLs sees only the topics they name (``Principal.may_see``)."""
    principal = current_principal()
    unrestricted = principal.admin or (principal.subscribe is None and principal.notify is None)
    visible = None if unrestricted else principal.may_see
    topics = [
        t
        for t in topic_set.topics()
        if not topic_set.is_alias(t) and (visible is None or visible(t))
    ]
    exprs = [
        ExpressionSource(FULL, "tns:" + "/".join(topic.path), {"tns": topic.namespace})
        for topic in topics
    ]
    return BrokerProperties(
        topic_expressions=exprs,
        fixed_topic_set=topic_set.fixed,
        dialects=tuple(SUPPORTED_DIALECTS),
        topic_set=topic_set.to_element(visible),
        requires_registration=settings.requires_registration,
    )


def broker_policy(ctx: BrokerContext) -> BrokerPolicy:
    """The policy under the adapter's capabilities now (they are final once it is open:
    ``BrokerService.start`` builds it again)."""
    return build_policy(
        ctx.settings,
        message_content_dialects=MESSAGE_CONTENT_DIALECTS,
        limits_enforced_by=ctx.limit_keeper.enforcement(),
        ordering=ctx.adapter.capabilities.ordering,
    )
