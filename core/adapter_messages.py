"""What crosses the adapter contract as a message: the metadata header names, the internal
namespaces, and the message types core and an adapter hand each other (``OutboundMessage``
and its ``PublishReceipt``, ``StoredMessage``, ``Received`` with its ``SharedMessage``).

Part of the contract in :mod:`wsnmom.core.adapter` (its docstring says how internal
namespaces are routed and when core settles a ``Received``), which re-exports every name;
plugin authors import them from there.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from wsnmom.core.model import NotificationMessage, _direct_init
from wsnmom.topic_mapping.model import Topic

#: Metadata header names carried with every message (AMQP headers, Kafka record headers,
#: MQTT 5 user properties).  Natively published messages may lack all of them.
HEADER_MESSAGE_ID = "wsnmom-message-id"
HEADER_TOPIC_NAMESPACE = "wsnmom-topic-ns"
HEADER_TOPIC_PATH = "wsnmom-topic-path"
HEADER_TOPIC_DIALECT = "wsnmom-topic-dialect"
HEADER_PRODUCER_REFERENCE = "wsnmom-producer-ref"
HEADER_PUBLISHED_AT = "wsnmom-published-at"
#: Set by an adapter on a message the middleware dropped itself from a subscription and
#: sent to ``SubscriptionSpec.dead_letters`` (``Capabilities.native_dead_letters``): why
#: (:data:`DROPPED_MAX_AGE`, :data:`DROPPED_OVERFLOW`) and the ``SubscriptionSpec.name``
#: it was dropped from.
HEADER_DROPPED_REASON = "wsnmom-dropped-reason"
HEADER_DROPPED_FROM = "wsnmom-dropped-from"
#: with them, when it was dropped (ISO 8601, UTC), so that a dead letter keeps its time
#: across gateway restarts; and how many times it had been handed out before (absent: 0)
HEADER_DROPPED_AT = "wsnmom-dropped-at"
HEADER_DROPPED_ATTEMPTS = "wsnmom-dropped-attempts"
DROPPED_MAX_AGE = "max-age"
DROPPED_OVERFLOW = "overflow"
#: the subscription was ended for its full backlog (``limits.on_full = "end"``) and its
#: whole backlog sent to its dead letters (``SubscriptionHandle.delete_into_dead_letters``)
DROPPED_OVERFLOW_END = "overflow-end"

#: Namespaces starting with this prefix are internal to wsnmom (see the docstring of
#: :mod:`wsnmom.core.adapter`):
#: never matched by ``SubscriptionSpec.patterns=None``, never usable by clients.
INTERNAL_NAMESPACE_PREFIX = "urn:wsnmom:internal:"


def is_internal_namespace(namespace: str) -> bool:
    """True for a namespace reserved for wsnmom's internal traffic."""
    return namespace.startswith(INTERNAL_NAMESPACE_PREFIX)


@_direct_init
@dataclass(frozen=True, slots=True)
class OutboundMessage:
    """A message core asks the adapter to publish."""

    topic: Topic
    body: bytes
    message_id: str
    headers: Mapping[str, str] = field(default_factory=dict)
    content_type: str = "application/xml"


@_direct_init
@dataclass(frozen=True, slots=True)
class PublishReceipt:
    """The middleware's answer to a confirmed publish."""

    #: False when the middleware said no subscription received it (RabbitMQ unroutable);
    #: None when the middleware cannot tell.  Not an error: there may be no subscriber yet.
    routed: bool | None = None


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A message read back from the middleware without consuming it (the current message
    of a topic, a message ``SubscriptionHandle.peek`` saw waiting)."""

    topic: Topic
    body: bytes
    headers: Mapping[str, str]
    content_type: str = "application/xml"
    #: when the middleware stored it (UTC), None when it cannot tell
    timestamp: datetime | None = None


class SharedMessage:
    """One middleware message handed to several subscriptions (a log record read once
    for many cursors): every copy's ``Received.shared`` is the same object, and core
    keeps there what it derives from the message's content alone (its decoded
    notification), so that is done once per message, not once per subscription."""

    __slots__ = ("notification",)

    def __init__(self) -> None:
        self.notification: NotificationMessage | None = None


class Received(abc.ABC):
    """A message handed to core from a durable subscription; settle it exactly once."""

    topic: Topic
    body: bytes
    headers: Mapping[str, str]
    content_type: str
    #: True when the middleware says this message was handed out before
    redelivered: bool
    #: when the middleware stored the message (UTC), None when it cannot tell; core uses
    #: it (or the gateway's own ``wsnmom-published-at`` header) for ``QueueLimits.max_age``
    #: when the middleware does not enforce limits itself
    timestamp: datetime | None = None
    #: the same object in every subscription's copy of one middleware message, when the
    #: adapter hands one message to several (``SharedMessage``); None: not shared
    shared: SharedMessage | None = None

    @abc.abstractmethod
    def ack(self) -> None:
        """Done: the middleware may forget the message for this subscription."""

    @abc.abstractmethod
    def nack(self, requeue: bool = True) -> None:
        """Not done: requeue for redelivery (in order where possible) or drop it."""

    @property
    def settleable(self) -> bool:
        """False once settling it can no longer reach the middleware (the connection it
        came on is gone): the middleware gives it again, so core must not hand out the
        copy it still holds (``core.pull_buffer`` drops it).  True unless the adapter can
        tell."""
        return True
