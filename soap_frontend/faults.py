"""SOAP fault rendering for WS-N / WS-RF errors.

Every ``WsnError`` becomes a SOAP fault (1.1 ``faultcode``/``faultstring``/``detail`` or
1.2 ``Code``/``Reason``/``Detail``) whose detail holds exactly one element,
``{error.namespace}error.fault_name``, of a type derived from ``wsrf-bf:BaseFaultType``:
``wsrf-bf:Timestamp``, ``wsrf-bf:Originator`` (the broker EPR) and ``wsrf-bf:Description``,
followed by the fault's own required children (``UnknownFilter``, ``MinimumTime``, ...),
so the detail validates against bf-2.xsd with b-2/br-2/r-2/rp-2.

Fault-specific hints travel as optional attributes of the exception object, set by whoever
raises it:

``unknown_filters``      QNames (Clark notation) for InvalidFilterFault (1..n)
``policies``             QNames for Unrecognized/UnsupportedPolicyRequestFault
``minimum_time`` / ``maximum_time``   datetimes for the Unacceptable*TerminationTime faults

The SOAP action of a WS-N fault is ``http://docs.oasis-open.org/wsn/fault``; faults in the
WS-RF namespaces use ``http://docs.oasis-open.org/wsrf/fault``.  Faults answer HTTP 500.
Anything that is not a ``WsnError`` becomes a generic Receiver fault whose text says
nothing about the exception (it is logged instead).
"""

from __future__ import annotations

import copy
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from lxml import etree
from wsnmom.core import errors
from wsnmom.core.disk import is_storage_full, storage_full_text
from wsnmom.core.errors import WsnError
from wsnmom.core.guard import ThrottledLog
from wsnmom.core.model import EndpointReference, SoapVersion
from wsnmom.core.redaction import redact_text

from .envelope import (
    SOAP_NS,
    HttpError,
    content_type_for,
    envelope_bytes,
    version_for_media_type,
)
from .xml import (
    PREFIXES,
    SOAP11,
    SOAP12,
    WSA,
    WSN_FAULT_ACTION,
    WSNBR,
    WSNT,
    WSRF_BF,
    WSRF_FAULT_ACTION,
    XML_NS,
    qname,
    split_qname,
)

#: characters XML 1.0 cannot carry (control characters, lone surrogates, U+FFFE/U+FFFF)
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")

log = logging.getLogger("wsnmom.soap")
invalid_log = logging.getLogger("wsnmom.soap.invalid")
#: the lines about refused and faulted requests (``wsnmom.soap.invalid``, INFO), at most one
#: per kind every 10 s with the count left out: a client flooding bad requests writes a
#: line every 10 s per kind, not one per request
invalid_requests = ThrottledLog(invalid_log)


class BaseFaultError(WsnError):
    """A request problem with no specific WS-N fault: rendered as ``wsrf-bf:BaseFault``.

    Used for malformed Notify messages, operations sent to the wrong endpoint, empty SOAP
    bodies and unknown body elements.
    """

    namespace = WSRF_BF
    fault_name = "BaseFault"


class InternalError(WsnError):
    """Placeholder for unexpected exceptions: a Receiver fault without details."""

    namespace = WSRF_BF
    fault_name = "BaseFault"
    code = "Receiver"


def fault_action(error: WsnError) -> str:
    """The wsa:Action of the fault message for ``error`` (one of its own, when it names
    one: ONVIF's PullMessagesFaultResponse)."""
    own: str | None = getattr(error, "fault_action", None)
    if own:
        return own
    if error.namespace in (WSNT, WSNBR):
        return WSN_FAULT_ACTION
    return WSRF_FAULT_ACTION


def xsd_datetime(value: datetime) -> str:
    """xsd:dateTime in UTC with a ``Z`` suffix."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    text = value.astimezone(UTC).isoformat()
    return text.replace("+00:00", "Z")


def _epr(parent: etree._Element, tag: str, epr: EndpointReference) -> etree._Element:
    from .xml import append_serialized  # local: avoid a cycle at import time

    el = etree.SubElement(parent, tag)
    etree.SubElement(el, qname(WSA, "Address")).text = epr.address
    if epr.reference_parameters:
        rp = etree.SubElement(el, qname(WSA, "ReferenceParameters"))
        append_serialized(rp, epr.reference_parameters)
    return el


def _qname_text(el: etree._Element, clark: str) -> str:
    """Text for a QName value, declaring the namespace on ``el``."""
    ns, local = split_qname(clark)
    if ns is None:
        return local
    for p, uri in el.nsmap.items():
        if uri == ns and p:
            return f"{p}:{local}"
    return ""


def fault_detail(
    error: WsnError,
    *,
    now: datetime,
    originator: EndpointReference | None,
) -> etree._Element:
    """The WS-BaseFaults element that goes into the SOAP fault detail."""
    qnames: list[str] = []
    unknown: Iterable[str] = getattr(error, "unknown_filters", ()) or ()
    policies: Iterable[str] = getattr(error, "policies", ()) or ()
    if error.fault_name == "InvalidFilterFault":
        qnames = list(unknown) or [qname(WSNT, "Filter")]
    elif error.fault_name in ("UnrecognizedPolicyRequestFault", "UnsupportedPolicyRequestFault"):
        qnames = list(policies)
    nsmap: dict[str | None, str] = {
        "wsrf-bf": WSRF_BF,
        "wsa": WSA,
        "wsnt": WSNT,
        "wsn-br": WSNBR,
    }
    for ns in [error.namespace, *(split_qname(q)[0] for q in qnames)]:
        if ns and ns not in nsmap.values():
            known = [p for p, u in PREFIXES.items() if u == ns]
            nsmap[known[0] if known else f"q{len(nsmap)}"] = ns
    el = etree.Element(qname(error.namespace, error.fault_name), nsmap=cast(Any, nsmap))
    # elements a fault type puts first (ONVIF's PullMessagesFaultResponse: its maxima)
    for leading in getattr(error, "detail_elements", ()):
        el.append(copy.deepcopy(leading))
    etree.SubElement(el, qname(WSRF_BF, "Timestamp")).text = xsd_datetime(now)
    if originator is not None:
        _epr(el, qname(WSRF_BF, "Originator"), originator)
    desc = etree.SubElement(el, qname(WSRF_BF, "Description"))
    desc.set(qname(XML_NS, "lang"), "en")
    desc.text = xml_text(error.description)
    name = error.fault_name
    if name == "InvalidFilterFault":
        for q in qnames:
            etree.SubElement(el, qname(WSNT, "UnknownFilter")).text = _qname_text(el, q)
    elif name == "UnrecognizedPolicyRequestFault":
        for q in qnames:
            etree.SubElement(el, qname(WSNT, "UnrecognizedPolicy")).text = _qname_text(el, q)
    elif name == "UnsupportedPolicyRequestFault":
        for q in qnames:
            etree.SubElement(el, qname(WSNT, "UnsupportedPolicy")).text = _qname_text(el, q)
    elif name in ("UnacceptableInitialTerminationTimeFault", "UnacceptableTerminationTimeFault"):
        minimum: datetime = getattr(error, "minimum_time", None) or now
        maximum: datetime | None = getattr(error, "maximum_time", None)
        etree.SubElement(el, qname(WSNT, "MinimumTime")).text = xsd_datetime(minimum)
        if maximum is not None:
            etree.SubElement(el, qname(WSNT, "MaximumTime")).text = xsd_datetime(maximum)
    return el


def xml_text(text: str) -> str:
    """``text`` with every character XML cannot carry written as a Python escape
    (``\\x00``): fault texts quote what the client sent (a path, a value), which may hold
    a NUL byte or a control character that lxml refuses to serialise."""
    return _NOT_XML.sub(lambda m: ascii(m.group())[1:-1], text)


def soap_fault(
    version: SoapVersion,
    code: str,
    reason: str,
    detail: etree._Element | None,
) -> etree._Element:
    """A SOAP Fault element of ``version``: code is "Sender", "Receiver" or
    "VersionMismatch"."""
    ns = SOAP_NS[version]
    fault = etree.Element(qname(ns, "Fault"), nsmap={"s": ns})
    if version is SoapVersion.SOAP11:
        value = {"Sender": "s:Client", "VersionMismatch": "s:VersionMismatch"}.get(code, "s:Server")
        etree.SubElement(fault, "faultcode").text = value
        fs = etree.SubElement(fault, "faultstring")
        fs.set(qname(XML_NS, "lang"), "en")
        fs.text = xml_text(reason)
        if detail is not None:
            etree.SubElement(fault, "detail").append(detail)
    else:
        code_el = etree.SubElement(fault, qname(ns, "Code"))
        etree.SubElement(code_el, qname(ns, "Value")).text = f"s:{code}"
        reason_el = etree.SubElement(fault, qname(ns, "Reason"))
        text = etree.SubElement(reason_el, qname(ns, "Text"))
        text.set(qname(XML_NS, "lang"), "en")
        text.text = xml_text(reason)
        if detail is not None:
            etree.SubElement(fault, qname(ns, "Detail")).append(detail)
    return fault


#: the WS-Security fault of a token that cannot be authenticated (WSS 1.0 SOAP Message
#: Security, "Error handling"); its text is the specification's, whatever the reason
FAILED_AUTHENTICATION = "FailedAuthentication"
_WSSE = "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-secext-1.0.xsd"
_AUTH_REASON = "The security token could not be authenticated or authorized"


def authentication_fault(version: SoapVersion) -> tuple[etree._Element, str]:
    """(SOAP Fault, wsa:Action) refusing a request for its credentials: code
    ``wsse:FailedAuthentication`` (SOAP 1.1 faultcode; SOAP 1.2 Sender with that
    subcode), no detail."""
    ns = SOAP_NS[version]
    nsmap = {"s": ns, "wsse": _WSSE}
    fault = etree.Element(qname(ns, "Fault"), nsmap=cast(Any, nsmap))
    if version is SoapVersion.SOAP11:
        etree.SubElement(fault, "faultcode").text = "wsse:" + FAILED_AUTHENTICATION
        reason = etree.SubElement(fault, "faultstring")
    else:
        code = etree.SubElement(fault, qname(ns, "Code"))
        etree.SubElement(code, qname(ns, "Value")).text = "s:Sender"
        sub = etree.SubElement(code, qname(ns, "Subcode"))
        etree.SubElement(sub, qname(ns, "Value")).text = "wsse:" + FAILED_AUTHENTICATION
        reason = etree.SubElement(etree.SubElement(fault, qname(ns, "Reason")), qname(ns, "Text"))
    reason.set(qname(XML_NS, "lang"), "en")
    reason.text = _AUTH_REASON
    return fault, WSRF_FAULT_ACTION


def fault_for_error(
    error: BaseException,
    version: SoapVersion,
    *,
    now: datetime | None = None,
    originator: EndpointReference | None = None,
) -> tuple[etree._Element, str, WsnError]:
    """(SOAP Fault element, wsa:Action, the WsnError rendered) for any exception."""
    mapped = as_wsn_error(error)
    if mapped is None:
        log.error("unexpected error while handling a SOAP request", exc_info=error)
        mapped = InternalError("The broker could not process the request (internal error).")
    error = mapped
    shown = redact_text(error.description)
    if shown != error.description:  # a secret in a message (an address, a middleware error)
        error.description = shown
    moment = now or datetime.now(UTC)
    detail = fault_detail(error, now=moment, originator=originator)
    reason = error.description or error.fault_name
    return soap_fault(version, error.code, reason, detail), fault_action(error), error


@dataclass(frozen=True, slots=True)
class TransportFault:
    """The HTTP answer to a request refused before SOAP processing (:class:`HttpError`)."""

    status: int
    body: bytes
    content_type: str
    headers: tuple[tuple[str, str], ...] = ()


#: what a 405 on a SOAP endpoint allows
ALLOW = (("Allow", "GET, POST"),)


def transport_fault(
    error: HttpError,
    content_type: str | None = None,
    *,
    now: datetime | None = None,
    originator: EndpointReference | None = None,
) -> TransportFault:
    """A SOAP fault answering ``error`` with its HTTP status: a BaseFault detail whose
    Description is the error's message, code Sender (or VersionMismatch, with the SOAP
    Upgrade header naming the envelopes spoken here); the version is the request's, else
    the one ``content_type`` names, else SOAP 1.1."""
    version = error.version or version_for_media_type(content_type) or SoapVersion.SOAP11
    rejected = BaseFaultError(redact_text(error.message))
    detail = fault_detail(rejected, now=now or datetime.now(UTC), originator=originator)
    fault = soap_fault(version, error.code, rejected.description, detail)
    headers = [_upgrade(version)] if error.code == "VersionMismatch" else []
    count_fault(rejected.fault_name)
    data = envelope_bytes(version, fault, action=WSRF_FAULT_ACTION, extra_headers=headers)
    extra = ALLOW if error.status == 405 else ()
    return TransportFault(error.status, data, content_type_for(version, WSRF_FAULT_ACTION), extra)


def _upgrade(version: SoapVersion) -> etree._Element:
    """The SOAP ``Upgrade`` header block listing the envelope versions understood."""
    ns = SOAP_NS[version]
    upgrade = etree.Element(qname(ns, "Upgrade"), nsmap={"s": ns})
    for i, supported in enumerate((SOAP12, SOAP11)):
        el = etree.SubElement(upgrade, qname(ns, "SupportedEnvelope"), nsmap={f"v{i}": supported})
        el.set("qname", f"v{i}:Envelope")
    return upgrade


def count_request(operation: str) -> None:
    """Metrics hook: one request handled (no-op when core has no metrics module)."""
    _metric("count_request", operation)


def count_fault(fault_name: str) -> None:
    """Metrics hook: one fault answered."""
    _metric("count_fault", fault_name)


def _metric(name: str, *args: Any) -> None:
    metrics = _metrics_module()
    if metrics is None:
        return
    fn = getattr(metrics, name, None)
    if callable(fn):
        try:
            fn(*args)
        except Exception:  # metrics must never break a request
            log.debug("metrics hook %s failed", name, exc_info=True)


def _metrics_module() -> Any:
    """``wsnmom.core.metrics``, or None without it (imported once)."""
    global _METRICS
    if _METRICS is _UNSET:
        try:
            from wsnmom.core import metrics
        except ImportError:
            _METRICS = None
        else:
            _METRICS = metrics
    return _METRICS


_UNSET: Any = object()
_METRICS: Any = _UNSET


def as_wsn_error(error: BaseException) -> WsnError | None:
    """The WsnError for ``error``: itself, or the fault a topic_mapping error stands for."""
    if isinstance(error, WsnError):
        return error
    if is_storage_full(error):  # a write found the disk full: temporary, and said so
        return errors.ResourceUnavailable(storage_full_text(), retry_after=5.0)
    try:
        from wsnmom.topic_mapping.errors import NameNotRepresentable, TopicError
    except ImportError:  # pragma: no cover
        return None
    if isinstance(error, NameNotRepresentable):
        return errors.TopicNotSupported(str(error))
    if isinstance(error, TopicError):
        cls = errors.ALL_FAULTS.get(type(error).__name__ + "Fault")
        if cls is not None:
            return cls(str(error))
    return None


__all__ = [
    "SOAP11",
    "BaseFaultError",
    "InternalError",
    "TransportFault",
    "as_wsn_error",
    "authentication_fault",
    "count_fault",
    "count_request",
    "fault_action",
    "fault_detail",
    "fault_for_error",
    "invalid_log",
    "invalid_requests",
    "soap_fault",
    "transport_fault",
    "xsd_datetime",
]
