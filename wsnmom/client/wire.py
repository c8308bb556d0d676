"""The XML of the client's requests and the reading of the broker's answers.

Request bodies are built with lxml using the SOAP frontend's element helpers (so the
client writes exactly the shapes the OASIS schemas define and the gateway itself writes);
answers are read with the frontend's parsers (``parse_notify``, ``parse_epr``,
``parse_time``), so a notification means the same thing on both sides.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, cast

from lxml import etree

from wsnmom.core.model import EndpointReference, ExpressionSource
from wsnmom.soap_frontend import codec
from wsnmom.soap_frontend.codec import INFINITE, add, add_epr, parse_time
from wsnmom.soap_frontend.envelope import parse_epr
from wsnmom.soap_frontend.message_info import parse_message_headers, parse_messages_header
from wsnmom.soap_frontend.xml import (
    NATO,
    WSA,
    WSNBR,
    WSNT,
    WSRF_RP,
    XSI,
    parse_fragment,
    qname,
)
from wsnmom.topic_mapping.dialects import XPATH

from .model import (
    NO_TERMINATION,
    Message,
    Notification,
    Payload,
    TerminationTime,
    TopicExpression,
    payload_element,
    termination_text,
)

__all__ = [
    "as_epr",
    "child_epr",
    "child_time",
    "notifications",
    "property_names",
    "requested_time",
    "topic_element",
]

T = codec.T
BR = codec.BR

#: the only prefixes declared on a request's operation element: anything more would be in
#: scope for the payloads and topic expressions inside, and travel on with them
_REQUEST_NSMAP: dict[str | None, str] = {"wsnt": WSNT, "wsa": WSA, "wsn-br": WSNBR}


def new(tag: str) -> etree._Element:
    """An operation element declaring only the WS-N and WS-Addressing prefixes."""
    return etree.Element(tag, nsmap=cast(Any, _REQUEST_NSMAP))


def as_epr(value: EndpointReference | str | Any) -> EndpointReference:
    """An endpoint reference from an EPR, an address, or anything with an ``address``."""
    if isinstance(value, EndpointReference):
        return value
    if isinstance(value, str):
        return EndpointReference(value)
    address = getattr(value, "address", None)
    if isinstance(address, str):
        return EndpointReference(address)
    raise TypeError(f"not an endpoint reference or address: {value!r}")


def topic_element(
    parent: etree._Element, tag: str, topic: TopicExpression | str, namespaces: Mapping[str, str]
) -> etree._Element:
    """Append a TopicExpressionType element (``Dialect`` and the prefixes it uses)."""
    expr = TopicExpression.parse(topic, namespaces)
    missing = sorted(p for p in _prefixes(expr.text) if p not in expr.namespaces)
    if missing:
        raise ValueError(
            f"topic expression {expr.text!r} uses undeclared prefix(es) {', '.join(missing)}: "
            "give their namespaces, or write the topic as {namespace-uri}path"
        )
    source = ExpressionSource(expr.effective_dialect, expr.text, cast(Any, expr.namespaces))
    return codec.add_expression(parent, tag, source)


_PREFIX_USE = re.compile(r"(?<![\w.-])([A-Za-z_][\w.-]*):")


def _prefixes(text: str) -> set[str]:
    return set(_PREFIX_USE.findall(text))


def requested_time(parent: etree._Element, tag: str, value: TerminationTime) -> etree._Element:
    """Append a termination-time element (dateTime, duration or ``xsi:nil``)."""
    el = add(parent, tag)
    if value is NO_TERMINATION:
        el.set(qname(XSI, "nil"), "true")
    else:
        el.text = termination_text(cast(datetime | str, value))
    return el


def subscribe_body(
    consumer: EndpointReference,
    topic: TopicExpression | str | None,
    namespaces: Mapping[str, str],
    *,
    message_content: str | None,
    message_content_dialect: str,
    message_content_namespaces: Mapping[str, str],
    producer_properties: str | None,
    initial_termination_time: TerminationTime | None,
    use_raw: bool,
    subscription_end_topic: TopicExpression | str | None,
    policies: Sequence[etree._Element],
) -> etree._Element:
    """A ``wsnt:Subscribe`` element."""
    body = new(T("Subscribe"))
    add_epr(body, T("ConsumerReference"), consumer)
    filter_element(
        body,
        T("Filter"),
        topic,
        namespaces,
        message_content=message_content,
        message_content_dialect=message_content_dialect,
        message_content_namespaces=message_content_namespaces,
        producer_properties=producer_properties,
    )
    if initial_termination_time is not None:
        requested_time(body, T("InitialTerminationTime"), initial_termination_time)
    if use_raw or policies:
        policy = add(body, T("SubscriptionPolicy"))
        if use_raw:
            add(policy, T("UseRaw"))
        for p in policies:
            policy.append(p)
    if subscription_end_topic is not None:
        topic_element(body, qname(NATO, "SubscriptionEndTopic"), subscription_end_topic, namespaces)
    return body


def filter_element(
    parent: etree._Element,
    tag: str,
    topic: TopicExpression | str | None,
    namespaces: Mapping[str, str],
    *,
    message_content: str | None = None,
    message_content_dialect: str = XPATH,
    message_content_namespaces: Mapping[str, str] | None = None,
    producer_properties: str | None = None,
) -> etree._Element | None:
    """Append a ``wsnt:FilterType`` element ``tag`` (WS-N's ``wsnt:Filter``, ONVIF's
    ``tev:Filter``); nothing when there is nothing to filter by."""
    if topic is None and message_content is None and producer_properties is None:
        return None
    filt = add(parent, tag)
    if topic is not None:
        topic_element(filt, T("TopicExpression"), topic, namespaces)
    if producer_properties is not None:
        _query(filt, T("ProducerProperties"), producer_properties, XPATH, {})
    if message_content is not None:
        _query(
            filt,
            T("MessageContent"),
            message_content,
            message_content_dialect,
            message_content_namespaces or {},
        )
    return filt


def _query(
    parent: etree._Element, tag: str, text: str, dialect: str, namespaces: Mapping[str, str]
) -> None:
    el = etree.SubElement(parent, tag, nsmap=cast(Any, dict(namespaces)))
    el.set("Dialect", dialect)
    el.text = text


def notify_body(
    messages: Iterable[Message], namespaces: Mapping[str, str], tag: str = T("Notify")
) -> etree._Element:
    """A ``wsnt:Notify`` with one NotificationMessage per message."""
    body = new(tag)
    for message in messages:
        holder = add(body, T("NotificationMessage"))
        if message.topic is not None:
            topic_element(holder, T("Topic"), message.topic, namespaces)
        if message.producer is not None:
            add_epr(holder, T("ProducerReference"), as_epr(message.producer))
        add(holder, T("Message")).append(_payload_copy(message.payload))
    if len(body) == 0:
        raise ValueError("Notify needs at least one message")
    return body


def _payload_copy(payload: Payload) -> etree._Element:
    el = payload_element(payload)
    # appending moves an element: never take it out of the caller's document
    return copy.deepcopy(el) if isinstance(payload, etree._Element) else el


def register_publisher_body(
    publisher: EndpointReference | None,
    topics: Sequence[TopicExpression | str],
    namespaces: Mapping[str, str],
    demand: bool,
    initial_termination_time: TerminationTime | None,
) -> etree._Element:
    """A ``wsn-br:RegisterPublisher`` element."""
    body = new(BR("RegisterPublisher"))
    if publisher is not None:
        add_epr(body, BR("PublisherReference"), publisher)
    for topic in topics:
        topic_element(body, BR("Topic"), topic, namespaces)
    add(body, BR("Demand"), "true" if demand else "false")
    if initial_termination_time is not None:
        requested_time(body, BR("InitialTerminationTime"), initial_termination_time)
    return body


def property_names(parent: etree._Element, tag: str, names: Sequence[str]) -> etree._Element:
    """Append one QName-valued element per property name (Clark notation ``{ns}local``)."""
    for name in names:
        ns, local = name[1:].split("}", 1) if name.startswith("{") else ("", name)
        el = etree.SubElement(parent, tag, nsmap=cast(Any, {"p": ns} if ns else {}))
        el.text = f"p:{local}" if ns else local
    return parent


def get_resource_property_body(name: str) -> etree._Element:
    """``wsrf-rp:GetResourceProperty`` asking for ``name`` (Clark notation)."""
    ns, local = name[1:].split("}", 1)
    el = etree.Element(qname(WSRF_RP, "GetResourceProperty"), nsmap={"wsrf-rp": WSRF_RP, "p": ns})
    el.text = f"p:{local}"
    return el


def get_multiple_resource_properties_body(names: Sequence[str]) -> etree._Element:
    """``wsrf-rp:GetMultipleResourceProperties`` asking for ``names``."""
    body = etree.Element(
        qname(WSRF_RP, "GetMultipleResourceProperties"), nsmap={"wsrf-rp": WSRF_RP}
    )
    return property_names(body, qname(WSRF_RP, "ResourceProperty"), names)


# --- answers -----------------------------------------------------------------------------
def child_epr(el: etree._Element | None, tag: str) -> EndpointReference | None:
    """The endpoint reference in the child ``tag`` of ``el``, if any."""
    child = el.find(tag) if el is not None else None
    if child is None:
        return None
    try:
        return parse_epr(child)
    except ValueError:
        return None


def child_time(el: etree._Element | None, tag: str) -> datetime | None:
    """The dateTime in the child ``tag`` of ``el``; None when absent, nil or not a time."""
    child = el.find(tag) if el is not None else None
    if child is None:
        return None
    value, invalid = parse_time(child, allow_duration=False)
    if invalid or not isinstance(value, datetime) or value >= INFINITE:
        return None
    return value


def notifications(holder: etree._Element, *, allow_empty: bool = True) -> list[Notification]:
    """The ``wsnt:NotificationMessage`` children of ``holder`` (a Notify or a
    GetMessagesResponse) as notifications; a malformed one (or none, unless
    ``allow_empty``) raises the frontend's BaseFaultError."""
    if allow_empty and holder.find(T("NotificationMessage")) is None:
        return []
    return [
        Notification(
            payload=parse_fragment(item.payload),
            topic=TopicExpression.from_source(item.topic) if item.topic is not None else None,
            subscription_reference=item.subscription_reference,
            producer_reference=item.producer_reference,
        )
        for item in codec.parse_notify(holder)
    ]


def soap_headers(answer: etree._Element) -> list[etree._Element]:
    """The SOAP header blocks of the envelope that holds the Body element ``answer``."""
    body = answer.getparent()
    envelope = body.getparent() if body is not None else None
    header = envelope.find("{*}Header") if envelope is not None else None
    return list(header) if header is not None else []


def apply_message_info(received: Sequence[Notification], headers: Sequence[etree._Element]) -> None:
    """Fill each notification's message id, publication time and application headers from
    a wsnmom gateway's ``wsnmom:Messages`` block among ``headers`` (left as they are when
    there is none, or it does not fit)."""
    stamps = parse_messages_header(headers, len(received))
    extras = parse_message_headers(headers, len(received))
    for notification, (message_id, published), extra in zip(received, stamps, extras, strict=True):
        if message_id is not None:
            notification.message_id = message_id
            notification.published = published
        if extra:
            notification.app_headers = dict(extra)
