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
Addressing: every element of the older WS-Addressing namespace in the envelope is renamed
to WS-Addressing 1.0 (``ReferenceProperties`` becomes ``ReferenceParameters``), so ``wsa:To``
and echoed reference properties find the resource as for 1.3.  The answer is the 1.3
answer translated back (:func:`.legacy_answers.response`) inside an envelope whose
addressing headers are the older version's (:func:`.legacy_answers.envelope_bytes`); faults
are that version's (:mod:`.legacy_faults`).  A subscriber is delivered to in the format it
subscribed with (:func:`.legacy_answers.notify_element`, ``Subscription.wire_version``).

This module holds each version's namespaces and names (:class:`Legacy`, :data:`LEGACY`) and
recognises an older request (:func:`recognise`); the rewriting is in
:mod:`.legacy_requests` (requests), :mod:`.legacy_answers` (answers and deliveries) and
:mod:`.legacy_faults` (faults).

Where the specifications leave a choice open, the guess is written next to the code as
"guess:" and listed in docs/conformance.md (section "WS-Notification 1.0 and 1.2-draft").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from lxml import etree
from wsnmom.core.model import WireVersion

from .envelope import SoapRequest
from .xml import XSI, qname

__all__ = ["LEGACY", "WSN_10", "WSN_12_DRAFT", "Legacy", "local_name", "recognise", "version_named"]


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

    @property
    def wsa_namespaces(self) -> tuple[str, ...]:
        """Addressing namespaces read as this version's."""
        return (self.wsa, *self.wsa_also)

    def root(self, tag: str) -> etree._Element:
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


def local_name(el: etree._Element) -> str:
    """The local name of an element (empty for comments and processing instructions)."""
    tag = el.tag
    if not isinstance(tag, str):
        return ""
    return tag.rsplit("}", 1)[-1]


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
