"""Core results -> response XML (a part of :mod:`.codec`, which re-exports it): the
element builders, EPRs (every EPR the broker issues carries the resource id twice: in the
address path and as the reference parameter ``<wsnmom:ResourceId>``, so clients that post
to the wrong URL but echo reference parameters still reach the resource), topics,
NotificationMessages spliced from cached frames, and the responses of each operation.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, cast

from lxml import etree
from wsnmom.core.model import (
    Delivered,
    EndpointReference,
    ExpressionSource,
    NotificationMessage,
    PublisherRegistration,
    PullPoint,
    Subscription,
)
from wsnmom.topic_mapping.dialects import ONVIF_CONCRETE_SET, XPATH, canonical_dialect
from wsnmom.topic_mapping.errors import TopicError
from wsnmom.topic_mapping.model import Topic

from .faults import xsd_datetime
from .splice import MARKER, MARKER_TAG, Spliced, add_marker
from .wsn_operations import (
    BR,
    CONCRETE,
    FULL,
    INFINITE,
    ONVIF_TOPICS,
    SIMPLE,
    T,
)
from .xml import (
    PREFIXES,
    WSA,
    WSNMOM,
    WSRF_RL,
    XSI,
    append_serialized,
    parse_fragment,
    qname,
)

# --- builders --------------------------------------------------------------------------
#: an element declaring the standard prefixes: copying it and renaming the copy is a
#: quarter of the cost of building the namespace declarations again (same bytes)
_NEW_TEMPLATE = etree.Element(qname(WSNMOM, "template"), nsmap=dict(PREFIXES))


def new(tag: str, text: str | None = None) -> etree._Element:
    """A response element with the standard prefixes declared."""
    el = copy.copy(_NEW_TEMPLATE)
    el.tag = tag
    if text is not None:
        el.text = text
    return el


def add(parent: etree._Element, tag: str, text: str | None = None) -> etree._Element:
    """Append a child element."""
    el = etree.SubElement(parent, tag)
    if text is not None:
        el.text = text
    return el


def resource_epr(address: str, resource_id: str) -> EndpointReference:
    """EPR the broker issues: id in the address and as ``wsnmom:ResourceId`` parameter."""
    param = etree.Element(qname(WSNMOM, "ResourceId"), nsmap={"wsnmom": WSNMOM})
    param.text = resource_id
    return EndpointReference(address, (etree.tostring(param),))


def add_epr(parent: etree._Element, tag: str, epr: EndpointReference) -> etree._Element:
    """Append an EndpointReferenceType element."""
    el = add(parent, tag)
    add(el, qname(WSA, "Address"), epr.address)
    if epr.reference_parameters:
        append_serialized(add(el, qname(WSA, "ReferenceParameters")), epr.reference_parameters)
    if epr.metadata:
        meta = parse_fragment(epr.metadata)
        if meta.tag == qname(WSA, "Metadata"):
            el.append(meta)
    return el


def add_time(parent: etree._Element, tag: str, value: datetime | None) -> etree._Element:
    """Append a (nillable) dateTime element; None → ``xsi:nil="true"``."""
    el = add(parent, tag)
    if value is None or value >= INFINITE:
        el.set(qname(XSI, "nil"), "true")
    else:
        el.text = xsd_datetime(value)
    return el


def add_expression(parent: etree._Element, tag: str, expr: ExpressionSource) -> etree._Element:
    """Append a TopicExpressionType element with the namespaces its text needs."""
    nsmap = {p: u for p, u in expr.namespaces.items() if u}
    el = etree.SubElement(parent, tag, nsmap=cast(Any, nsmap))
    el.set("Dialect", expr.dialect or SIMPLE)
    el.text = expr.text
    return el


def topic_dialect_for(topic: Topic, hint: str | None) -> str:
    """The Dialect a concrete topic's ``prefix:path`` text is sent with: ``hint`` (core's
    choice, as the subscriber wrote it: BN §3.1) when that dialect can name the topic with
    this text -- Concrete, Full, XPath (a relative path over the topic set), ONVIF
    ConcreteSet, their older URIs, and Simple for a root topic -- else Simple for a root
    topic and Concrete for a deeper one."""
    if hint is not None:
        try:
            canonical: str | None = canonical_dialect(hint)
        except TopicError:
            canonical = None
        if canonical in _NAMES_ANY_TOPIC or (canonical == SIMPLE and len(topic.path) == 1):
            return hint
    return SIMPLE if len(topic.path) == 1 else CONCRETE


#: dialects in which ``prefix:a/b`` names exactly the topic ``a/b``
_NAMES_ANY_TOPIC = frozenset((CONCRETE, FULL, XPATH, ONVIF_CONCRETE_SET))


def add_topic(
    parent: etree._Element, tag: str, topic: Topic, dialect_hint: str | None = None
) -> etree._Element:
    """Append a ``Topic`` element naming a concrete topic, declaring its prefix on itself."""
    dialect = topic_dialect_for(topic, dialect_hint)
    path = "/".join(topic.path)
    if topic.namespace:
        # ONVIF's topics under the prefix its clients match (``tns1:RuleEngine/...``)
        prefix = "tns1" if topic.namespace == ONVIF_TOPICS else "tns"
        el = etree.SubElement(parent, tag, nsmap={prefix: topic.namespace})
        if el.nsmap.get(prefix) != topic.namespace:  # pragma: no cover - defensive
            prefix = next(p for p, u in el.nsmap.items() if u == topic.namespace and p)
        el.text = f"{prefix}:{path}"
    else:
        el = etree.SubElement(parent, tag)
        el.text = path
    el.set("Dialect", dialect)
    return el


def payload_element(message: NotificationMessage) -> etree._Element:
    """The payload as an element; non-XML native content is wrapped in core's
    ``wsnmom:NativeMessage contentType=… encoding="text"|"base64"``."""
    from wsnmom.core.codec import is_xml_type, xml_payload

    if is_xml_type(message.content_type):
        # what xml_payload returns for XML that parses as a fragment (anything
        # parse_fragment accepts safe_parse accepts too): parse it once, not twice
        try:
            return parse_fragment(message.payload)
        except ValueError:
            pass
    data = xml_payload(message.payload, message.content_type)
    try:
        return parse_fragment(data)
    except ValueError:
        wrapped = xml_payload(message.payload, "application/octet-stream")
        return parse_fragment(wrapped)


def payload_xml(message: NotificationMessage) -> bytes:
    """The payload as it is written inside ``wsnt:Message``: the stored bytes themselves
    when they are a bare UTF-8 element, else :func:`payload_element` serialised.

    An XML payload is a well-formed document by the time it is a ``NotificationMessage``
    (the frontend serialised it, or ``core.codec.decode`` checked it).  One that starts with
    its root element has no XML declaration (so it is UTF-8), no DOCTYPE and no leading
    comment, and its prefixes are declared on itself: its bytes can stand inside any element
    that declares no default namespace.  Anything else takes the parse and serialise path.
    """
    from wsnmom.core.codec import is_xml_type

    payload = message.payload
    if (
        payload[:1] == b"<"
        and payload[1:2] not in (b"?", b"!", b"")
        and is_xml_type(message.content_type)
    ):
        return payload
    return bytes(etree.tostring(payload_element(message), encoding="utf-8"))


def _add_message_frame(
    parent: etree._Element,
    message: NotificationMessage,
    subscription_reference: EndpointReference | None,
) -> etree._Element:
    """Append a ``wsnt:NotificationMessage`` without its payload; returns its
    ``wsnt:Message``."""
    holder = add(parent, T("NotificationMessage"))
    if subscription_reference is not None:
        add_epr(holder, T("SubscriptionReference"), subscription_reference)
    if message.topic is not None:
        add_topic(holder, T("Topic"), message.topic, message.topic_dialect)
    if message.producer_reference is not None:
        add_epr(holder, T("ProducerReference"), message.producer_reference)
    return add(holder, T("Message"))


_FrameKey = tuple[EndpointReference | None, Topic | None, str | None, EndpointReference | None]
#: serialised NotificationMessage frames (before and after the payload) by what they hold
_frames: dict[_FrameKey, tuple[bytes, bytes]] = {}
_FRAMES_MAX = 4096


def _message_frame(
    message: NotificationMessage, subscription_reference: EndpointReference | None
) -> tuple[bytes, bytes]:
    """The bytes of a ``wsnt:NotificationMessage`` before and after its payload, as they
    are serialised inside an element made by :func:`new` (which declares the standard
    prefixes, as every response and Notify element does).

    The frame depends only on the subscription reference, the topic, its dialect and the
    producer reference, which most messages of a subscription share, so frames are kept
    (up to :data:`_FRAMES_MAX`, then the table starts afresh).
    """
    key = (
        subscription_reference,
        message.topic,
        message.topic_dialect,
        message.producer_reference,
    )
    frame = _frames.get(key)
    if frame is None:
        container = new(qname(WSNMOM, "frame"))
        add_marker(_add_message_frame(container, message, subscription_reference))
        data = etree.tostring(container, encoding="utf-8")
        inner = data[data.index(b">") + 1 : data.rindex(b"</")]
        head, _, tail = inner.partition(MARKER)
        frame = (head, tail)
        if len(_frames) >= _FRAMES_MAX:
            _frames.clear()
        _frames[key] = frame
    return frame


def notification_messages_xml(
    items: Iterable[tuple[NotificationMessage, EndpointReference | None]],
) -> bytes:
    """``wsnt:NotificationMessage`` elements, serialised for a :func:`new` container, with
    their payloads copied in as bytes (:func:`payload_xml`)."""
    parts: list[bytes] = []
    for message, subscription_reference in items:
        head, tail = _message_frame(message, subscription_reference)
        parts += (head, payload_xml(message), tail)
    return b"".join(parts)


def _spliced(tag: str, content: bytes) -> Spliced:
    el = new(tag)
    add_marker(el)
    return Spliced(el, content)


def notify_element(deliveries: Sequence[Delivered]) -> Spliced:
    """A wrapped ``wsnt:Notify`` holding every delivery."""
    return _spliced(
        T("Notify"),
        notification_messages_xml((d.message, d.subscription_reference) for d in deliveries),
    )


def raw_payload(message: NotificationMessage) -> Spliced:
    """The payload alone as a SOAP body (raw delivery, UseRaw)."""
    return Spliced(etree.Element(MARKER_TAG), payload_xml(message))


def subscribe_response(sub: Subscription, address: str, now: datetime) -> etree._Element:
    """SubscribeResponse: SubscriptionReference, CurrentTime, TerminationTime."""
    resp = new(T("SubscribeResponse"))
    add_epr(resp, T("SubscriptionReference"), resource_epr(address, sub.id))
    add_time(resp, T("CurrentTime"), now)
    add_time(resp, T("TerminationTime"), sub.termination_time)
    return resp


def renew_response(sub: Subscription | PublisherRegistration, now: datetime) -> etree._Element:
    """RenewResponse: TerminationTime (required), CurrentTime (also the answer to a WS-N 1.0
    SetTerminationTime of a registration, translated back)."""
    resp = new(T("RenewResponse"))
    add_time(resp, T("TerminationTime"), sub.termination_time)
    add_time(resp, T("CurrentTime"), now)
    return resp


def empty_response(tag: str) -> etree._Element:
    """A response element without content (Unsubscribe, Pause, Resume, Destroy...)."""
    return new(tag)


def get_messages_response(messages: Iterable[NotificationMessage]) -> Spliced:
    """GetMessagesResponse with each message as a NotificationMessage, exactly as it was
    accumulated (GM-07): with the SubscriptionReference of the subscription that fed it
    into the pull point, when it came through one."""
    return _spliced(
        T("GetMessagesResponse"),
        notification_messages_xml((m, m.subscription_reference) for m in messages),
    )


def get_current_message_response(message: NotificationMessage) -> Spliced:
    """GetCurrentMessageResponse holding the raw payload element."""
    return _spliced(T("GetCurrentMessageResponse"), payload_xml(message))


def create_pull_point_response(
    pp: PullPoint, address: str, now: datetime | None = None
) -> etree._Element:
    """CreatePullPointResponse with the PullPoint EPR and, when ``now`` is given, the
    granted lifetime as ``wsrf-rl:CurrentTime`` and ``wsrf-rl:TerminationTime`` in the
    response's ``##other`` extension (b-2 has no wsnt elements for it; clients such as
    ONVIF ones expect the lifetime to be reported)."""
    resp = new(T("CreatePullPointResponse"))
    add_epr(resp, T("PullPoint"), resource_epr(address, pp.id))
    if now is not None:
        add_time(resp, qname(WSRF_RL, "CurrentTime"), now)
        add_time(resp, qname(WSRF_RL, "TerminationTime"), pp.termination_time)
    return resp


def register_publisher_response(
    reg: PublisherRegistration, address: str, consumer_address: str
) -> etree._Element:
    """RegisterPublisherResponse: PublisherRegistrationReference and ConsumerReference."""
    resp = new(BR("RegisterPublisherResponse"))
    add_epr(resp, BR("PublisherRegistrationReference"), resource_epr(address, reg.id))
    add_epr(resp, BR("ConsumerReference"), EndpointReference(consumer_address))
    return resp
