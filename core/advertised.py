"""What the broker advertises of itself: its NotificationBroker resource properties, as the
caller may see them (``broker_properties``, built once per topic-set version and visibility
by :class:`AdvertisedProperties`), and its policy under the adapter's capabilities
(``broker_policy``)."""

from __future__ import annotations

import threading
from collections import OrderedDict

from wsnmom.core.access import Principal, current_principal
from wsnmom.core.config import Settings
from wsnmom.core.context import BrokerContext
from wsnmom.core.filters import MESSAGE_CONTENT_DIALECTS
from wsnmom.core.model import ExpressionSource
from wsnmom.core.policy import BrokerPolicy, build_policy
from wsnmom.core.ports import BrokerProperties
from wsnmom.topic_mapping.dialects import FULL, SUPPORTED_DIALECTS
from wsnmom.topic_mapping.topic_set import TopicSet

__all__ = ["AdvertisedProperties", "broker_policy", "broker_properties"]

#: what decides which topics an identity sees: None (all of them) or its two ACLs
Visibility = tuple[object, object] | None


def _visibility(principal: Principal) -> Visibility:
    """The part of ``principal`` that ``Principal.may_see`` depends on."""
    if principal.admin or (principal.subscribe is None and principal.notify is None):
        return None
    return (principal.subscribe, principal.notify)


class AdvertisedProperties:
    """:func:`broker_properties` built once per (topic-set version, visibility) and shared
    by the requests that ask until a topic is added (``TopicSet.version``): asking costs a
    lookup instead of one expression and one element per topic.  Identities with the same
    ACLs share an entry; at most ``size`` visibilities of the current version are kept
    (least recently used go first).  The answer's ``topic_set`` element is shared: callers
    must not change it (copy it to put it in a document)."""

    def __init__(self, settings: Settings, topic_set: TopicSet, *, size: int = 64) -> None:
        self._settings = settings
        self._topic_set = topic_set
        self._size = size
        self._lock = threading.Lock()
        self._version = -1
        self._built: OrderedDict[Visibility, BrokerProperties] = OrderedDict()

    def get(self) -> BrokerProperties:
        """The properties as the current caller may see them."""
        principal = current_principal()
        key = _visibility(principal)
        version = self._topic_set.version  # before the members are read: never too new
        with self._lock:
            if version == self._version and (found := self._built.get(key)) is not None:
                self._built.move_to_end(key)
                return found
        built = broker_properties(self._settings, self._topic_set, principal)
        with self._lock:
            if version > self._version:
                self._version = version
                self._built.clear()
            if version == self._version:
                self._built[key] = built
                while len(self._built) > self._size:
                    self._built.popitem(last=False)
        return built


def broker_properties(
    settings: Settings, topic_set: TopicSet, principal: Principal | None = None
) -> BrokerProperties:
    """NotificationBroker resource properties, as ``principal`` (default: the caller) may
    see them: an identity with topic ACLs sees only the topics they name
    (``Principal.may_see``)."""
    principal = principal if principal is not None else current_principal()
    visible = None if _visibility(principal) is None else principal.may_see
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
