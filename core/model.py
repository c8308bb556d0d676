"""Domain records of the broker: resources (subscriptions, pull points, publisher
registrations), notification messages, and the request records the SOAP frontend hands to
``core.service.BrokerService``.

XML fragments that the broker must echo unchanged (reference parameters, filters, policies)
are kept as serialised UTF-8 XML bytes; the frontend parses and serialises, core stores and
evaluates.  Expressions that need the broker's topic set to be understood (topic and message
content expressions) arrive unparsed as ``ExpressionSource`` and are parsed by core.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from wsnmom.topic_mapping.model import Topic

if TYPE_CHECKING:
    from wsnmom.core.delivery_policy import DeliveryChoices


class SoapVersion(enum.Enum):
    """SOAP version a peer speaks; replies and deliveries use the peer's version."""

    SOAP11 = "1.1"
    SOAP12 = "1.2"


class WireVersion(enum.Enum):
    """The WS-Notification wire format a peer speaks (namespaces and message shapes): the
    frontend translates the older ones at its edge, core only keeps the tag so that a
    subscriber is delivered to in the format it subscribed with."""

    WSN_13 = "1.3"
    #: OASIS WSN 1.2 drafts (``http://docs.oasis-open.org/wsn/2004/06/...``)
    WSN_12_DRAFT = "1.2-draft"
    #: WS-Notification 1.0 (2004, IBM ``stdwip`` namespace, WS-Addressing 2003/03)
    WSN_10 = "1.0"


def new_resource_id() -> str:
    """An unguessable resource id (122 random bits, URL-safe)."""
    return uuid.uuid4().hex


#: hexadecimal suffixes of :func:`new_message_ids` for the usual batch sizes
_ID_SUFFIXES: tuple[str, ...] = tuple(f"{i:08x}" for i in range(1024))


def new_message_ids(count: int) -> list[str]:
    """``count`` distinct message ids for the messages of one batch (one Notify).

    32 hexadecimal characters like :func:`new_resource_id`: 96 random bits drawn once per
    batch, then the message's index in the batch (8 hex digits).  Ids of different batches
    are as unguessable as resource ids; ids within one batch follow each other.  Message
    ids identify notifications (middleware message ids, duplicate detection); they grant
    no access to anything, unlike resource ids.
    """
    prefix = os.urandom(12).hex()
    if count <= len(_ID_SUFFIXES):
        return [prefix + suffix for suffix in _ID_SUFFIXES[:count]]
    return [f"{prefix}{i:08x}" for i in range(count)]


@dataclass(frozen=True, slots=True)
class EndpointReference:
    """A WS-Addressing 1.0 endpoint reference.

    ``reference_parameters`` holds each child of ``wsa:ReferenceParameters`` serialised as
    XML; they are echoed as SOAP headers when the EPR is addressed.
    """

    address: str
    reference_parameters: tuple[bytes, ...] = ()
    metadata: bytes | None = None


@dataclass(frozen=True, slots=True)
class ExpressionSource:
    """An expression as the client wrote it: dialect URI, text and in-scope namespaces."""

    dialect: str | None
    text: str
    namespaces: Mapping[str | None, str] = field(default_factory=dict)


class _Infinite:
    """Type of :data:`INFINITE`."""

    _instance: _Infinite | None = None

    def __new__(cls) -> _Infinite:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "INFINITE"

    def __reduce__(self) -> str:
        return "INFINITE"


#: Requested termination time ``xsi:nil="true"``: no scheduled termination (infinite).
#: The broker grants it only when configured to (``termination.allow_infinite``).
INFINITE = _Infinite()

#: Requested termination time: absolute (timezone-aware) datetime, a relative duration
#: (``timedelta``; or an ``isodate.Duration`` when it has years/months), ``INFINITE`` for
#: ``xsi:nil="true"``, or None for "not given" (the broker default applies).
RequestedTime = datetime | timedelta | object | None


_C = TypeVar("_C", bound=type)


class _FactoryDefault:
    """The default of a ``default_factory`` parameter (shown as dataclass shows it)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _FactoryDefault()


_T = TypeVar("_T")


#: class -> its slot copier (``_slot_copier``)
_COPIERS: dict[type[Any], Callable[[Any], Any]] = {}


def _slot_copier(cls: type[Any]) -> Callable[[Any], Any]:
    """A function copying an instance of the slotted class ``cls`` slot by slot (made
    once per class)."""
    known = _COPIERS.get(cls)
    if known is not None:
        return known
    names: tuple[str, ...] = getattr(cls, "__slots__", ())
    slots = [cls.__dict__[name] for name in names if name != "__weakref__"]
    pairs = [(slot.__get__, slot.__set__) for slot in slots]

    def copy(obj: Any) -> Any:
        out: Any = object.__new__(cls)
        for get, put in pairs:
            put(out, get(obj))
        return out

    _COPIERS[cls] = copy
    return copy


def shallow_copy(obj: _T) -> _T:
    """A shallow copy of a slotted dataclass instance (a record read under a lock, such as
    ``Subscription``): what ``dataclasses.replace(obj)`` gives, in half the time, which
    counts when an operator lists 10,000 subscriptions."""
    cls: type[Any] = type(obj)
    copied: _T = _slot_copier(cls)(obj)
    return copied


def _direct_init(cls: _C) -> _C:
    """Give a frozen, slotted dataclass an ``__init__`` that stores each field through its
    slot descriptor.

    The ``__init__`` that ``dataclass(frozen=True)`` generates assigns every field with
    ``object.__setattr__(self, name, value)``, which looks the attribute up by name each
    time; calling the slots' descriptors directly stores the same values for about half
    the cost, which counts for the records made per notification.  Same parameters,
    defaults, keyword use and resulting objects (equality, hashing, ``replace``, pickling
    are the dataclass's own).  Only for init fields without ``__post_init__``; a
    ``default_factory`` is called when its argument is left out, as dataclass does.
    """
    params: list[str] = []
    body: list[str] = []
    namespace: dict[str, Any] = {"_FACTORY": _FACTORY}
    for f in dataclasses.fields(cls):
        if not f.init:
            raise TypeError(f"{cls.__name__}.{f.name}: only init fields are supported")
        namespace[f"_set_{f.name}"] = cls.__dict__[f.name].__set__
        if f.default_factory is not dataclasses.MISSING:
            namespace[f"_factory_{f.name}"] = f.default_factory
            params.append(f"{f.name}=_FACTORY")
            body.append(f"    if {f.name} is _FACTORY:\n        {f.name} = _factory_{f.name}()\n")
        elif f.default is dataclasses.MISSING:
            params.append(f.name)
        else:
            namespace[f"_default_{f.name}"] = f.default
            params.append(f"{f.name}=_default_{f.name}")
        body.append(f"    _set_{f.name}(self, {f.name})\n")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__} has __post_init__")
    exec(f"def __init__(self, {', '.join(params)}):\n{''.join(body)}", namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    target: Any = cls
    target.__init__ = init
    return cls


@_direct_init
@dataclass(frozen=True, slots=True)
class NotificationMessage:
    """One notification as it travels through the broker and the middleware.

    ``payload`` is the child element of ``wsnt:Message`` serialised as UTF-8 XML with the
    namespace declarations it needs.  A message that came from a native (non WS-N) producer
    and is not XML has ``content_type`` other than ``application/xml``; it is wrapped for WS-N
    consumers at delivery time.
    """

    message_id: str
    payload: bytes
    topic: Topic | None = None
    #: dialect URI the publisher used for the topic, echoed in deliveries when known
    topic_dialect: str | None = None
    producer_reference: EndpointReference | None = None
    content_type: str = "application/xml"
    #: when the broker accepted it (UTC)
    published_at: datetime | None = None
    #: SubscriptionReference of the NotificationMessage as accumulated in a pull point
    #: (GM-07: GetMessages returns the NotificationMessage exactly as accumulated)
    subscription_reference: EndpointReference | None = None
    #: the id of the request that published it (``X-Request-Id``), carried through the
    #: middleware so delivery logs can name it; never sent to consumers
    request_id: str | None = None
    #: ids of the gateways that published it, oldest first (``core.loops``)
    via: tuple[str, ...] = ()
    #: the publisher's application headers, carried to every consumer (``core.app_headers``)
    headers: tuple[tuple[str, str], ...] = ()


@_direct_init
@dataclass(frozen=True, slots=True)
class InboundNotification:
    """One ``wsnt:NotificationMessage`` of an inbound Notify, before core validates it."""

    payload: bytes
    topic: ExpressionSource | None = None
    producer_reference: EndpointReference | None = None
    subscription_reference: EndpointReference | None = None
    #: the gateways it went through before (``wsnmom:Hops`` header, ``core.loops``)
    via: tuple[str, ...] = ()
    #: application headers (``wsnmom:Messages`` header, ``core.app_headers``), validated
    headers: tuple[tuple[str, str], ...] = ()


class SubscriptionState(enum.Enum):
    """Lifecycle of a subscription."""

    ACTIVE = "active"
    PAUSED = "paused"


@dataclass(slots=True)
class Subscription:
    """A WS-N subscription: a durable native subscription plus WS-N bookkeeping."""

    id: str
    consumer: EndpointReference
    creation_time: datetime
    termination_time: datetime | None  # None = no expiry (only when configured)
    topic: ExpressionSource | None = None
    message_content: ExpressionSource | None = None
    producer_properties: ExpressionSource | None = None
    #: the wsnt:Filter element as received, echoed by GetResourceProperty(Filter)
    filter_xml: bytes | None = None
    #: the wsnt:SubscriptionPolicy element as received
    policy_xml: bytes | None = None
    use_raw: bool = False
    #: NCIA extension: topic on which SubscriptionEnd is published for this subscriber
    subscription_end_topic: ExpressionSource | None = None
    #: wsnmom extension: the dead-letter destination of its given-up messages (None: the
    #: gateway's ``dead_letters.destination``)
    dead_letters: str | None = None
    #: wsnmom extension: the subscriber's delivery policy choices (``wsnmom:DeliveryPolicy``,
    #: ``core.delivery_policy``); None: the gateway's ``retry`` settings
    delivery_policy: DeliveryChoices | None = None
    state: SubscriptionState = SubscriptionState.ACTIVE
    soap_version: SoapVersion = SoapVersion.SOAP12
    #: the WS-N wire format the subscriber spoke; deliveries use it
    wire_version: WireVersion = WireVersion.WSN_13
    #: set when the consumer EPR points at one of this broker's pull points
    pull_point_id: str | None = None
    #: the identity that created it (``core.access``); None = anonymous or created before
    #: the gateway recorded owners
    owner: str | None = None
    #: a subscription feeding a pull point that keeps its own durable subscription (since
    #: its first pause) rather than being routed into the pull point when published
    queued: bool = False
    #: not stored: messages the middleware deleted (retention) before this subscription
    #: read them, filled in when the subscription is read (``SubscriptionHandle.lost``)
    messages_lost: int = 0
    #: the store's revision of this record: every write bumps it (the store sets it on the
    #: record it writes), so an instance following a shared store applies a stored change
    #: only when it is newer than what it holds (``core.follow``); 0: never stored.  Not
    #: part of equality: two records with the same content are equal whatever their writes
    revision: int = field(default=0, compare=False)


@dataclass(slots=True)
class PullPoint:
    """A pull point: a durable native subscription drained by GetMessages."""

    id: str
    creation_time: datetime
    termination_time: datetime | None
    #: optional client-chosen name (CXF ``wsnt:pullPointQueueName``) to re-attach to
    name: str | None = None
    #: the identity that created it (None: anonymous or before owners were recorded)
    owner: str | None = None


@dataclass(slots=True)
class PublisherRegistration:
    """A RegisterPublisher registration."""

    id: str
    creation_time: datetime
    termination_time: datetime | None
    publisher_reference: EndpointReference | None
    topics: tuple[ExpressionSource, ...] = ()
    demand: bool = False
    #: demand-based publishing: SubscriptionReference the publisher gave the broker
    demand_subscription: EndpointReference | None = None
    #: demand-based publishing: whether that subscription is currently paused
    demand_paused: bool = False
    #: the identity that registered (None: anonymous or before owners were recorded);
    #: with ``requires_registration`` only it may Notify as this publisher
    owner: str | None = None


@dataclass(frozen=True, slots=True)
class SubscribeRequest:
    """Subscribe, after XML parsing."""

    consumer: EndpointReference
    topic: ExpressionSource | None = None
    message_content: ExpressionSource | None = None
    producer_properties: ExpressionSource | None = None
    filter_xml: bytes | None = None
    initial_termination_time: RequestedTime = None
    #: True when the element was present but empty/invalid (fault), distinct from absent
    initial_termination_time_invalid: bool = False
    policy_xml: bytes | None = None
    use_raw: bool = False
    subscription_end_topic: ExpressionSource | None = None
    #: the ``wsnmom:DeadLetters`` policy element's text (checked by core), None: absent
    dead_letters: str | None = None
    #: the ``wsnmom:DeliveryPolicy`` element's children as (local name, text), checked by
    #: core (``core.delivery_policy``); None: absent
    delivery_policy: tuple[tuple[str, str], ...] | None = None
    soap_version: SoapVersion = SoapVersion.SOAP12
    wire_version: WireVersion = WireVersion.WSN_13
    #: any SubscriptionPolicy child the broker does not understand (fault if not ignorable)
    unsupported_policy: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RegisterPublisherRequest:
    """RegisterPublisher, after XML parsing."""

    publisher_reference: EndpointReference | None
    topics: tuple[ExpressionSource, ...] = ()
    demand: bool = False
    initial_termination_time: RequestedTime = None


@dataclass(frozen=True, slots=True)
class CreatePullPointRequest:
    """CreatePullPoint, after XML parsing."""

    initial_termination_time: RequestedTime = None
    name: str | None = None


@dataclass(frozen=True, slots=True)
class Delivered:
    """A message handed to a consumer: the notification plus the subscription it matched."""

    message: NotificationMessage
    subscription_id: str
    #: the SubscriptionReference rendered in the wrapped Notify
    subscription_reference: EndpointReference | None = None
