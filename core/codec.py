"""How notifications travel on the middleware: ``NotificationMessage`` <-> ``OutboundMessage``
/ ``Received`` (docs/architecture.md, "Notify: from a publisher to the middleware").

Body
    The payload element (the child of ``wsnt:Message``) as UTF-8 XML, content type
    ``application/xml``.

Headers (``core.adapter.HEADER_*``)
    ``wsnmom-message-id``; ``wsnmom-topic-ns`` and ``wsnmom-topic-path`` (segments joined
    with ``/``; NCNames never contain one); ``wsnmom-topic-dialect`` (the publisher's dialect
    URI); ``wsnmom-producer-ref`` and ``wsnmom-subscription-ref`` (endpoint references as
    compact JSON: ``{"address": ..., "reference_parameters": [base64 XML...], "metadata":
    base64|null}``); ``wsnmom-published-at`` (ISO 8601 UTC); ``wsnmom-request-id``;
    ``wsnmom-via`` (the gateways it was published through, ``core.loops``); the
    publisher's application headers under their own names (``core.app_headers``).  When present,
    the topic headers are authoritative over the native routing topic: messages forwarded
    into a pull point's inbox keep the topic they were published on.

Topicless notifications
    A Notify without ``wsnt:Topic`` is published on the reserved topic :data:`NO_TOPIC`
    (namespace :data:`NO_TOPIC_NAMESPACE`).  Subscriptions without a topic filter bind to
    every topic (``SubscriptionSpec.patterns=None``) and so see topicless notifications;
    subscriptions with a topic filter never do (their patterns are always in a real topic
    namespace, and core re-checks every message).  Clients may not use the reserved
    namespaces in topic expressions (TopicNotSupportedFault).

Pull point inboxes
    A pull point is a durable subscription bound to its private topic
    ``{urn:wsnmom:internal:pull-point}p<id>``; Notify to a pull point and subscriptions
    feeding it publish there.  The namespace is internal (``core.adapter``
    ``INTERNAL_NAMESPACE_PREFIX``), so subscriptions without a topic filter
    (``patterns=None``) do not receive inbox traffic: the adapter contract excludes internal
    namespaces from "everything".  Core still drops an internal message that reaches a
    subscription (by its routing namespace, :func:`is_internal_routing`): a defence for
    adapters that predate the rule and for inbox copies queued under the pre-0.2 inbox
    namespace used before internal namespaces existed, ``urn:wsnmom:pull-point``.

Native messages that are not XML
    A message published natively (no wsnmom headers) whose content type is not XML, or whose
    body does not parse as XML, is wrapped for WS-N consumers in::

        <wsnmom:NativeMessage xmlns:wsnmom="urn:wsnmom:ns:1"
                              contentType="application/json" encoding="text">{"a": 1}</...>

    ``encoding`` is ``text`` (the body was UTF-8 text made of XML characters) or ``base64``.
    MessageContent filters are evaluated over the wrapper element.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Protocol

from lxml import etree
from wsnmom.core.adapter import (
    HEADER_MESSAGE_ID,
    HEADER_PRODUCER_REFERENCE,
    HEADER_PUBLISHED_AT,
    HEADER_TOPIC_DIALECT,
    HEADER_TOPIC_NAMESPACE,
    HEADER_TOPIC_PATH,
    INTERNAL_NAMESPACE_PREFIX,
    OutboundMessage,
    SharedMessage,
    is_internal_namespace,
)
from wsnmom.core.app_headers import from_middleware
from wsnmom.core.model import EndpointReference, NotificationMessage
from wsnmom.core.per_thread import PerThread
from wsnmom.core.safe_xml import hardened_parser
from wsnmom.core.store_documents import epr_from_json, epr_to_json
from wsnmom.topic_mapping.model import Topic

#: namespace of wsnmom's own XML elements (NativeMessage, SubscriptionEnd reason)
WSNMOM_NS = "urn:wsnmom:ns:1"
#: reserved namespace of the topic topicless notifications are published on
NO_TOPIC_NAMESPACE = "urn:wsnmom:no-topic"
#: the reserved topic of topicless notifications
NO_TOPIC = Topic(NO_TOPIC_NAMESPACE, ("NoTopic",))
#: internal namespace of pull point inbox topics
PULL_POINT_NAMESPACE = INTERNAL_NAMESPACE_PREFIX + "pull-point"
#: the inbox namespace before it became internal (copies may still sit in queues)
LEGACY_PULL_POINT_NAMESPACE = "urn:wsnmom:pull-point"
#: namespaces clients may not use (besides every internal one, see ``is_reserved``)
RESERVED_NAMESPACES = frozenset(
    {NO_TOPIC_NAMESPACE, PULL_POINT_NAMESPACE, LEGACY_PULL_POINT_NAMESPACE}
)


def is_reserved(namespace: str) -> bool:
    """True for a namespace clients may not use in topic expressions."""
    return namespace in RESERVED_NAMESPACES or is_internal_namespace(namespace)


class Carried(Protocol):
    """What :func:`decode` reads of a middleware message: ``Received``, ``StoredMessage``
    and the log records of ``adapters.logbase`` all have it."""

    @property
    def topic(self) -> Topic | None: ...
    @property
    def body(self) -> bytes: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    @property
    def content_type(self) -> str: ...


def is_internal_routing(received: Carried) -> bool:
    """True when ``received`` was routed on an internal topic (a pull point inbox), which
    only the subscription bound to that topic may see; see "Pull point inboxes"."""
    return is_internal_topic(received.topic)


def is_internal_topic(topic: Topic | None) -> bool:
    """Whether ``topic`` is an internal routing topic (see :func:`is_internal_routing`)."""
    return topic is not None and (
        is_internal_namespace(topic.namespace) or topic.namespace == LEGACY_PULL_POINT_NAMESPACE
    )


HEADER_SUBSCRIPTION_REFERENCE = "wsnmom-subscription-ref"
#: the gateways a message was published through, space separated (``core.loops``)
HEADER_VIA = "wsnmom-via"
#: what a gateway id may be made of (ids travel space-separated)
GATEWAY_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


def parse_via(text: str) -> tuple[str, ...]:
    """A via list from its text (space-separated ids; malformed ids are left out: they
    cannot be any gateway's)."""
    return tuple(part for part in text.split() if GATEWAY_ID.match(part))


#: the ``X-Request-Id`` of the request that published a message (for logs)
HEADER_REQUEST_ID = "wsnmom-request-id"

XML_CONTENT_TYPES = ("application/xml", "text/xml")

_PARSERS: PerThread[etree.XMLParser] = PerThread(hardened_parser)
_XML_CHARS = re.compile("^[\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]*$")


def safe_parse(data: bytes) -> etree._Element:
    """Parse XML without DTDs, entity expansion, network or file access."""
    return etree.fromstring(data, _PARSERS.get())


def pull_point_inbox(pull_point_id: str) -> Topic:
    """The private topic a pull point's durable subscription is bound to."""
    return Topic(PULL_POINT_NAMESPACE, ("p" + pull_point_id,))


def _epr_header(epr: EndpointReference) -> str:
    return json.dumps(epr_to_json(epr), separators=(",", ":"))


def epr_from_header(text: str | None) -> EndpointReference | None:
    """The endpoint reference of a ``wsnmom-producer-ref`` / ``wsnmom-subscription-ref``
    header (None: absent or unreadable)."""
    if not text:
        return None
    try:
        return epr_from_json(json.loads(text))
    except (ValueError, KeyError, TypeError):
        return None


def encode(message: NotificationMessage, *, route: Topic | None = None) -> OutboundMessage:
    """The middleware message for ``message``.

    It is published on ``route`` when given (pull point inbox), else on its topic, or on
    :data:`NO_TOPIC` when it has none; the topic headers always name the message's own
    topic.

    The headers other than the message id depend only on fields that the messages of one
    Notify share (the same objects: topic, dialect, references, timestamp); they are built
    once and reused while consecutive messages carry the same objects (:data:`_shared`).
    """
    global _shared
    topic = message.topic or NO_TOPIC
    dialect = message.topic_dialect
    producer = message.producer_reference
    subscription = message.subscription_reference
    published_at = message.published_at
    request_id = message.request_id
    via = message.via
    last = _shared
    if (
        last[0] is topic
        and last[1] is dialect
        and last[2] is producer
        and last[3] is subscription
        and last[4] is published_at
        and last[5] is request_id
        and last[6] is via
    ):
        common = last[7]
    else:
        common = _common_headers(topic, dialect, producer, subscription, published_at)
        if request_id is not None:
            common[HEADER_REQUEST_ID] = request_id
        if via:
            common[HEADER_VIA] = " ".join(via)
        _shared = (topic, dialect, producer, subscription, published_at, request_id, via, common)
    headers = {HEADER_MESSAGE_ID: message.message_id, **common}
    if message.headers:
        headers.update(message.headers)
    return OutboundMessage(
        topic=route or topic,
        body=message.payload,
        message_id=message.message_id,
        headers=headers,
        content_type=message.content_type,
    )


def _common_headers(
    topic: Topic,
    dialect: str | None,
    producer: EndpointReference | None,
    subscription: EndpointReference | None,
    published_at: datetime | None,
) -> dict[str, str]:
    """The headers of :func:`encode` after the message id, in their order."""
    headers: dict[str, str] = {
        HEADER_TOPIC_NAMESPACE: topic.namespace,
        HEADER_TOPIC_PATH: "/".join(topic.path),
    }
    if dialect:
        headers[HEADER_TOPIC_DIALECT] = dialect
    if producer is not None:
        headers[HEADER_PRODUCER_REFERENCE] = _epr_header(producer)
    if subscription is not None:
        headers[HEADER_SUBSCRIPTION_REFERENCE] = _epr_header(subscription)
    if published_at is not None:
        headers[HEADER_PUBLISHED_AT] = published_at.isoformat()
    return headers


#: the last (topic, dialect, producer, subscription reference, published_at, request id,
#: via) encoded, by identity, and its common headers (never handed out: each message gets
#: its own dict).  Replaced as a whole, so threads encoding at the same time at worst
#: rebuild it.
_shared: tuple[
    Topic | None,
    str | None,
    EndpointReference | None,
    EndpointReference | None,
    datetime | None,
    str | None,
    tuple[str, ...] | None,
    dict[str, str],
] = (None, None, None, None, None, None, None, {})


def is_xml_type(content_type: str) -> bool:
    """Whether :func:`xml_payload` takes ``content_type`` for XML (empty counts)."""
    if not content_type or content_type == "application/xml":
        return True
    base = content_type.split(";", 1)[0].strip().lower()
    return base in XML_CONTENT_TYPES or base.endswith("+xml")


def wrap_native(body: bytes, content_type: str) -> bytes:
    """The ``wsnmom:NativeMessage`` element for a non-XML body."""
    root = etree.Element(f"{{{WSNMOM_NS}}}NativeMessage", nsmap={"wsnmom": WSNMOM_NS})
    root.set("contentType", content_type or "application/octet-stream")
    try:
        text = body.decode("utf-8")
        if not _XML_CHARS.match(text):
            raise ValueError("not XML characters")
        root.set("encoding", "text")
        root.text = text
    except ValueError:
        root.set("encoding", "base64")
        root.text = base64.b64encode(body).decode("ascii")
    return etree.tostring(root, encoding="UTF-8", xml_declaration=False)


#: per thread, the last body ``xml_payload`` found well-formed.  A fan-out decodes one
#: notification once per subscription, on the few threads that receive them: checking
#: the same bytes again with the parser was most of the cost of a delivery's arrival
#: (docs/performance.md F26); comparing them costs a memcmp.
_WELL_FORMED = threading.local()
#: bodies larger than this are not remembered (a thread would hold one in memory)
_WELL_FORMED_MAX = 64 * 1024


def xml_payload(body: bytes, content_type: str) -> bytes:
    """``body`` when it is an XML element, else its ``NativeMessage`` wrapper."""
    if is_xml_type(content_type):
        if body and body == getattr(_WELL_FORMED, "body", None):
            return body
        try:
            safe_parse(body)
        except etree.XMLSyntaxError:
            pass
        else:
            if type(body) is bytes and len(body) <= _WELL_FORMED_MAX:  # immutable only
                _WELL_FORMED.body = body
            return body
    return wrap_native(body, content_type)


def _topic_from(headers: Mapping[str, str], fallback: Topic | None) -> Topic | None:
    return header_topic(
        headers.get(HEADER_TOPIC_NAMESPACE), headers.get(HEADER_TOPIC_PATH), fallback
    )


def header_topic(ns: str | None, path: str | None, fallback: Topic | None) -> Topic | None:
    """A delivered message's topic: the one its topic headers (``ns``, ``path``) name,
    else ``fallback`` (the topic it was routed on); None for :data:`NO_TOPIC`."""
    topic = fallback
    # usually the routing topic is the one the headers name: no new Topic then
    if (
        ns is not None
        and path
        and (fallback is None or fallback.namespace != ns or "/".join(fallback.path) != path)
    ):
        topic = Topic(ns, tuple(path.split("/")))
    if topic is None or topic.namespace == NO_TOPIC_NAMESPACE:
        return None
    return topic


#: the last ``wsnmom-published-at`` text decoded and its value (the messages of one Notify
#: share it); replaced as a whole, so concurrent decoders at worst parse it again
_last_published: tuple[str, datetime | None] = ("", None)


def _published_at(headers: Mapping[str, str]) -> datetime | None:
    return published_at_from_header(headers.get(HEADER_PUBLISHED_AT))


def published_at_from_header(text: str | None) -> datetime | None:
    """The time of a ``wsnmom-published-at`` header (UTC when it names no zone; None:
    absent or unreadable)."""
    global _last_published
    if not text:
        return None
    last = _last_published
    if last[0] == text:
        return last[1]
    try:
        value: datetime | None = datetime.fromisoformat(text)
    except ValueError:
        value = None
    if value is not None and not value.tzinfo:
        value = value.replace(tzinfo=UTC)
    _last_published = (text, value)
    return value


def decode(received: Carried) -> NotificationMessage:
    """The notification carried by a middleware message (native ones included); decoded
    once for all the copies of a message the adapter shares (``Received.shared``: a
    notification is immutable, and a log record read for many subscriptions was parsed
    once per subscription before)."""
    shared: SharedMessage | None = getattr(received, "shared", None)
    if shared is None:
        return _decode(received)
    message = shared.notification
    if message is None:  # two threads at once may both decode it: the same result
        message = shared.notification = _decode(received)
    return message


def _decode(received: Carried) -> NotificationMessage:
    headers = received.headers
    content_type = received.content_type or "application/xml"
    payload = xml_payload(received.body, content_type)
    return NotificationMessage(
        message_id=headers.get(HEADER_MESSAGE_ID) or uuid.uuid4().hex,
        payload=payload,
        topic=_topic_from(headers, received.topic),
        topic_dialect=headers.get(HEADER_TOPIC_DIALECT) or None,
        producer_reference=epr_from_header(headers.get(HEADER_PRODUCER_REFERENCE)),
        content_type="application/xml",
        published_at=_published_at(headers),
        subscription_reference=epr_from_header(headers.get(HEADER_SUBSCRIPTION_REFERENCE)),
        request_id=headers.get(HEADER_REQUEST_ID),
        via=parse_via(headers.get(HEADER_VIA) or ""),
        headers=from_middleware(headers),
    )
