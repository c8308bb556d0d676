"""WS-N message codec: request bodies → core request records, core results → response XML.

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
core as :data:`INFINITE` (``datetime.max`` in UTC), so core's usual "later than allowed"
check applies to it.

Every EPR the broker issues carries the resource id twice: in the address path and as the
reference parameter ``<wsnmom:ResourceId>`` (so clients that post to the wrong URL but echo
reference parameters still reach the resource).
"""

from __future__ import annotations

import copy
import dataclasses
import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Final, cast

import isodate
from lxml import etree
from wsnmom.core import errors
from wsnmom.core.codec import parse_via
from wsnmom.core.model import (
    CreatePullPointRequest,
    Delivered,
    EndpointReference,
    ExpressionSource,
    InboundNotification,
    NotificationMessage,
    PublisherRegistration,
    PullPoint,
    RegisterPublisherRequest,
    RequestedTime,
    SoapVersion,
    SubscribeRequest,
    Subscription,
    SubscriptionState,
)
from wsnmom.core.ports import BrokerPort, BrokerProperties
from wsnmom.core.redaction import redact_url
from wsnmom.topic_mapping.dialects import ONVIF_CONCRETE_SET, XPATH, canonical_dialect
from wsnmom.topic_mapping.errors import TopicError
from wsnmom.topic_mapping.model import Topic

from .envelope import parse_epr
from .faults import BaseFaultError, xsd_datetime
from .splice import MARKER, MARKER_TAG, Spliced, add_marker
from .xml import (
    NATO,
    PREFIXES,
    WSA,
    WSNBR,
    WSNBRW,
    WSNBW,
    WSNMOM,
    WSNMOM_POLICY,
    WSNT,
    WSRF_RL,
    WSRF_RP,
    WSRF_RPW,
    WSTOP,
    XSI,
    append_serialized,
    children,
    is_nil,
    parse_fragment,
    qname,
    resolve_qname,
    serialize_standalone,
    text_of,
)

#: ONVIF's topic namespace (its clients know it as ``tns1``)
ONVIF_TOPICS: Final = "http://www.onvif.org/ver10/topics"
#: requested "no scheduled termination" (xsi:nil="true")
INFINITE: Final = datetime.max.replace(tzinfo=UTC)

SIMPLE: Final = "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Simple"
CONCRETE: Final = "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Concrete"
FULL: Final = "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Full"


def T(local: str) -> str:
    """QName in the b-2 namespace."""
    return qname(WSNT, local)


def BR(local: str) -> str:
    """QName in the br-2 namespace."""
    return qname(WSNBR, local)


# --- operations and actions ------------------------------------------------------------
class Op(enum.Enum):
    """Operations the frontend dispatches, keyed by the body element QName."""

    NOTIFY = T("Notify")
    SUBSCRIBE = T("Subscribe")
    GET_CURRENT_MESSAGE = T("GetCurrentMessage")
    CREATE_PULL_POINT = T("CreatePullPoint")
    GET_MESSAGES = T("GetMessages")
    DESTROY_PULL_POINT = T("DestroyPullPoint")
    RENEW = T("Renew")
    UNSUBSCRIBE = T("Unsubscribe")
    PAUSE = T("PauseSubscription")
    RESUME = T("ResumeSubscription")
    REGISTER_PUBLISHER = BR("RegisterPublisher")
    DESTROY_REGISTRATION = BR("DestroyRegistration")
    GET_RESOURCE_PROPERTY = qname(WSRF_RP, "GetResourceProperty")
    GET_MULTIPLE_RESOURCE_PROPERTIES = qname(WSRF_RP, "GetMultipleResourceProperties")
    GET_RESOURCE_PROPERTY_DOCUMENT = qname(WSRF_RP, "GetResourcePropertyDocument")
    #: WS-ResourceLifetime immediate termination of a subscription, pull point or
    #: registration (docs/conformance.md: RP-02, PP-03, PRM-02)
    DESTROY = qname(WSRF_RL, "Destroy")

    @property
    def local(self) -> str:
        """Local name of the body element."""
        return self.value.split("}", 1)[1]


OPERATIONS: Final[dict[str, Op]] = {op.value: op for op in Op}

_BW = WSNBW
_BRW = WSNBRW
_RPW = WSRF_RPW

#: (request action, response action); Notify is one-way
ACTIONS: Final[dict[Op, tuple[str, str | None]]] = {
    Op.NOTIFY: (f"{_BW}/NotificationConsumer/Notify", None),
    Op.SUBSCRIBE: (
        f"{_BW}/NotificationProducer/SubscribeRequest",
        f"{_BW}/NotificationProducer/SubscribeResponse",
    ),
    Op.GET_CURRENT_MESSAGE: (
        f"{_BW}/NotificationProducer/GetCurrentMessageRequest",
        f"{_BW}/NotificationProducer/GetCurrentMessageResponse",
    ),
    Op.CREATE_PULL_POINT: (
        f"{_BW}/CreatePullPoint/CreatePullPointRequest",
        f"{_BW}/CreatePullPoint/CreatePullPointResponse",
    ),
    Op.GET_MESSAGES: (
        f"{_BW}/PullPoint/GetMessagesRequest",
        f"{_BW}/PullPoint/GetMessagesResponse",
    ),
    Op.DESTROY_PULL_POINT: (
        f"{_BW}/PullPoint/DestroyPullPointRequest",
        f"{_BW}/PullPoint/DestroyPullPointResponse",
    ),
    Op.RENEW: (
        f"{_BW}/SubscriptionManager/RenewRequest",
        f"{_BW}/SubscriptionManager/RenewResponse",
    ),
    Op.UNSUBSCRIBE: (
        f"{_BW}/SubscriptionManager/UnsubscribeRequest",
        f"{_BW}/SubscriptionManager/UnsubscribeResponse",
    ),
    Op.PAUSE: (
        f"{_BW}/SubscriptionManager/PauseSubscriptionRequest",
        f"{_BW}/SubscriptionManager/PauseSubscriptionResponse",
    ),
    Op.RESUME: (
        f"{_BW}/SubscriptionManager/ResumeSubscriptionRequest",
        f"{_BW}/SubscriptionManager/ResumeSubscriptionResponse",
    ),
    Op.REGISTER_PUBLISHER: (
        f"{_BRW}/RegisterPublisher/RegisterPublisherRequest",
        f"{_BRW}/RegisterPublisher/RegisterPublisherResponse",
    ),
    Op.DESTROY_REGISTRATION: (
        f"{_BRW}/PublisherRegistrationManager/DestroyRegistrationRequest",
        f"{_BRW}/PublisherRegistrationManager/DestroyRegistrationResponse",
    ),
    Op.GET_RESOURCE_PROPERTY: (
        f"{_RPW}/GetResourceProperty/GetResourcePropertyRequest",
        f"{_RPW}/GetResourceProperty/GetResourcePropertyResponse",
    ),
    Op.GET_MULTIPLE_RESOURCE_PROPERTIES: (
        f"{_RPW}/GetMultipleResourceProperties/GetMultipleResourcePropertiesRequest",
        f"{_RPW}/GetMultipleResourceProperties/GetMultipleResourcePropertiesResponse",
    ),
    Op.GET_RESOURCE_PROPERTY_DOCUMENT: (
        f"{_RPW}/GetResourcePropertyDocument/GetResourcePropertyDocumentRequest",
        f"{_RPW}/GetResourcePropertyDocument/GetResourcePropertyDocumentResponse",
    ),
    Op.DESTROY: (
        "http://docs.oasis-open.org/wsrf/rlw-2/ImmediateResourceTermination/DestroyRequest",
        "http://docs.oasis-open.org/wsrf/rlw-2/ImmediateResourceTermination/DestroyResponse",
    ),
}

NOTIFY_ACTION: Final = ACTIONS[Op.NOTIFY][0]


def response_action(op: Op) -> str | None:
    """The wsa:Action of the response to ``op``."""
    return ACTIONS[op][1]


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


# --- resource properties ---------------------------------------------------------------
PropertyRenderer = Callable[[], list[etree._Element]]


def _el(tag: str, text: str | None = None) -> etree._Element:
    return new(tag, text)


def _bool(value: Any) -> str:
    return "true" if value else "false"


def _time_el(tag: str, value: datetime | None) -> etree._Element:
    holder = new(qname(WSNMOM, "_"))
    return add_time(holder, tag, value)


def _expr_el(tag: str, expr: Any) -> etree._Element:
    holder = new(qname(WSNMOM, "_"))
    if isinstance(expr, ExpressionSource):
        return add_expression(holder, tag, expr)
    if isinstance(expr, Topic):
        return add_topic(holder, tag, expr, CONCRETE)
    return add_expression(holder, tag, ExpressionSource(SIMPLE, str(expr), {}))


def _epr_el(tag: str, epr: EndpointReference) -> etree._Element:
    holder = new(qname(WSNMOM, "_"))
    return add_epr(holder, tag, epr)


def _shown_epr_el(tag: str, epr: EndpointReference) -> etree._Element:
    """An EPR shown in a property document: a password in its address is hidden."""
    shown = redact_url(epr.address)
    return _epr_el(tag, epr if shown == epr.address else dataclasses.replace(epr, address=shown))


def _fragment(data: bytes | None) -> list[etree._Element]:
    return [parse_fragment(data)] if data else []


def broker_properties(service: BrokerPort) -> dict[str, PropertyRenderer]:
    """Resource properties of the NotificationBroker (NotificationBrokerRP + policy)."""

    def props() -> BrokerProperties:
        return service.broker_properties()

    return {
        T("TopicExpression"): lambda: [
            _expr_el(T("TopicExpression"), e) for e in props().topic_expressions
        ],
        T("FixedTopicSet"): lambda: [_el(T("FixedTopicSet"), _bool(props().fixed_topic_set))],
        T("TopicExpressionDialect"): lambda: [
            _el(T("TopicExpressionDialect"), d) for d in props().dialects
        ],
        # a copy (a serialised round trip in the default ASCII encoding turned a non-ASCII
        # topic name into a character reference, which no element name may contain)
        qname(WSTOP, "TopicSet"): lambda: [copy.deepcopy(props().topic_set)],
        BR("RequiresRegistration"): lambda: [
            _el(BR("RequiresRegistration"), _bool(props().requires_registration))
        ],
        qname(WSNMOM_POLICY, "BrokerPolicy"): lambda: [policy_element(service.policy())],
    }


def subscription_properties(sub: Subscription, now: datetime) -> dict[str, PropertyRenderer]:
    """Resource properties of a subscription (SubscriptionManagerRP + WSRL times)."""
    return {
        T("ConsumerReference"): lambda: [_shown_epr_el(T("ConsumerReference"), sub.consumer)],
        T("Filter"): lambda: _fragment(sub.filter_xml),
        T("SubscriptionPolicy"): lambda: _fragment(sub.policy_xml),
        T("CreationTime"): lambda: [_time_el(T("CreationTime"), sub.creation_time)],
        T("CurrentTime"): lambda: [_time_el(T("CurrentTime"), now)],
        T("TerminationTime"): lambda: [_time_el(T("TerminationTime"), sub.termination_time)],
        qname(WSRF_RL, "CurrentTime"): lambda: [_time_el(qname(WSRF_RL, "CurrentTime"), now)],
        qname(WSRF_RL, "TerminationTime"): lambda: [
            _time_el(qname(WSRF_RL, "TerminationTime"), sub.termination_time)
        ],
        qname(WSNMOM, "Paused"): lambda: [
            _el(qname(WSNMOM, "Paused"), _bool(sub.state is SubscriptionState.PAUSED))
        ],
        qname(WSNMOM, "MessagesLost"): lambda: [
            _el(qname(WSNMOM, "MessagesLost"), str(sub.messages_lost))
        ],
    }


def registration_properties(
    reg: PublisherRegistration, now: datetime
) -> dict[str, PropertyRenderer]:
    """Resource properties of a publisher registration (PublisherRegistrationRP + WSRL
    times, which WS-N 1.0 §11.1 requires of a registration)."""
    return {
        T("CurrentTime"): lambda: [_time_el(T("CurrentTime"), now)],
        T("TerminationTime"): lambda: [_time_el(T("TerminationTime"), reg.termination_time)],
        qname(WSRF_RL, "CurrentTime"): lambda: [_time_el(qname(WSRF_RL, "CurrentTime"), now)],
        qname(WSRF_RL, "TerminationTime"): lambda: [
            _time_el(qname(WSRF_RL, "TerminationTime"), reg.termination_time)
        ],
        BR("PublisherReference"): lambda: (
            [_shown_epr_el(BR("PublisherReference"), reg.publisher_reference)]
            if reg.publisher_reference
            else []
        ),
        BR("Topic"): lambda: [_expr_el(BR("Topic"), t) for t in reg.topics],
        BR("Demand"): lambda: [_el(BR("Demand"), _bool(reg.demand))],
        BR("CreationTime"): lambda: [_time_el(BR("CreationTime"), reg.creation_time)],
    }


def pull_point_properties(pp: PullPoint, now: datetime) -> dict[str, PropertyRenderer]:
    """Resource properties of a pull point (WSRL-style times, creation time, name)."""
    props: dict[str, PropertyRenderer] = {
        T("CurrentTime"): lambda: [_time_el(T("CurrentTime"), now)],
        T("TerminationTime"): lambda: [_time_el(T("TerminationTime"), pp.termination_time)],
        qname(WSRF_RL, "CurrentTime"): lambda: [_time_el(qname(WSRF_RL, "CurrentTime"), now)],
        qname(WSRF_RL, "TerminationTime"): lambda: [
            _time_el(qname(WSRF_RL, "TerminationTime"), pp.termination_time)
        ],
        qname(WSNMOM, "CreationTime"): lambda: [
            _time_el(qname(WSNMOM, "CreationTime"), pp.creation_time)
        ],
    }
    if pp.name:
        name = pp.name
        props[qname(WSNMOM, "Name")] = lambda: [_el(qname(WSNMOM, "Name"), name)]
    return props


def get_resource_property_response(
    table: Mapping[str, PropertyRenderer], names: Sequence[str], *, multiple: bool = False
) -> etree._Element:
    """GetResourcePropertyResponse / GetMultipleResourcePropertiesResponse."""
    tag = "GetMultipleResourcePropertiesResponse" if multiple else "GetResourcePropertyResponse"
    resp = new(qname(WSRF_RP, tag))
    for name in names:
        renderer = table.get(name)
        if renderer is None:
            raise errors.InvalidResourcePropertyQName(
                f"{name} is not a resource property of this resource"
            )
        for el in renderer():
            resp.append(el)
    return resp


#: members of the standard resource property documents, in schema order (b-2.xsd,
#: br-2.xsd: closed sequences).  Other properties of these resources (WSRL times, the
#: broker policy) are read with GetResourceProperty, not listed in the document, so the
#: document stays schema-valid (docs/conformance.md: BRP-01, PRP-01).
_DOCUMENT_MEMBERS: Final[dict[str, tuple[str, ...]]] = {
    T("SubscriptionManagerRP"): (
        T("ConsumerReference"),
        T("Filter"),
        T("SubscriptionPolicy"),
        T("CreationTime"),
    ),
    BR("NotificationBrokerRP"): (
        T("TopicExpression"),
        T("FixedTopicSet"),
        T("TopicExpressionDialect"),
        qname(WSTOP, "TopicSet"),
        BR("RequiresRegistration"),
    ),
    BR("PublisherRegistrationRP"): (
        BR("PublisherReference"),
        BR("Topic"),
        BR("Demand"),
        BR("CreationTime"),
    ),
}


def resource_property_document(table: Mapping[str, PropertyRenderer], tag: str) -> etree._Element:
    """GetResourcePropertyDocumentResponse wrapping the properties of ``tag`` (its schema
    members in schema order for the standard documents, else every property)."""
    resp = new(qname(WSRF_RP, "GetResourcePropertyDocumentResponse"))
    doc = add(resp, tag)
    members = _DOCUMENT_MEMBERS.get(tag)
    renderers = (
        [table[name] for name in members if name in table] if members else list(table.values())
    )
    for renderer in renderers:
        for el in renderer():
            doc.append(el)
    return resp


# --- policy ----------------------------------------------------------------------------
def _camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


def _policy_value(parent: etree._Element, name: str, value: Any) -> None:
    tag = qname(WSNMOM_POLICY, _camel(name))
    if value is None:
        return
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        child = add(parent, tag)
        for f in dataclasses.fields(value):
            _policy_value(child, f.name, getattr(value, f.name))
        return
    if isinstance(value, Mapping):
        child = add(parent, tag)
        for k, v in value.items():
            _policy_value(child, str(k), v)
        return
    if isinstance(value, list | tuple | set | frozenset):
        for item in value:
            _policy_value(parent, name, item)
        return
    add(parent, tag, _policy_text(value))


def _policy_text(value: Any) -> str:
    if isinstance(value, bool):
        return _bool(value)
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, timedelta):
        return str(isodate.duration_isoformat(value))
    if isinstance(value, datetime):
        return xsd_datetime(value)
    return str(value)


def policy_element(policy: Any) -> etree._Element:
    """Render the broker's policy (a dataclass, mapping or element) as
    ``<wsnmom-policy:BrokerPolicy>`` with one child per field (CamelCase)."""
    if isinstance(policy, etree._Element):
        return policy
    root = etree.Element(qname(WSNMOM_POLICY, "BrokerPolicy"), nsmap={"wsp-b": WSNMOM_POLICY})
    if dataclasses.is_dataclass(policy) and not isinstance(policy, type):
        for f in dataclasses.fields(policy):
            _policy_value(root, f.name, getattr(policy, f.name))
    elif isinstance(policy, Mapping):
        for k, v in policy.items():
            _policy_value(root, str(k), v)
    return root
