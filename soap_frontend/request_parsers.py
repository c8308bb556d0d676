"""Request bodies -> core request records (a part of :mod:`.codec`, which re-exports it).

Parsing is strict about what the specifications make mandatory and lenient elsewhere
(unknown ``##other`` extension children are ignored, prefixes never matter, a
TopicExpression without ``Dialect`` is passed on with ``dialect=None``).  Every malformed
body raises the precise ``WsnError`` of the operation, never a bare exception:

==========================  ===============================================================
Subscribe                   SubscribeCreationFailed (no/invalid ConsumerReference),
                            InvalidFilter with ``unknown_filters`` (unknown Filter child or a
                            second expression of one kind), InitialTerminationTime that is
                            empty or not a dateTime/duration → ``initial_termination_time_
                            invalid`` (core answers UnacceptableInitialTerminationTime)
Renew                       TerminationTime missing/invalid → ``invalid=True`` for core
RegisterPublisher           PublisherRegistrationFailed (bad Demand, Demand=true without
                            PublisherReference), UnacceptableInitialTerminationTime
GetCurrentMessage           InvalidTopicExpression (no Topic)
GetMessages                 UnableToGetMessages (MaximumNumber not a non-negative integer)
Get(Multiple)ResourceProp.  InvalidResourcePropertyQName (unresolvable QName)
Notify                      BaseFault (no NotificationMessage, Message without one element)
==========================  ===============================================================

``xsi:nil="true"`` on a termination time means "no scheduled termination" and is passed to
core as :data:`~.wsn_operations.INFINITE` (``datetime.max`` in UTC), so core's usual "later
than allowed" check applies to it.  The ``wsnmom:Hops`` header of a Notify: :func:`apply_hops`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC
from typing import Any, Final

import isodate
from lxml import etree
from wsnmom.core import errors
from wsnmom.core.codec import parse_via
from wsnmom.core.model import (
    CreatePullPointRequest,
    EndpointReference,
    ExpressionSource,
    InboundNotification,
    RegisterPublisherRequest,
    RequestedTime,
    SoapVersion,
    SubscribeRequest,
)

from .envelope import parse_epr
from .faults import BaseFaultError
from .wsn_operations import (
    INFINITE,
    T,
)
from .xml import (
    NATO,
    WSNBR,
    WSNMOM,
    WSNT,
    WSRF_RP,
    children,
    is_nil,
    qname,
    resolve_qname,
    serialize_standalone,
    text_of,
)


# --- small parsers ---------------------------------------------------------------------
def expression(el: etree._Element) -> ExpressionSource:
    """A TopicExpression/QueryExpression element → ExpressionSource with in-scope nsmap."""
    dialect = el.get("Dialect")
    return ExpressionSource(
        dialect.strip() if dialect is not None else None,
        text_of(el),
        dict(el.nsmap),
    )


def parse_time(el: etree._Element, *, allow_duration: bool = True) -> tuple[RequestedTime, bool]:
    """A termination-time element → (value, invalid).

    dateTime (a value without timezone is UTC), xsd:duration (``timedelta`` or
    ``isodate.Duration``), ``xsi:nil`` → :data:`INFINITE`; empty or unparsable → invalid.
    """
    if is_nil(el):
        return INFINITE, False
    text = text_of(el)
    if not text:
        return None, True
    try:
        if text.startswith(("P", "-P")):
            if not allow_duration:
                return None, True
            value: Any = isodate.parse_duration(text)
            return value, False
        parsed = isodate.parse_datetime(text)
    except (isodate.ISO8601Error, ValueError, OverflowError):
        return None, True
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed, False


def _epr_or_fault(el: etree._Element, make: Callable[[str], errors.WsnError]) -> EndpointReference:
    try:
        return parse_epr(el)
    except ValueError as exc:
        raise make(str(exc)) from None


# --- request parsers -------------------------------------------------------------------
def parse_subscribe(body: etree._Element, version: SoapVersion) -> SubscribeRequest:
    """Subscribe body → SubscribeRequest."""
    consumer: EndpointReference | None = None
    topic = message_content = producer_properties = end_topic = None
    filter_xml = policy_xml = dead_letters = None
    delivery_policy: tuple[tuple[str, str], ...] | None = None
    itt: RequestedTime = None
    itt_invalid = False
    use_raw = False
    unsupported: list[str] = []
    for child in children(body):
        tag = child.tag
        if tag == T("ConsumerReference"):
            consumer = _epr_or_fault(child, errors.SubscribeCreationFailed)
        elif tag == T("Filter"):
            filter_xml = serialize_standalone(child)
            topic, message_content, producer_properties = _parse_filter(child)
        elif tag == T("InitialTerminationTime"):
            itt, itt_invalid = parse_time(child)
        elif tag == T("SubscriptionPolicy"):
            policy_xml = serialize_standalone(child)
            for p in children(child):
                if p.tag == T("UseRaw"):
                    use_raw = True
                elif p.tag == qname(NATO, "SubscriptionEndTopic"):
                    end_topic = expression(p)  # lenient placement
                elif p.tag == qname(WSNMOM, "DeadLetters"):
                    dead_letters = text_of(p)  # checked by core
                elif p.tag == qname(WSNMOM, "DeliveryPolicy"):
                    delivery_policy = _delivery_policy(p)  # checked by core
                else:
                    unsupported.append(str(p.tag))
        elif tag == qname(NATO, "SubscriptionEndTopic"):
            end_topic = expression(child)  # NCIA SIP: /wsnt:Subscribe/wsn-nato:...
    if consumer is None:
        raise errors.SubscribeCreationFailed("Subscribe has no wsnt:ConsumerReference")
    return SubscribeRequest(
        consumer=consumer,
        topic=topic,
        message_content=message_content,
        producer_properties=producer_properties,
        filter_xml=filter_xml,
        initial_termination_time=itt,
        initial_termination_time_invalid=itt_invalid,
        policy_xml=policy_xml,
        use_raw=use_raw,
        subscription_end_topic=end_topic,
        dead_letters=dead_letters,
        delivery_policy=delivery_policy,
        soap_version=version,
        unsupported_policy=tuple(unsupported),
    )


def _delivery_policy(el: etree._Element) -> tuple[tuple[str, str], ...]:
    """``wsnmom:DeliveryPolicy``'s children as (local name, text); a child in another
    namespace keeps its ``{ns}name`` (core names it in the fault)."""
    out = []
    for child in children(el):
        q = etree.QName(child)
        name = q.localname if q.namespace == WSNMOM else q.text
        out.append((name, text_of(child)))
    return tuple(out)


def _invalid_filter(description: str, qnames: Iterable[str]) -> errors.InvalidFilter:
    err = errors.InvalidFilter(description)
    err.unknown_filters = tuple(qnames)  # type: ignore[attr-defined]
    return err


def parse_filter(
    el: etree._Element,
) -> tuple[ExpressionSource | None, ExpressionSource | None, ExpressionSource | None]:
    """A ``wsnt:FilterType`` element (Subscribe's, or ONVIF's CreatePullPointSubscription's)
    → its topic, message content and producer properties expressions."""
    return _parse_filter(el)


def _parse_filter(
    el: etree._Element,
) -> tuple[ExpressionSource | None, ExpressionSource | None, ExpressionSource | None]:
    found: dict[str, ExpressionSource] = {}
    unknown: list[str] = []
    duplicate: list[str] = []
    kinds = (T("TopicExpression"), T("MessageContent"), T("ProducerProperties"))
    for child in children(el):
        tag = str(child.tag)
        if tag not in kinds:
            unknown.append(tag)
        elif tag in found:
            duplicate.append(tag)
        else:
            found[tag] = expression(child)
    if unknown:
        raise _invalid_filter("The Filter contains filter elements that are not supported", unknown)
    if duplicate:
        raise _invalid_filter(
            "Only one filter expression of each kind is supported per Filter "
            "(combine topics with the Full dialect's '|')",
            duplicate,
        )
    return found.get(kinds[0]), found.get(kinds[1]), found.get(kinds[2])


_NOTIFICATION_MESSAGE: Final = T("NotificationMessage")
_NM_SUBSCRIPTION_REFERENCE: Final = T("SubscriptionReference")
_NM_TOPIC: Final = T("Topic")
_NM_PRODUCER_REFERENCE: Final = T("ProducerReference")
_NM_MESSAGE: Final = T("Message")


def _notify_topic(el: etree._Element, previous: ExpressionSource | None) -> ExpressionSource:
    """:func:`expression` of a NotificationMessage's Topic; ``previous`` (the topic of an
    earlier message of the same Notify) itself when it is equal, so that one Notify's
    messages on one topic share one record (core resolves it once per Notify)."""
    dialect = el.get("Dialect")
    if dialect is not None:
        dialect = dialect.strip()
    text = text_of(el)
    namespaces = el.nsmap
    if (
        previous is not None
        and previous.text == text
        and previous.dialect == dialect
        and previous.namespaces == namespaces
    ):
        return previous
    return ExpressionSource(dialect, text, dict(namespaces))


def parse_notify(body: etree._Element) -> list[InboundNotification]:
    """Notify body → one InboundNotification per NotificationMessage."""
    out: list[InboundNotification] = []
    last_topic: ExpressionSource | None = None
    for holder in body:
        if holder.tag != _NOTIFICATION_MESSAGE:
            continue  # ##other extension content (comments and PIs have no str tag)
        sub_ref = topic = producer = None
        payload: bytes | None = None
        for part in holder:
            tag = part.tag
            if tag == _NM_SUBSCRIPTION_REFERENCE:
                sub_ref = _epr_or_fault(part, BaseFaultError)
            elif tag == _NM_TOPIC:
                topic = last_topic = _notify_topic(part, last_topic)
            elif tag == _NM_PRODUCER_REFERENCE:
                producer = _epr_or_fault(part, BaseFaultError)
            elif tag == _NM_MESSAGE:
                element = part[0] if len(part) == 1 else None  # the usual shape
                if element is None or not isinstance(element.tag, str):
                    content = children(part)
                    if len(content) != 1:
                        raise BaseFaultError(
                            "wsnt:Message must contain exactly one element "
                            "(the notification payload)"
                        )
                    element = content[0]
                payload = serialize_standalone(element)
        if payload is None:
            raise BaseFaultError("a wsnt:NotificationMessage has no wsnt:Message")
        out.append(InboundNotification(payload, topic, producer, sub_ref))
    if not out:
        raise BaseFaultError("Notify contains no wsnt:NotificationMessage")
    return out


#: the hop marker header block and its per-message entries (``core.loops``)
HOPS = qname(WSNMOM, "Hops")
VIA = qname(WSNMOM, "Via")


def hops_header(vias: Sequence[tuple[str, ...]]) -> etree._Element | None:
    """The ``wsnmom:Hops`` header block for the messages of one outbound Notify (one
    ``wsnmom:Via`` per NotificationMessage, in order, listing the gateways it was
    published through); None when no message has been through a gateway."""
    if not any(vias):
        return None
    hops = etree.Element(HOPS, nsmap={"wsnmom": WSNMOM})
    for via in vias:
        etree.SubElement(hops, VIA).text = " ".join(via)
    return hops


def apply_hops(
    headers: Sequence[etree._Element], messages: list[InboundNotification]
) -> list[InboundNotification]:
    """``messages`` with the via lists of a ``wsnmom:Hops`` header among ``headers``:
    one ``wsnmom:Via`` per NotificationMessage, or one for all of them; a header that
    fits neither is ignored (as are malformed gateway ids)."""
    hops = next((h for h in headers if h.tag == HOPS), None)
    if hops is None:
        return messages
    vias = [parse_via(v.text or "") for v in hops if v.tag == VIA]
    if len(vias) == 1:
        shared = vias[0]  # one object for all: core stamps it once
        return [dataclasses.replace(m, via=shared) for m in messages]
    if len(vias) != len(messages):
        return messages
    return [dataclasses.replace(m, via=v) for m, v in zip(messages, vias, strict=True)]


def parse_register_publisher(body: etree._Element) -> RegisterPublisherRequest:
    """RegisterPublisher body → RegisterPublisherRequest (br-2 children; b-2 tolerated)."""
    publisher: EndpointReference | None = None
    topics: list[ExpressionSource] = []
    demand = False
    itt: RequestedTime = None
    for child in children(body):
        local = _local_in(child, (WSNBR, WSNT))
        if local == "PublisherReference":
            publisher = _epr_or_fault(child, errors.PublisherRegistrationFailed)
        elif local == "Topic":
            topics.append(expression(child))
        elif local == "Demand":
            value = text_of(child).lower()
            if value not in ("true", "false", "1", "0"):
                raise errors.PublisherRegistrationFailed(f"Demand is not a boolean: {value!r}")
            demand = value in ("true", "1")
        elif local == "InitialTerminationTime":
            itt, invalid = parse_time(child)
            if invalid:
                raise errors.UnacceptableInitialTerminationTime(
                    "InitialTerminationTime is not an xsd:dateTime"
                )
    if demand and publisher is None:
        raise errors.PublisherRegistrationFailed(
            "Demand-based publishing requires a PublisherReference"
        )
    return RegisterPublisherRequest(publisher, tuple(topics), demand, itt)


def _local_in(el: etree._Element, namespaces: Sequence[str]) -> str | None:
    tag = str(el.tag)
    for ns in namespaces:
        prefix = "{" + ns + "}"
        if tag.startswith(prefix):
            return tag[len(prefix) :]
    return None


def parse_create_pull_point(body: etree._Element) -> CreatePullPointRequest:
    """CreatePullPoint body (no parameters; CXF's ``wsnt:pullPointQueueName`` attribute)."""
    name = body.get(T("pullPointQueueName")) or body.get("pullPointQueueName")
    itt: RequestedTime = None
    for child in children(body):
        if child.tag == T("InitialTerminationTime"):
            itt, invalid = parse_time(child)
            if invalid:
                raise errors.UnableToCreatePullPoint("InitialTerminationTime is not valid")
    return CreatePullPointRequest(itt, name.strip() if name else None)


def parse_get_messages(body: etree._Element) -> int | None:
    """GetMessages body → MaximumNumber (None when absent)."""
    el = body.find(T("MaximumNumber"))
    if el is None:
        return None
    text = text_of(el)
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0 or not text.lstrip("+").isdigit():
        raise errors.UnableToGetMessages(
            f"MaximumNumber must be a non-negative integer, got {text!r}"
        )
    return value


def parse_renew(body: etree._Element) -> tuple[RequestedTime, bool]:
    """Renew body → (termination time, invalid)."""
    el = body.find(T("TerminationTime"))
    if el is None:
        return None, True
    return parse_time(el)


def parse_get_current_message(body: etree._Element) -> ExpressionSource:
    """GetCurrentMessage body → its Topic expression."""
    el = body.find(T("Topic"))
    if el is None:
        raise errors.InvalidTopicExpression("GetCurrentMessage has no wsnt:Topic")
    return expression(el)


def parse_get_resource_property(body: etree._Element) -> str:
    """GetResourceProperty body → property QName (Clark notation)."""
    return _rp_qname(body)


def parse_get_multiple_resource_properties(body: etree._Element) -> list[str]:
    """GetMultipleResourceProperties body → property QNames."""
    names = [_rp_qname(c) for c in children(body) if c.tag == qname(WSRF_RP, "ResourceProperty")]
    if not names:
        raise errors.InvalidResourcePropertyQName("no wsrf-rp:ResourceProperty given")
    return names


def _rp_qname(el: etree._Element) -> str:
    text = text_of(el)
    resolved = resolve_qname(text, el.nsmap)
    if resolved is None or not resolved.startswith("{"):
        raise errors.InvalidResourcePropertyQName(
            f"{text!r} is not a resolvable resource property QName"
        )
    return resolved
