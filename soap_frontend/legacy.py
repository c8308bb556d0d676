"""WS-Notification 1.0 and OASIS 1.2-draft wire formats, translated at the frontend's edge.

A request whose Body element is in a namespace of an older WS-N version (1.0: the IBM
``stdwip`` namespaces with WS-Addressing 2003/03; 1.2-draft: the OASIS
``http://docs.oasis-open.org/wsn/2004/06/...`` and ``.../wsrf/2004/06/...`` namespaces with
WS-Addressing 2004/03) is rewritten, in place, into the WS-N 1.3 request it stands for, so
the 1.3 parsers and core handle it unchanged:

=================================  ==========================================================
older request                      handled as (1.3)
=================================  ==========================================================
SubscribeRequest / Subscribe       Subscribe: TopicPathExpression (1.0, Full dialect) or
                                   TopicExpression (1.2) → Filter/TopicExpression,
                                   Selector → Filter/MessageContent, Precondition →
                                   Filter/ProducerProperties, UseNotify=false →
                                   SubscriptionPolicy/UseRaw, wsrl:InitialTerminationTime →
                                   InitialTerminationTime
Notify                             Notify (a 1.0 Topic is a concrete path: Concrete dialect)
GetCurrentMessage(Request)         GetCurrentMessage
PauseSubscription(Request)         PauseSubscription
ResumeSubscription(Request)        ResumeSubscription
RegisterPublisher(Request)         br-2 RegisterPublisher
wsrl:Destroy                       wsrf-rl:Destroy (any resource kind)
wsrl:SetTerminationTime            Renew (RequestedTerminationTime → TerminationTime); of a
                                   registration: its own (N10 §11; br-2 has none)
wsrp:GetResourceProperty           wsrf-rp:GetResourceProperty (property QName mapped)
Pause (1.0 producer)               refused: PauseFailed (N10 §8.4 lists "Pause operation
                                   could not be performed" among its answers)
Resume (1.0 producer)              ResumeResponse: the producer and its topics are never
                                   paused, and resuming what is not paused is "no change"
                                   (N10 §8.5)
=================================  ==========================================================

Addressing: every element of the older WS-Addressing namespace in the envelope is renamed
to WS-Addressing 1.0 (``ReferenceProperties`` becomes ``ReferenceParameters``), so ``wsa:To``
and echoed reference properties find the resource as for 1.3.  The answer is the 1.3
answer translated back (:meth:`Legacy.response`) inside an envelope whose addressing
headers are the older version's (:meth:`Legacy.envelope_bytes`); faults are that version's
(:meth:`Legacy.fault`).  A subscriber is delivered to in the format it subscribed with
(:meth:`Legacy.notify_element`, ``Subscription.wire_version``).

Where the specifications leave a choice open, the guess is written next to the code as
"guess:" and listed in docs/conformance.md (section "WS-Notification 1.0 and 1.2-draft").
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Final

from lxml import etree
from wsnmom.core import errors
from wsnmom.core.model import Delivered, EndpointReference, SoapVersion, WireVersion
from wsnmom.topic_mapping.dialects import XPATH

from . import codec, metadata
from .envelope import SOAP_NS, SoapRequest, new_message_id, parse_addressing, to_bytes
from .faults import fault_for_error
from .splice import Spliced
from .xml import (
    WSA,
    WSNBR,
    WSNT,
    WSRF_BF,
    WSRF_R,
    WSRF_RL,
    WSRF_RP,
    XSI,
    append_serialized,
    children,
    parse_fragment,
    qname,
    resolve_qname,
    text_of,
)

__all__ = ["LEGACY", "Answered", "Legacy", "LegacyFault", "recognise"]

_FULL: Final = codec.FULL
_CONCRETE: Final = codec.CONCRETE
_D0406: Final = "http://docs.oasis-open.org/wsn/2004/06/TopicExpression/"
_DRAFT_DIALECTS: Final = {
    codec.SIMPLE: _D0406 + "Simple",
    codec.CONCRETE: _D0406 + "Concrete",
    codec.FULL: _D0406 + "Full",
}


class Answered(Exception):
    """Raised by :meth:`Legacy.to_current` for a request it answers itself (no 1.3 request
    stands for it): ``element`` is the answer in 1.3 namespaces, translated back as any."""

    def __init__(self, element: etree._Element) -> None:
        super().__init__("answered")
        self.element = element


@dataclass(frozen=True, slots=True)
class LegacyFault:
    """A fault as an older version sends it and its WSDL declares it."""

    #: the wsdl:fault name (1.0: its WSDL's fault name; 1.2-draft: the element's local name)
    name: str
    #: the namespace of the detail element
    namespace: str
    #: the local name of the detail element (1.0: always ErrorMessage)
    local: str


@dataclass(frozen=True, slots=True)
class Legacy:
    """One older WS-N wire format: its namespaces and message names."""

    version: WireVersion
    wsnt: str
    wsnbr: str
    wsa: str
    wsrl: str
    wsrp: str
    #: WS-BaseFaults namespace of the version (None: 1.0, whose faults are an ErrorMessage)
    wsbf: str | None
    #: WS-Resource namespace (ResourceUnknownFault); the version's WSRP one when it has none
    wsr: str
    #: other addressing namespaces read as this version's (inbound only)
    wsa_also: tuple[str, ...] = ()
    #: wsa:Action of faults (guess: neither version defines one)
    fault_action: str = ""

    @property
    def anonymous(self) -> str:
        """The anonymous address of this version's WS-Addressing."""
        return f"{self.wsa}/role/anonymous"

    def action(self, tag: str) -> str:
        """The wsa:Action of a message whose body element is ``tag`` (Clark name).

        1.0: ``namespace/LocalName`` as the specification's examples write them; 1.2-draft:
        the namespace without its ``-1.2-draft-01.xsd`` suffix, then ``/LocalName``
        (guess: the 1.2 drafts define no actions)."""
        ns, local = tag[1:].split("}", 1)
        return f"{ns.removesuffix('-1.2-draft-01.xsd')}/{local}"

    @property
    def notify_action(self) -> str:
        """The wsa:Action of a Notify delivered in this version."""
        return self.action(qname(self.wsnt, "Notify"))

    # --- inbound --------------------------------------------------------------------
    def to_current(self, req: SoapRequest, kind: str) -> SoapRequest:
        """``req`` rewritten into the WS-N 1.3 request it stands for (see the module
        docstring), with ``wire`` set to this version."""
        _rename_addressing(req.envelope, self.wsa_namespaces, WSA, qname(self.wsnt, "Message"))
        header = next((c for c in req.envelope if _local(c) == "Header"), None)
        addressing = parse_addressing(header)
        body = req.body
        if kind == "subscribe":
            self._subscribe(body)
        elif kind == "notify":
            self._notify(body)
        elif kind == "current":
            body.tag = qname(WSNT, "GetCurrentMessage")
            for child in children(body):
                if _local(child) == "Topic":
                    self._topic(child, qname(WSNT, "Topic"), concrete=True)
        elif kind == "pause":
            body.tag = qname(WSNT, "PauseSubscription")
        elif kind == "resume":
            body.tag = qname(WSNT, "ResumeSubscription")
        elif kind == "register":
            self._register(body)
        elif kind == "destroy":
            body.tag = qname(WSRF_RL, "Destroy")
        elif kind == "set_termination_time":
            body.tag = qname(WSNT, "Renew")
            for child in children(body):
                if _local(child) == "RequestedTerminationTime":
                    child.tag = qname(WSNT, "TerminationTime")
        elif kind == "get_property":
            body = self._get_property(body)
        elif kind == "producer_pause":
            raise errors.PauseFailed(
                "pausing the whole producer or a topic is not supported; pause a "
                "subscription (PauseSubscription at its SubscriptionReference)"
            )
        else:  # producer_resume: nothing is paused, so "no change occurs" (N10 §8.5)
            raise Answered(etree.Element(qname(WSNT, "ResumeResponse")))
        return replace(req, body=body, addressing=addressing, wire=self.version)

    @property
    def wsa_namespaces(self) -> tuple[str, ...]:
        """Addressing namespaces read as this version's."""
        return (self.wsa, *self.wsa_also)

    def _dialect(self, el: etree._Element, default: str) -> str:
        """The Dialect of an older expression element: its ``Dialect`` (1.2) or ``dialect``
        (1.0 spelling) attribute, else ``default``."""
        value = el.get("Dialect") or el.get("dialect")
        return value.strip() if value else default

    def _topic(self, el: etree._Element, tag: str, *, concrete: bool) -> None:
        """Rename a topic expression element to ``tag`` with a 1.3 Dialect: a 1.0
        TopicPathExpression has none (guess: the Full dialect, Concrete for the concrete
        paths of Notify and GetCurrentMessage; a trailing ``//*`` means "this topic and
        every descendant", which Full writes ``//.``: design note B.1.6)."""
        default = _CONCRETE if concrete else _FULL
        dialect = self._dialect(el, default)
        if self.version is WireVersion.WSN_10 and not concrete:
            text = text_of(el)
            el.text = "|".join(_legacy_path(p.strip()) for p in text.split("|"))
        el.tag = tag
        el.attrib.pop("dialect", "")
        el.set("Dialect", dialect)

    def _subscribe(self, body: etree._Element) -> None:
        body.tag = qname(WSNT, "Subscribe")
        filt: etree._Element | None = None
        raw = False
        for child in children(body):
            local = _local(child)
            if local == "ConsumerReference":
                child.tag = qname(WSNT, "ConsumerReference")
                continue
            if local in ("TopicPathExpression", "TopicExpression", "Selector", "Precondition"):
                if filt is None:
                    filt = etree.Element(qname(WSNT, "Filter"))
                    child.addprevious(filt)
                if local in ("TopicPathExpression", "TopicExpression"):
                    self._topic(child, qname(WSNT, "TopicExpression"), concrete=False)
                else:
                    # guess: Selector is a boolean over the message (1.3 MessageContent),
                    # Precondition one over the producer's properties (ProducerProperties)
                    tag = "MessageContent" if local == "Selector" else "ProducerProperties"
                    dialect = self._dialect(child, XPATH)
                    child.tag = qname(WSNT, tag)
                    child.attrib.pop("dialect", "")
                    child.set("Dialect", dialect)
                filt.append(child)
            elif local == "UseNotify":
                raw = text_of(child).lower() in ("false", "0")
                body.remove(child)
            elif local == "SubscriptionPolicy":
                # guess: the 1.0/1.2 policy language is unspecified (wsp:Policy); ignored
                body.remove(child)
            elif local == "InitialTerminationTime":
                child.tag = qname(WSNT, "InitialTerminationTime")
        if raw:
            policy = etree.SubElement(body, qname(WSNT, "SubscriptionPolicy"))
            etree.SubElement(policy, qname(WSNT, "UseRaw"))

    def _notify(self, body: etree._Element) -> None:
        body.tag = qname(WSNT, "Notify")
        for holder in children(body):
            if _local(holder) != "NotificationMessage":
                continue
            holder.tag = qname(WSNT, "NotificationMessage")
            for part in children(holder):
                local = _local(part)
                if local == "Topic":
                    self._topic(part, qname(WSNT, "Topic"), concrete=True)
                elif local in ("ProducerReference", "SubscriptionReference", "Message"):
                    part.tag = qname(WSNT, local)

    def _register(self, body: etree._Element) -> None:
        body.tag = qname(WSNBR, "RegisterPublisher")
        for child in children(body):
            local = _local(child)
            if local in ("Topic", "TopicPathExpression"):
                self._topic(child, qname(WSNBR, "Topic"), concrete=False)
            elif local in ("PublisherReference", "Demand", "InitialTerminationTime"):
                child.tag = qname(WSNBR, local)

    def _get_property(self, body: etree._Element) -> etree._Element:
        """A new ``wsrf-rp:GetResourceProperty`` naming the 1.3 property an older QName
        stands for (an unknown one stays in the older namespace, so it is answered with
        the InvalidResourceProperty fault)."""
        text = text_of(body)
        resolved = resolve_qname(text, body.nsmap)
        if resolved is None or not resolved.startswith("{"):
            raise errors.InvalidResourcePropertyQName(
                f"{text!r} is not a resolvable resource property QName"
            )
        ns, local = resolved[1:].split("}", 1)
        target = resolved
        if ns in (self.wsnt, self.wsnbr):
            mapped = _PROPERTIES.get(local)
            if mapped is not None:
                target = mapped
        elif ns == self.wsrl and local in ("CurrentTime", "TerminationTime"):
            target = qname(WSRF_RL, local)
        new_ns, new_local = target[1:].split("}", 1)
        el = etree.Element(qname(WSRF_RP, "GetResourceProperty"), nsmap={"p": new_ns})
        el.text = f"p:{new_local}"
        return el

    # --- outbound -------------------------------------------------------------------
    def _rename_out(self, root: etree._Element) -> None:
        """Rename every 1.3 element under ``root`` (included) to this version's."""
        table = {
            WSNT: self.wsnt,
            WSNBR: self.wsnbr,
            WSRF_RL: self.wsrl,
            WSRF_RP: self.wsrp,
            WSA: self.wsa,
        }
        for el in root.iter():
            tag = el.tag
            if not isinstance(tag, str) or not tag.startswith("{"):
                continue
            ns, local = tag[1:].split("}", 1)
            new = table.get(ns)
            if new is None:
                continue
            if ns == WSA and local == "ReferenceParameters":
                local = "ReferenceProperties"
            el.tag = qname(new, local)

    def _root(self, tag: str) -> etree._Element:
        """An element declaring this version's prefixes (its descendants use them)."""
        nsmap = {
            "wsnt": self.wsnt,
            **({"wsnbr": self.wsnbr} if self.wsnbr != self.wsnt else {}),
            "wsa": self.wsa,
            "wsrl": self.wsrl,
            "wsrp": self.wsrp,
            "xsi": XSI,
        }
        if self.wsbf is not None:
            nsmap["wsbf"] = self.wsbf
        return etree.Element(tag, nsmap=nsmap)

    def response(self, body: etree._Element | Spliced) -> etree._Element | Spliced:
        """The 1.3 answer ``body`` as this version's answer (the module docstring)."""
        if isinstance(body, Spliced):
            root = self._root(self._out_tag(str(body.element.tag)))
            for child in body.element:
                root.append(child)
            return Spliced(root, body.content, body.headers)
        source = body
        tag = str(source.tag)
        root = self._root(self._out_tag(tag))
        drop: frozenset[str] = frozenset()
        if tag == qname(WSNT, "SubscribeResponse"):
            drop = frozenset({qname(WSNT, "CurrentTime"), qname(WSNT, "TerminationTime")})
        elif tag == qname(WSNBR, "RegisterPublisherResponse"):
            drop = frozenset({qname(WSNBR, "ConsumerReference")})
        for child in list(source):
            if child.tag in drop:
                continue
            if tag == qname(WSNT, "RenewResponse"):
                renamed = _local(child) == "TerminationTime"
                child.tag = qname(WSRF_RL, "NewTerminationTime" if renamed else "CurrentTime")
            root.append(child)
        self._rename_out(root)
        return root

    def _out_tag(self, tag: str) -> str:
        """This version's name of the 1.3 answer element ``tag``."""
        if tag == qname(WSNT, "RenewResponse"):
            return qname(self.wsrl, "SetTerminationTimeResponse")
        if tag == qname(WSNBR, "RegisterPublisherResponse"):
            return qname(self.wsnbr, "RegisterPublisherResponse")
        ns, local = tag[1:].split("}", 1)
        table = {WSNT: self.wsnt, WSNBR: self.wsnbr, WSRF_RL: self.wsrl, WSRF_RP: self.wsrp}
        return qname(table.get(ns, ns), local)

    def envelope_bytes(
        self,
        soap: SoapVersion,
        body: etree._Element | Spliced | None,
        *,
        action: str | None,
        relates_to: str | None = None,
        to: str | None = None,
        extra_headers: Iterable[etree._Element] = (),
    ) -> bytes:
        """An envelope with this version's addressing headers around ``body``."""
        ns = SOAP_NS[soap]
        env = etree.Element(qname(ns, "Envelope"), nsmap={"s": ns, "wsa": self.wsa})
        header = etree.SubElement(env, qname(ns, "Header"))
        if action:
            etree.SubElement(header, qname(self.wsa, "Action")).text = action
        etree.SubElement(header, qname(self.wsa, "MessageID")).text = new_message_id()
        if relates_to:
            etree.SubElement(header, qname(self.wsa, "RelatesTo")).text = relates_to
        etree.SubElement(header, qname(self.wsa, "To")).text = to or self.anonymous
        headers = list(extra_headers)
        if isinstance(body, Spliced):
            headers += body.headers
        for extra in headers:
            header.append(copy.copy(extra))
        body_el = etree.SubElement(env, qname(ns, "Body"))
        element = body.element if isinstance(body, Spliced) else body
        if element is not None:
            body_el.append(copy.copy(element) if isinstance(body, Spliced) else element)
        data = to_bytes(env)
        return body.fill(data) if isinstance(body, Spliced) else data

    @property
    def _draft_namespaces(self) -> dict[str, str]:
        """1.3 namespace → this version's, for fault details (1.2-draft)."""
        return {
            WSNT: self.wsnt,
            WSNBR: self.wsnbr,
            WSRF_BF: self.wsbf or self.wsnt,
            WSRF_R: self.wsr,
            WSRF_RL: self.wsrl,
            WSRF_RP: self.wsrp,
            WSA: self.wsa,
        }

    def fault_element(self, fault: str, kind: str) -> LegacyFault:
        """The fault this version sends for the 1.3 fault element ``fault`` (Clark name)
        answering a request of ``kind``: the one rule both :meth:`fault` and the version's
        WSDL (:func:`declared_faults`) follow.

        1.0: ``ErrorMessage`` in the namespace of the interface declaring the operation
        (WS-ResourceLifetime for Destroy/SetTerminationTime, WS-ResourceProperties for
        GetResourceProperty, WS-Notification otherwise), named by the 1.0 WSDL's fault
        name; 1.2-draft: the draft-01 element (:func:`_draft_fault_tag`) in the draft's
        namespace, named by its local name."""
        if self.wsbf is None:
            local = fault.rsplit("}", 1)[-1]
            interface = _INTERFACE_10.get(kind, "wsnt")
            ns = (
                self.wsrl
                if interface == "wsrl"
                else self.wsrp
                if interface == "wsrp"
                else self.wsnt
            )
            return LegacyFault(_name_10(local, kind), ns, "ErrorMessage")
        ns, local = _draft_fault_tag(fault, kind)[1:].split("}", 1)
        return LegacyFault(local, self._draft_namespaces.get(ns, ns), local)

    def declared_faults(self, kind: str) -> tuple[LegacyFault, ...]:
        """Every fault this version can send answering a request of ``kind`` (what its
        WSDL declares for the operation), in a stable order without repeats."""
        found = {self.fault_element(f, kind): None for f in _KIND_FAULTS[kind]}
        return tuple(found)

    def fault(
        self,
        exc: BaseException,
        soap: SoapVersion,
        kind: str,
        *,
        now: datetime,
        originator: EndpointReference | None,
    ) -> tuple[etree._Element, str, errors.WsnError]:
        """(SOAP Fault, wsa:Action, the error rendered) in this version.

        The detail element is :meth:`fault_element`'s.  1.0: the WSDL's faults all carry
        one ``ErrorMessage`` (xsd:string) element; the fault's 1.0 name starts the message
        and the Reason (guess: 1.0 gives no other way to tell them apart).  1.2-draft: the
        1.3 WS-BaseFaults detail with its namespaces mapped to the drafts' (guess: the
        1.2-draft BaseFault has Timestamp, Originator and Description too)."""
        fault, _, rendered = fault_for_error(exc, soap, now=now, originator=originator)
        detail = next((c for c in fault if _local(c) in ("detail", "Detail")), None)
        if detail is None:  # pragma: no cover - every rendered fault has a detail
            return fault, self.fault_action, rendered
        if self.wsbf is None:
            tag = qname(rendered.namespace, rendered.fault_name)
            sent = self.fault_element(tag, kind)
            for child in list(detail):
                detail.remove(child)
            prefix = {self.wsrl: "wsrl", self.wsrp: "wsrp"}.get(sent.namespace, "wsnt")
            message = etree.SubElement(
                detail, qname(sent.namespace, sent.local), nsmap={prefix: sent.namespace}
            )
            message.text = f"{sent.name}: {rendered.description}"
            for el in fault.iter():
                if _local(el) in ("faultstring", "Text"):
                    el.text = f"{sent.name}: {el.text or ''}"
        else:
            table = self._draft_namespaces
            for old in list(detail):  # a fresh element declaring the draft's prefixes
                sent = self.fault_element(str(old.tag), kind)
                root = self._root(qname(sent.namespace, sent.local))
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
        return fault, self.fault_action, rendered

    def notify_element(self, deliveries: Sequence[Delivered]) -> etree._Element:
        """A Notify of this version holding every delivery: per message its Topic (a
        concrete path; 1.2-draft: with the draft's Dialect URI), ProducerReference and
        Message (1.0 has no SubscriptionReference in a NotificationMessage)."""
        root = self._root(qname(self.wsnt, "Notify"))
        for d in deliveries:
            message = d.message
            holder = etree.SubElement(root, qname(self.wsnt, "NotificationMessage"))
            if self.version is not WireVersion.WSN_10 and d.subscription_reference is not None:
                self._epr(holder, "SubscriptionReference", d.subscription_reference)
            if message.topic is not None:
                el = codec.add_topic(holder, qname(self.wsnt, "Topic"), message.topic)
                dialect = str(el.attrib.pop("Dialect", ""))
                if self.version is not WireVersion.WSN_10:
                    el.set("Dialect", _DRAFT_DIALECTS.get(dialect, _D0406 + "Concrete"))
            if message.producer_reference is not None:
                self._epr(holder, "ProducerReference", message.producer_reference)
            etree.SubElement(holder, qname(self.wsnt, "Message")).append(
                codec.payload_element(message)
            )
        return root

    def _epr(self, parent: etree._Element, local: str, epr: EndpointReference) -> None:
        el = etree.SubElement(parent, qname(self.wsnt, local))
        etree.SubElement(el, qname(self.wsa, "Address")).text = epr.address
        if epr.reference_parameters:
            props = etree.SubElement(el, qname(self.wsa, "ReferenceProperties"))
            append_serialized(props, epr.reference_parameters)

    @staticmethod
    def reference_headers(params: Iterable[bytes]) -> list[etree._Element]:
        """Reference properties echoed as plain header blocks (WS-Addressing 2003/03 and
        2004/03 have no IsReferenceParameter marker)."""
        return [parse_fragment(p) for p in params]


def _local(el: etree._Element) -> str:
    tag = el.tag
    if not isinstance(tag, str):
        return ""
    return tag.rsplit("}", 1)[-1]


def _legacy_path(path: str) -> str:
    """A 1.0 TopicPathExpression path in Full dialect syntax: a trailing ``//*`` (this
    topic and its descendants, 1.0 §6.5) is Full's ``//.``."""
    return path[:-3] + "//." if path.endswith("//*") else path


def _rename_addressing(
    envelope: etree._Element, namespaces: Sequence[str], to: str, payload: str
) -> None:
    """Rename every element of an older WS-Addressing namespace to ``to``, except inside
    notification payloads (elements named ``payload``, Clark notation), which are
    published as they came."""
    prefixes = tuple("{" + ns + "}" for ns in namespaces)
    stack = [envelope]
    while stack:
        el = stack.pop()
        tag = el.tag
        if not isinstance(tag, str) or tag == payload:
            continue
        if tag.startswith(prefixes):
            local = tag.rsplit("}", 1)[1]
            if local == "ReferenceProperties":
                local = "ReferenceParameters"
            el.tag = qname(to, local)
        stack.extend(el)


#: 1.0 / 1.2-draft resource property names → the 1.3 property (CreationTime: the
#: subscription's; a registration's is asked with the 1.3 name)
_PROPERTIES: Final[dict[str, str]] = {
    "ConsumerReference": qname(WSNT, "ConsumerReference"),
    "CreationTime": qname(WSNT, "CreationTime"),
    "FixedTopicSet": qname(WSNT, "FixedTopicSet"),
    "TopicExpression": qname(WSNT, "TopicExpression"),
    "TopicExpressionDialects": qname(WSNT, "TopicExpressionDialect"),
    "SubscriptionPolicy": qname(WSNT, "SubscriptionPolicy"),
    "RequiresRegistration": qname(WSNBR, "RequiresRegistration"),
    "PublisherReference": qname(WSNBR, "PublisherReference"),
    "Demand": qname(WSNBR, "Demand"),
}

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


_IBM = "http://www.ibm.com/xmlns/stdwip/web-services/"
_OASIS_WSN = "http://docs.oasis-open.org/wsn/2004/06/"
_OASIS_WSRF = "http://docs.oasis-open.org/wsrf/2004/06/"

WSN_10: Final = Legacy(
    version=WireVersion.WSN_10,
    wsnt=_IBM + "WS-Notification",
    wsnbr=_IBM + "WS-Notification",
    wsa="http://schemas.xmlsoap.org/ws/2003/03/addressing",
    wsrl=_IBM + "WS-ResourceLifetime",
    wsrp=_IBM + "WS-ResourceProperties",
    wsbf=None,
    wsr=_IBM + "WS-ResourceProperties",
    # guess: the 1.0 namespace table names 2003/02, its examples and schema 2003/03
    wsa_also=("http://schemas.xmlsoap.org/ws/2003/02/addressing",),
    fault_action=_IBM + "WS-Notification/Fault",
)

WSN_12_DRAFT: Final = Legacy(
    version=WireVersion.WSN_12_DRAFT,
    wsnt=_OASIS_WSN + "wsn-WS-BaseNotification-1.2-draft-01.xsd",
    wsnbr=_OASIS_WSN + "wsn-WS-BrokeredNotification-1.2-draft-01.xsd",
    wsa="http://schemas.xmlsoap.org/ws/2004/03/addressing",
    # the draft-01 schemas type EPRs as WS-Addressing 2003/03 (as 1.0); Globus Toolkit 4
    # sends 2004/03: both are read, answers use 2004/03
    wsa_also=("http://schemas.xmlsoap.org/ws/2003/03/addressing",),
    wsrl=_OASIS_WSRF + "wsrf-WS-ResourceLifetime-1.2-draft-01.xsd",
    wsrp=_OASIS_WSRF + "wsrf-WS-ResourceProperties-1.2-draft-01.xsd",
    wsbf=_OASIS_WSRF + "wsrf-WS-BaseFaults-1.2-draft-01.xsd",
    wsr=_OASIS_WSRF + "wsrf-WS-ResourceProperties-1.2-draft-01.xsd",
    fault_action=_OASIS_WSN + "wsn-WS-BaseNotification/Fault",
)

#: every older version, by wire version
LEGACY: Final[dict[WireVersion, Legacy]] = {
    WireVersion.WSN_10: WSN_10,
    WireVersion.WSN_12_DRAFT: WSN_12_DRAFT,
}


def _requests() -> dict[str, tuple[Legacy, str]]:
    """Body element (Clark name) → (version, kind of request)."""
    table: dict[str, tuple[Legacy, str]] = {}
    for legacy in LEGACY.values():
        wsnt_ops = {
            "Subscribe": "subscribe",
            "Notify": "notify",
            "GetCurrentMessage": "current",
            "PauseSubscription": "pause",
            "ResumeSubscription": "resume",
            "Pause": "producer_pause",
            "Resume": "producer_resume",
        }
        for local, kind in wsnt_ops.items():
            table[qname(legacy.wsnt, local)] = (legacy, kind)
            # 1.0 names its requests ...Request; the published 1.0 schema did not
            # (guess: accept both spellings in both versions)
            if local != "Notify":
                table[qname(legacy.wsnt, local + "Request")] = (legacy, kind)
        for local in ("RegisterPublisher", "RegisterPublisherRequest"):
            table[qname(legacy.wsnbr, local)] = (legacy, "register")
        for local in ("Destroy", "DestroyRequest"):
            table[qname(legacy.wsrl, local)] = (legacy, "destroy")
        for local in ("SetTerminationTime", "SetTerminationTimeRequest"):
            table[qname(legacy.wsrl, local)] = (legacy, "set_termination_time")
        for local in ("GetResourceProperty", "GetResourcePropertyRequest"):
            table[qname(legacy.wsrp, local)] = (legacy, "get_property")
    return table


_REQUESTS: Final = _requests()


def recognise(req: SoapRequest) -> tuple[Legacy, str] | None:
    """(version, kind) of a request in an older wire format, None for a 1.3 one."""
    return _REQUESTS.get(req.operation)


def version_named(name: str) -> WireVersion | None:
    """The wire version a ``?version=`` value names ("1.0", "1.2-draft", "1.3"), or None."""
    try:
        return WireVersion(name.strip())
    except ValueError:
        return None
