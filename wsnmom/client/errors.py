"""Exceptions of the WS-N client: transport failures and SOAP faults.

Every SOAP fault a broker answers becomes a :class:`SoapFault`.  When its detail carries a
WS-BaseFaults element (every WS-N and WS-RF fault does), the exception is the subclass named
after that element -- ``ResourceUnknownFault``, ``InvalidFilterFault``,
``UnacceptableTerminationTimeFault`` ... -- carrying the fault name, its namespace and the
``wsrf-bf:Description`` text.  Catch :class:`WsnFault` for any of them, or the specific class.

HTTP-level trouble (connection refused, timeouts, an answer that is not a SOAP envelope)
raises :class:`TransportError`.
"""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar, Final

from lxml import etree

from wsnmom.soap_frontend.codec import parse_time
from wsnmom.soap_frontend.xml import (
    SOAP11,
    SOAP12,
    WSNBR,
    WSNT,
    WSRF_BF,
    WSRF_R,
    WSRF_RP,
    XmlRejected,
    children,
    parse_xml,
    qname,
    resolve_qname,
    text_of,
)

__all__ = [
    "ALL_FAULT_CLASSES",
    "ClientError",
    "InvalidFilterFault",
    "InvalidMessageContentExpressionFault",
    "InvalidProducerPropertiesExpressionFault",
    "InvalidResourcePropertyQNameFault",
    "InvalidTopicExpressionFault",
    "MultipleTopicsSpecifiedFault",
    "NoCurrentMessageOnTopicFault",
    "NotifyMessageNotSupportedFault",
    "PauseFailedFault",
    "PublisherRegistrationFailedFault",
    "PublisherRegistrationRejectedFault",
    "ResourceNotDestroyedFault",
    "ResourceUnavailableFault",
    "ResourceUnknownFault",
    "ResumeFailedFault",
    "SoapFault",
    "SubscribeCreationFailedFault",
    "TerminationTimeFault",
    "TopicExpressionDialectUnknownFault",
    "TopicNotSupportedFault",
    "TransportError",
    "UnableToCreatePullPointFault",
    "UnableToDestroyPullPointFault",
    "UnableToDestroySubscriptionFault",
    "UnableToGetMessagesFault",
    "UnacceptableInitialTerminationTimeFault",
    "UnacceptableTerminationTimeFault",
    "UnrecognizedPolicyRequestFault",
    "UnsupportedPolicyRequestFault",
    "WsnFault",
    "fault_from_envelope",
]


class ClientError(Exception):
    """Base class of everything the client raises."""


class TransportError(ClientError):
    """The broker could not be reached, or did not answer with SOAP."""

    def __init__(self, message: str, *, status: int | None = None, body: bytes = b"") -> None:
        super().__init__(message)
        #: HTTP status of the answer (None: no answer at all)
        self.status = status
        #: the first bytes of the answer's body
        self.body = body[:2000]


class SoapFault(ClientError):
    """A SOAP fault answered by the broker."""

    def __init__(
        self,
        reason: str,
        *,
        code: str = "",
        detail: etree._Element | None = None,
        status: int = 500,
    ) -> None:
        super().__init__(reason)
        #: the fault's reason text (SOAP 1.1 ``faultstring``, 1.2 ``Reason/Text``)
        self.reason = reason
        #: the fault code's local name: ``Sender``/``Receiver`` (1.2), ``Client``/``Server``
        self.code = code
        #: the first element of the fault's detail, when there is one
        self.detail = detail
        #: HTTP status of the answer
        self.status = status


class AuthenticationFailed(SoapFault):
    """The broker refused the request's credentials, or wanted some (HTTP 401,
    ``wsse:FailedAuthentication``): give ``WsnClient`` a user and password or a token."""


class WsnFault(SoapFault):
    """A SOAP fault whose detail is a WS-BaseFaults fault element.

    Subclasses are named after the fault element (``ResourceUnknownFault`` ...); a fault the
    client does not know is raised as ``WsnFault`` itself with ``fault_name`` set from the
    element."""

    #: namespace of the fault element this class stands for
    namespace: ClassVar[str] = WSRF_BF
    #: local name of the fault element this class stands for
    fault_name: ClassVar[str] = "BaseFault"

    def __init__(
        self,
        reason: str,
        *,
        code: str = "",
        detail: etree._Element | None = None,
        status: int = 500,
        description: str | None = None,
    ) -> None:
        super().__init__(reason, code=code, detail=detail, status=status)
        #: the ``wsrf-bf:Description`` text(s) of the fault element, else the reason
        self.description = description if description is not None else reason
        #: Clark name of the fault element received (``{namespace}fault_name``)
        self.element_name = detail.tag if detail is not None else qname(self.namespace, "")
        self.timestamp: datetime | None = _time_child(detail, WSRF_BF, "Timestamp")

    @property
    def name(self) -> str:
        """Local name of the fault element received."""
        return etree.QName(self.element_name).localname or self.fault_name

    def __str__(self) -> str:
        return f"{self.name}: {self.description}"


class TerminationTimeFault(WsnFault):
    """Base of the two refused-termination-time faults: they state the acceptable range."""

    @property
    def minimum_time(self) -> datetime | None:
        """``wsnt:MinimumTime`` of the fault: the earliest acceptable termination time."""
        return _time_child(self.detail, WSNT, "MinimumTime")

    @property
    def maximum_time(self) -> datetime | None:
        """``wsnt:MaximumTime`` of the fault: the latest acceptable termination time."""
        return _time_child(self.detail, WSNT, "MaximumTime")


def _time_child(detail: etree._Element | None, ns: str, local: str) -> datetime | None:
    if detail is None:
        return None
    el = detail.find(qname(ns, local))
    if el is None:
        return None
    value, invalid = parse_time(el, allow_duration=False)
    return value if isinstance(value, datetime) and not invalid else None


def _qnames(detail: etree._Element | None, ns: str, local: str) -> tuple[str, ...]:
    if detail is None:
        return ()
    out = []
    for el in detail.findall(qname(ns, local)):
        resolved = resolve_qname(text_of(el), el.nsmap)
        if resolved:
            out.append(resolved)
    return tuple(out)


# --- WS-RF faults (r-2, rp-2) --------------------------------------------------------------
class ResourceUnknownFault(WsnFault):
    """The subscription, pull point or registration addressed does not exist (any more)."""

    namespace = WSRF_R
    fault_name = "ResourceUnknownFault"


class ResourceUnavailableFault(WsnFault):
    """The resource exists but cannot answer now."""

    namespace = WSRF_R
    fault_name = "ResourceUnavailableFault"


class InvalidResourcePropertyQNameFault(WsnFault):
    """The resource has no property of the name asked for."""

    namespace = WSRF_RP
    fault_name = "InvalidResourcePropertyQNameFault"


# --- WS-BaseNotification faults (b-2) ------------------------------------------------------
class SubscribeCreationFailedFault(WsnFault):
    """Subscribe failed for a reason no other fault names."""

    namespace = WSNT
    fault_name = "SubscribeCreationFailedFault"


class InvalidFilterFault(WsnFault):
    """The Filter holds a filter element the broker does not support."""

    namespace = WSNT
    fault_name = "InvalidFilterFault"

    @property
    def unknown_filters(self) -> tuple[str, ...]:
        """Clark names of the filter elements the broker refused."""
        return _qnames(self.detail, WSNT, "UnknownFilter")


class TopicExpressionDialectUnknownFault(WsnFault):
    """The topic expression's Dialect is not supported."""

    namespace = WSNT
    fault_name = "TopicExpressionDialectUnknownFault"


class InvalidTopicExpressionFault(WsnFault):
    """The topic expression is malformed."""

    namespace = WSNT
    fault_name = "InvalidTopicExpressionFault"


class TopicNotSupportedFault(WsnFault):
    """The topic is not in the broker's (fixed) topic set, or cannot be carried."""

    namespace = WSNT
    fault_name = "TopicNotSupportedFault"


class MultipleTopicsSpecifiedFault(WsnFault):
    """A concrete topic was needed and the expression names several."""

    namespace = WSNT
    fault_name = "MultipleTopicsSpecifiedFault"


class InvalidProducerPropertiesExpressionFault(WsnFault):
    """The ProducerProperties filter is not acceptable."""

    namespace = WSNT
    fault_name = "InvalidProducerPropertiesExpressionFault"


class InvalidMessageContentExpressionFault(WsnFault):
    """The MessageContent filter is malformed or its dialect unknown."""

    namespace = WSNT
    fault_name = "InvalidMessageContentExpressionFault"


class UnrecognizedPolicyRequestFault(WsnFault):
    """A SubscriptionPolicy element the broker does not know."""

    namespace = WSNT
    fault_name = "UnrecognizedPolicyRequestFault"

    @property
    def policies(self) -> tuple[str, ...]:
        """Clark names of the policies refused."""
        return _qnames(self.detail, WSNT, "UnrecognizedPolicy")


class UnsupportedPolicyRequestFault(WsnFault):
    """A SubscriptionPolicy element the broker knows but does not support."""

    namespace = WSNT
    fault_name = "UnsupportedPolicyRequestFault"

    @property
    def policies(self) -> tuple[str, ...]:
        """Clark names of the policies refused."""
        return _qnames(self.detail, WSNT, "UnsupportedPolicy")


class NotifyMessageNotSupportedFault(WsnFault):
    """The broker cannot deliver wrapped Notify messages to this consumer."""

    namespace = WSNT
    fault_name = "NotifyMessageNotSupportedFault"


class UnacceptableInitialTerminationTimeFault(TerminationTimeFault):
    """The InitialTerminationTime is in the past, malformed or too far away."""

    namespace = WSNT
    fault_name = "UnacceptableInitialTerminationTimeFault"


class UnacceptableTerminationTimeFault(TerminationTimeFault):
    """The TerminationTime of a Renew is not acceptable."""

    namespace = WSNT
    fault_name = "UnacceptableTerminationTimeFault"


class NoCurrentMessageOnTopicFault(WsnFault):
    """GetCurrentMessage: nothing was published on the topic yet."""

    namespace = WSNT
    fault_name = "NoCurrentMessageOnTopicFault"


class UnableToGetMessagesFault(WsnFault):
    """GetMessages failed (for example a negative MaximumNumber)."""

    namespace = WSNT
    fault_name = "UnableToGetMessagesFault"


class UnableToDestroyPullPointFault(WsnFault):
    """DestroyPullPoint failed."""

    namespace = WSNT
    fault_name = "UnableToDestroyPullPointFault"


class UnableToCreatePullPointFault(WsnFault):
    """CreatePullPoint failed."""

    namespace = WSNT
    fault_name = "UnableToCreatePullPointFault"


class UnableToDestroySubscriptionFault(WsnFault):
    """Unsubscribe failed."""

    namespace = WSNT
    fault_name = "UnableToDestroySubscriptionFault"


class PauseFailedFault(WsnFault):
    """PauseSubscription failed."""

    namespace = WSNT
    fault_name = "PauseFailedFault"


class ResumeFailedFault(WsnFault):
    """ResumeSubscription failed."""

    namespace = WSNT
    fault_name = "ResumeFailedFault"


# --- WS-BrokeredNotification faults (br-2) -------------------------------------------------
class PublisherRegistrationRejectedFault(WsnFault):
    """The broker refused the publisher registration."""

    namespace = WSNBR
    fault_name = "PublisherRegistrationRejectedFault"


class PublisherRegistrationFailedFault(WsnFault):
    """RegisterPublisher failed (for example Demand without a PublisherReference)."""

    namespace = WSNBR
    fault_name = "PublisherRegistrationFailedFault"


class ResourceNotDestroyedFault(WsnFault):
    """DestroyRegistration failed."""

    namespace = WSNBR
    fault_name = "ResourceNotDestroyedFault"


def _fault_classes() -> dict[str, type[WsnFault]]:
    found: dict[str, type[WsnFault]] = {qname(WSRF_BF, "BaseFault"): WsnFault}
    pending: list[type[WsnFault]] = [WsnFault]
    while pending:
        for cls in pending.pop().__subclasses__():
            if "fault_name" in vars(cls):
                found[qname(cls.namespace, cls.fault_name)] = cls
            pending.append(cls)
    return found


#: every fault class by the Clark name of its fault element
ALL_FAULT_CLASSES: Final[dict[str, type[WsnFault]]] = _fault_classes()


def fault_from_envelope(data: bytes, status: int) -> SoapFault | None:
    """The exception for a SOAP fault envelope, or None when ``data`` holds no Fault."""
    try:
        env = parse_xml(data)
    except XmlRejected:
        return None
    ns = etree.QName(env).namespace
    if ns not in (SOAP11, SOAP12) or etree.QName(env).localname != "Envelope":
        return None
    body = env.find(qname(ns, "Body"))
    fault = body.find(qname(ns, "Fault")) if body is not None else None
    if fault is None:
        return None
    if ns == SOAP11:
        code_text = fault.findtext("faultcode") or ""
        reason = (fault.findtext("faultstring") or "").strip()
        detail_holder = fault.find("detail")
    else:
        code_text = fault.findtext(f"{qname(ns, 'Code')}/{qname(ns, 'Value')}") or ""
        reason = (fault.findtext(f"{qname(ns, 'Reason')}/{qname(ns, 'Text')}") or "").strip()
        detail_holder = fault.find(qname(ns, "Detail"))
    code = code_text.strip().rsplit(":", 1)[-1]
    detail_kids = children(detail_holder) if detail_holder is not None else []
    detail = detail_kids[0] if detail_kids else None
    if detail is None or not _is_base_fault(detail):
        kind = (
            AuthenticationFailed if code == "FailedAuthentication" or status == 401 else SoapFault
        )
        return kind(reason or "SOAP fault", code=code, detail=detail, status=status)
    descriptions = [text_of(d) for d in detail.findall(qname(WSRF_BF, "Description"))]
    description = "; ".join(d for d in descriptions if d) or reason
    cls = ALL_FAULT_CLASSES.get(str(detail.tag), WsnFault)
    return cls(
        reason or description, code=code, detail=detail, status=status, description=description
    )


def _is_base_fault(el: etree._Element) -> bool:
    """A WS-BaseFaults element: a known fault name, or any element with a Timestamp."""
    return str(el.tag) in ALL_FAULT_CLASSES or el.find(qname(WSRF_BF, "Timestamp")) is not None
