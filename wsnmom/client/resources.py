"""Handles of the resources a broker creates for a client: subscriptions, pull points and
publisher registrations.

Each handle keeps the endpoint reference the broker issued (address and reference
parameters, which the client echoes on every call) and the times the broker reported, and
offers the operations of that resource.  Used as context managers they end their resource
on exit (Unsubscribe, DestroyPullPoint, DestroyRegistration), ignoring a resource that is
already gone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Self

from lxml import etree

from wsnmom.core.model import EndpointReference
from wsnmom.soap_frontend.xml import WSNMOM, parse_fragment, qname, text_of

from .errors import ResourceUnknownFault
from .model import Message, Notification, Payload, TerminationTime, TopicExpression

if TYPE_CHECKING:
    from .broker import WsnClient

__all__ = ["PublisherRegistration", "PullPoint", "Subscription", "SubscriptionProperties"]

_RESOURCE_ID = qname(WSNMOM, "ResourceId")


def resource_id(reference: EndpointReference) -> str:
    """The broker's id of a resource: its ``wsnmom:ResourceId`` reference parameter, else
    the last segment of its address path."""
    for data in reference.reference_parameters:
        el = parse_fragment(data)
        if el.tag == _RESOURCE_ID:
            return text_of(el)
    return reference.address.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]


class _Resource:
    """What every handle shares: the client, the EPR and ending on ``with`` exit."""

    client: WsnClient
    reference: EndpointReference

    @property
    def address(self) -> str:
        """The resource's address."""
        return self.reference.address

    @property
    def id(self) -> str:
        """The broker's id of the resource."""
        return resource_id(self.reference)

    def _end(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with contextlib.suppress(ResourceUnknownFault):
            self._end()


@dataclass(eq=False)
class Subscription(_Resource):
    """A subscription (its SubscriptionManager endpoint)."""

    client: WsnClient = field(repr=False)
    reference: EndpointReference
    #: the broker's clock when it answered Subscribe/Renew
    current_time: datetime | None = None
    #: when the subscription ends (None: not reported, or no scheduled termination)
    termination_time: datetime | None = None

    def renew(self, termination_time: TerminationTime) -> datetime | None:
        """Ask for a new termination time; returns (and keeps) the one granted."""
        self.termination_time, self.current_time = self.client.renew(self, termination_time)
        return self.termination_time

    def unsubscribe(self) -> None:
        """End the subscription."""
        self.client.unsubscribe(self)

    def pause(self) -> None:
        """Stop deliveries until :meth:`resume` (notifications are kept meanwhile)."""
        self.client.pause(self)

    def resume(self) -> None:
        """Resume deliveries."""
        self.client.resume(self)

    def properties(self) -> SubscriptionProperties:
        """The subscription's resource properties."""
        return self.client.subscription_properties(self)

    def _end(self) -> None:
        self.unsubscribe()


@dataclass(eq=False)
class PullPoint(_Resource):
    """A pull point: a mailbox for notifications, read with :meth:`get_messages`."""

    client: WsnClient = field(repr=False)
    reference: EndpointReference
    termination_time: datetime | None = None

    def get_messages(self, maximum: int | None = None) -> list[Notification]:
        """Take up to ``maximum`` notifications (all the broker gives when None)."""
        return self.client.get_messages(self, maximum)

    def destroy(self) -> None:
        """Destroy the pull point (its unread notifications are dropped)."""
        self.client.destroy_pull_point(self)

    def notify(
        self,
        payload: Payload,
        topic: TopicExpression | str | None = None,
        *,
        producer: EndpointReference | str | None = None,
    ) -> None:
        """Put one notification straight into the pull point."""
        self.client.notify(payload, topic, producer=producer, to=self.reference)

    def _end(self) -> None:
        self.destroy()


@dataclass(eq=False)
class PublisherRegistration(_Resource):
    """A publisher registration (its PublisherRegistrationManager endpoint)."""

    client: WsnClient = field(repr=False)
    reference: EndpointReference
    #: where the registered publisher sends its Notify messages
    consumer_reference: EndpointReference | None = None
    #: the publisher this registration is for (sent as ProducerReference by :meth:`notify`)
    publisher: EndpointReference | None = None

    def destroy(self) -> None:
        """Destroy the registration."""
        self.client.destroy_registration(self)

    def notify(self, payload: Payload, topic: TopicExpression | str | None = None) -> None:
        """Publish one notification as the registered publisher."""
        self.notify_many([Message(payload, topic)])

    def notify_many(self, messages: Iterable[Message]) -> int:
        """Publish notifications as the registered publisher (one Notify request)."""
        target = self.consumer_reference or EndpointReference(self.client.broker_url)
        return self.client.notify_many(
            (Message(m.payload, m.topic, m.producer or self.publisher) for m in messages),
            to=target,
        )

    def _end(self) -> None:
        self.destroy()


@dataclass
class SubscriptionProperties:
    """What a broker reports about a subscription (its resource properties)."""

    consumer_reference: EndpointReference | None
    topic: TopicExpression | None
    #: the MessageContent filter's text and dialect
    message_content: str | None
    message_content_dialect: str | None
    creation_time: datetime | None
    termination_time: datetime | None
    current_time: datetime | None
    #: whether it is paused (None: the broker does not say)
    paused: bool | None
    #: UseRaw was asked for
    use_raw: bool
    #: the ``wsnt:SubscriptionManagerRP`` document as answered
    document: etree._Element = field(repr=False)
