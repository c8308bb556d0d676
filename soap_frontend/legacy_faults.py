"""The faults of the older WS-N wire formats: which fault a version sends for a 1.3 fault,
the faults its WSDL declares per operation, and the SOAP Fault rendered in its form.

One rule (:func:`fault_element`) names the fault sent for a 1.3 fault and a kind of
request; the runtime's faults (:func:`fault`) and each version's WSDL
(:mod:`.legacy_wsdl`, through :func:`declared_faults`) both follow it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Final

from lxml import etree
from wsnmom.core import errors
from wsnmom.core.model import EndpointReference, SoapVersion

from . import metadata
from .faults import fault_for_error
from .legacy import Legacy, local_name
from .xml import WSA, WSNBR, WSNT, WSRF_BF, WSRF_R, WSRF_RL, WSRF_RP, qname

__all__ = ["LegacyFault", "declared_faults", "fault", "fault_element"]


@dataclass(frozen=True, slots=True)
class LegacyFault:
    """A fault as an older version sends it and its WSDL declares it."""

    #: the wsdl:fault name (1.0: its WSDL's fault name; 1.2-draft: the element's local name)
    name: str
    #: the namespace of the detail element
    namespace: str
    #: the local name of the detail element (1.0: always ErrorMessage)
    local: str


def _draft_namespaces(legacy: Legacy) -> dict[str, str]:
    """1.3 namespace → ``legacy``'s, for fault details (1.2-draft)."""
    return {
        WSNT: legacy.wsnt,
        WSNBR: legacy.wsnbr,
        WSRF_BF: legacy.wsbf or legacy.wsnt,
        WSRF_R: legacy.wsr,
        WSRF_RL: legacy.wsrl,
        WSRF_RP: legacy.wsrp,
        WSA: legacy.wsa,
    }


def fault_element(legacy: Legacy, fault: str, kind: str) -> LegacyFault:
    """The fault ``legacy``'s version sends for the 1.3 fault element ``fault`` (Clark name)
    answering a request of ``kind``: the one rule both :func:`fault` and the version's
    WSDL (:func:`declared_faults`) follow.

    1.0: ``ErrorMessage`` in the namespace of the interface declaring the operation
    (WS-ResourceLifetime for Destroy/SetTerminationTime, WS-ResourceProperties for
    GetResourceProperty, WS-Notification otherwise), named by the 1.0 WSDL's fault
    name; 1.2-draft: the draft-01 element (:func:`_draft_fault_tag`) in the draft's
    namespace, named by its local name."""
    if legacy.wsbf is None:
        local = fault.rsplit("}", 1)[-1]
        interface = _INTERFACE_10.get(kind, "wsnt")
        ns = (
            legacy.wsrl
            if interface == "wsrl"
            else legacy.wsrp
            if interface == "wsrp"
            else legacy.wsnt
        )
        return LegacyFault(_name_10(local, kind), ns, "ErrorMessage")
    ns, local = _draft_fault_tag(fault, kind)[1:].split("}", 1)
    return LegacyFault(local, _draft_namespaces(legacy).get(ns, ns), local)


def declared_faults(legacy: Legacy, kind: str) -> tuple[LegacyFault, ...]:
    """Every fault ``legacy``'s version can send answering a request of ``kind`` (what its
    WSDL declares for the operation), in a stable order without repeats."""
    found = {fault_element(legacy, f, kind): None for f in _KIND_FAULTS[kind]}
    return tuple(found)


def fault(
    legacy: Legacy,
    exc: BaseException,
    soap: SoapVersion,
    kind: str,
    *,
    now: datetime,
    originator: EndpointReference | None,
) -> tuple[etree._Element, str, errors.WsnError]:
    """(SOAP Fault, wsa:Action, the error rendered) in ``legacy``'s version.

    The detail element is :func:`fault_element`'s.  1.0: the WSDL's faults all carry
    one ``ErrorMessage`` (xsd:string) element; the fault's 1.0 name starts the message
    and the Reason (guess: 1.0 gives no other way to tell them apart).  1.2-draft: the
    1.3 WS-BaseFaults detail with its namespaces mapped to the drafts' (guess: the
    1.2-draft BaseFault has Timestamp, Originator and Description too)."""
    fault, _, rendered = fault_for_error(exc, soap, now=now, originator=originator)
    detail = next((c for c in fault if local_name(c) in ("detail", "Detail")), None)
    if detail is None:  # pragma: no cover - every rendered fault has a detail
        return fault, legacy.fault_action, rendered
    if legacy.wsbf is None:
        tag = qname(rendered.namespace, rendered.fault_name)
        sent = fault_element(legacy, tag, kind)
        for child in list(detail):
            detail.remove(child)
        prefix = {legacy.wsrl: "wsrl", legacy.wsrp: "wsrp"}.get(sent.namespace, "wsnt")
        message = etree.SubElement(
            detail, qname(sent.namespace, sent.local), nsmap={prefix: sent.namespace}
        )
        message.text = f"{sent.name}: {rendered.description}"
        for el in fault.iter():
            if local_name(el) in ("faultstring", "Text"):
                el.text = f"{sent.name}: {el.text or ''}"
    else:
        table = _draft_namespaces(legacy)
        for old in list(detail):  # a fresh element declaring the draft's prefixes
            sent = fault_element(legacy, str(old.tag), kind)
            root = legacy.root(qname(sent.namespace, sent.local))
            for child in list(old):
                root.append(child)
            for attribute, value in old.attrib.items():
                root.set(attribute, value)
            detail.replace(old, root)
        for el in detail.iter():
            tag = el.tag
            if isinstance(tag, str) and tag.startswith("{"):
                ns, local = tag[1:].split("}", 1)
                if ns in table:
                    if ns == WSA and local == "ReferenceParameters":
                        local = "ReferenceProperties"
                    el.tag = qname(table[ns], local)
    return fault, legacy.fault_action, rendered


#: 1.3 fault names → the 1.0 WSDL's fault names
_FAULTS_10: Final[dict[str, str]] = {
    "SubscribeCreationFailedFault": "SubscribeCreationFailed",
    "TopicNotSupportedFault": "TopicNotSupported",
    "NoCurrentMessageOnTopicFault": "NoCurrentMessageOnTopic",
    "MultipleTopicsSpecifiedFault": "InvalidTopicPathExpression",
    "PauseFailedFault": "PauseFailed",
    "ResumeFailedFault": "ResumeFailed",
    "PublisherRegistrationFailedFault": "PublisherRegistrationFailed",
    "PublisherRegistrationRejectedFault": "PublisherRegistrationFailed",
    "ResourceUnknownFault": "UnknownResource",
    "UnacceptableTerminationTimeFault": "TerminationTimeChangeRejected",
    "InvalidResourcePropertyQNameFault": "InvalidResourceProperty",
    "UnableToDestroySubscriptionFault": "UnableToDestroyResource",
    "ResourceNotDestroyedFault": "UnableToDestroyResource",
    # guess: 1.0 names no fault for a malformed request or an internal error
    "BaseFault": "BaseFault",
}
#: faults about the request's expressions (1.0: SubscribeCreationFailed for Subscribe,
#: the only fault its WSDL declares; InvalidTopicPathExpression elsewhere)
_EXPRESSION_FAULTS: Final = frozenset(
    {
        "InvalidFilterFault",
        "InvalidTopicExpressionFault",
        "TopicExpressionDialectUnknownFault",
        "InvalidMessageContentExpressionFault",
        "InvalidProducerPropertiesExpressionFault",
        "UnrecognizedPolicyRequestFault",
        "UnsupportedPolicyRequestFault",
        "NotifyMessageNotSupportedFault",
    }
)


#: 1.0: the interface (namespace key) declaring each kind of request, whose namespace its
#: ErrorMessage is in (WS-Notification for the others)
_INTERFACE_10: Final = {
    "destroy": "wsrl",
    "set_termination_time": "wsrl",
    "get_property": "wsrp",
}

#: 1.3 faults any request can be answered with: a malformed or misdirected request or an
#: internal error (wsrf-bf:BaseFault), an overloaded middleware or quota
#: (wsrf-r:ResourceUnavailableFault)
_ANY_REQUEST: Final = (qname(WSRF_BF, "BaseFault"), qname(WSRF_R, "ResourceUnavailableFault"))


def _faults_of(*operations: metadata.Operation) -> tuple[str, ...]:
    return (*(qname(ns, local) for op in operations for ns, local in op.faults), *_ANY_REQUEST)


#: kind of older request → the 1.3 faults (Clark names) it can be answered with: those of
#: the 1.3 operation(s) it is handled as (:mod:`.metadata`), and any request's.  Notify is
#: one-way (no fault is declared for it)
_KIND_FAULTS: Final[dict[str, tuple[str, ...]]] = {
    "notify": (),
    "subscribe": _faults_of(metadata.SUBSCRIBE),
    "current": _faults_of(metadata.GET_CURRENT_MESSAGE),
    "pause": _faults_of(metadata.PAUSE),
    "resume": _faults_of(metadata.RESUME),
    "register": _faults_of(metadata.REGISTER_PUBLISHER),
    "destroy": _faults_of(metadata.UNSUBSCRIBE, metadata.DESTROY_REGISTRATION),
    "set_termination_time": _faults_of(metadata.RENEW),
    "get_property": _faults_of(metadata.GET_RP),
    "producer_pause": _faults_of(metadata.PAUSE),
    "producer_resume": _ANY_REQUEST,
}


#: WSRL draft-01 operations: their faults are in the WSRL draft namespace
_LIFETIME_KINDS: Final = frozenset({"destroy", "set_termination_time"})


def _draft_fault_tag(tag: str, kind: str) -> str:
    """The 1.2-draft name (as a 1.3 Clark name whose namespace is mapped to the draft's
    afterwards) of the 1.3 fault element ``tag`` answering a request of ``kind``: the
    names the draft-01 WSDLs declare where they differ from 1.3's."""
    if tag == qname(WSNT, "TopicExpressionDialectUnknownFault"):
        return qname(WSNT, "TopicPathDialectUnknownFault")
    if kind in _LIFETIME_KINDS:
        if tag == qname(WSNT, "UnacceptableTerminationTimeFault"):
            return qname(WSRF_RL, "TerminationTimeChangeRejectedFault")
        if tag in (
            qname(WSNT, "UnableToDestroySubscriptionFault"),
            qname(WSNBR, "ResourceNotDestroyedFault"),
        ):
            return qname(WSRF_RL, "ResourceNotDestroyedFault")
        if tag == qname(WSRF_R, "ResourceUnknownFault"):
            return qname(WSRF_RL, "ResourceUnknownFault")
    elif kind != "get_property" and tag == qname(WSRF_R, "ResourceUnknownFault"):
        return qname(WSNT, "ResourceUnknownFault")  # the WS-BaseNotification draft's own
    return tag


def _name_10(name: str, kind: str) -> str:
    """The 1.0 name of the 1.3 fault ``name`` answering a request of ``kind``."""
    if name in _FAULTS_10:
        return _FAULTS_10[name]
    if name in _EXPRESSION_FAULTS:
        return "SubscribeCreationFailed" if kind == "subscribe" else "InvalidTopicPathExpression"
    if name == "UnacceptableInitialTerminationTimeFault":
        return "PublisherRegistrationFailed" if kind == "register" else "SubscribeCreationFailed"
    return name.removesuffix("Fault")
