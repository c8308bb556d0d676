"""WS-N 1.3 answers and deliveries in an older WS-N wire format: a 1.3 answer translated
back, the envelope with the older version's addressing headers, a Notify to a subscriber
in the format it subscribed with.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from typing import Final

from lxml import etree
from wsnmom.core.model import Delivered, EndpointReference, SoapVersion, WireVersion

from . import codec
from .envelope import SOAP_NS, new_message_id, to_bytes
from .legacy import Legacy, local_name
from .splice import Spliced
from .xml import WSA, WSNBR, WSNT, WSRF_RL, WSRF_RP, append_serialized, parse_fragment, qname

__all__ = ["envelope_bytes", "notify_element", "reference_headers", "response"]

_D0406: Final = "http://docs.oasis-open.org/wsn/2004/06/TopicExpression/"
_DRAFT_DIALECTS: Final = {
    codec.SIMPLE: _D0406 + "Simple",
    codec.CONCRETE: _D0406 + "Concrete",
    codec.FULL: _D0406 + "Full",
}


def response(legacy: Legacy, body: etree._Element | Spliced) -> etree._Element | Spliced:
    """The 1.3 answer ``body`` as ``legacy``'s answer (the table in :mod:`.legacy`)."""
    if isinstance(body, Spliced):
        root = legacy.root(_out_tag(legacy, str(body.element.tag)))
        for child in body.element:
            root.append(child)
        return Spliced(root, body.content, body.headers)
    source = body
    tag = str(source.tag)
    root = legacy.root(_out_tag(legacy, tag))
    drop: frozenset[str] = frozenset()
    if tag == qname(WSNT, "SubscribeResponse"):
        drop = frozenset({qname(WSNT, "CurrentTime"), qname(WSNT, "TerminationTime")})
    elif tag == qname(WSNBR, "RegisterPublisherResponse"):
        drop = frozenset({qname(WSNBR, "ConsumerReference")})
    for child in list(source):
        if child.tag in drop:
            continue
        if tag == qname(WSNT, "RenewResponse"):
            renamed = local_name(child) == "TerminationTime"
            child.tag = qname(WSRF_RL, "NewTerminationTime" if renamed else "CurrentTime")
        root.append(child)
    _rename_out(legacy, root)
    return root


def _out_tag(legacy: Legacy, tag: str) -> str:
    """``legacy``'s name of the 1.3 answer element ``tag``."""
    if tag == qname(WSNT, "RenewResponse"):
        return qname(legacy.wsrl, "SetTerminationTimeResponse")
    if tag == qname(WSNBR, "RegisterPublisherResponse"):
        return qname(legacy.wsnbr, "RegisterPublisherResponse")
    ns, local = tag[1:].split("}", 1)
    table = {WSNT: legacy.wsnt, WSNBR: legacy.wsnbr, WSRF_RL: legacy.wsrl, WSRF_RP: legacy.wsrp}
    return qname(table.get(ns, ns), local)


def _rename_out(legacy: Legacy, root: etree._Element) -> None:
    """Rename every 1.3 element under ``root`` (included) to ``legacy``'s."""
    table = {
        WSNT: legacy.wsnt,
        WSNBR: legacy.wsnbr,
        WSRF_RL: legacy.wsrl,
        WSRF_RP: legacy.wsrp,
        WSA: legacy.wsa,
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


def envelope_bytes(
    legacy: Legacy,
    soap: SoapVersion,
    body: etree._Element | Spliced | None,
    *,
    action: str | None,
    relates_to: str | None = None,
    to: str | None = None,
    extra_headers: Iterable[etree._Element] = (),
) -> bytes:
    """An envelope with ``legacy``'s addressing headers around ``body``."""
    ns = SOAP_NS[soap]
    env = etree.Element(qname(ns, "Envelope"), nsmap={"s": ns, "wsa": legacy.wsa})
    header = etree.SubElement(env, qname(ns, "Header"))
    if action:
        etree.SubElement(header, qname(legacy.wsa, "Action")).text = action
    etree.SubElement(header, qname(legacy.wsa, "MessageID")).text = new_message_id()
    if relates_to:
        etree.SubElement(header, qname(legacy.wsa, "RelatesTo")).text = relates_to
    etree.SubElement(header, qname(legacy.wsa, "To")).text = to or legacy.anonymous
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


def notify_element(legacy: Legacy, deliveries: Sequence[Delivered]) -> etree._Element:
    """A Notify in ``legacy``'s version holding every delivery: per message its Topic (a
    concrete path; 1.2-draft: with the draft's Dialect URI), ProducerReference and
    Message (1.0 has no SubscriptionReference in a NotificationMessage)."""
    root = legacy.root(qname(legacy.wsnt, "Notify"))
    for d in deliveries:
        message = d.message
        holder = etree.SubElement(root, qname(legacy.wsnt, "NotificationMessage"))
        if legacy.version is not WireVersion.WSN_10 and d.subscription_reference is not None:
            _epr(legacy, holder, "SubscriptionReference", d.subscription_reference)
        if message.topic is not None:
            el = codec.add_topic(holder, qname(legacy.wsnt, "Topic"), message.topic)
            dialect = str(el.attrib.pop("Dialect", ""))
            if legacy.version is not WireVersion.WSN_10:
                el.set("Dialect", _DRAFT_DIALECTS.get(dialect, _D0406 + "Concrete"))
        if message.producer_reference is not None:
            _epr(legacy, holder, "ProducerReference", message.producer_reference)
        etree.SubElement(holder, qname(legacy.wsnt, "Message")).append(
            codec.payload_element(message)
        )
    return root


def _epr(legacy: Legacy, parent: etree._Element, local: str, epr: EndpointReference) -> None:
    el = etree.SubElement(parent, qname(legacy.wsnt, local))
    etree.SubElement(el, qname(legacy.wsa, "Address")).text = epr.address
    if epr.reference_parameters:
        props = etree.SubElement(el, qname(legacy.wsa, "ReferenceProperties"))
        append_serialized(props, epr.reference_parameters)


def reference_headers(params: Iterable[bytes]) -> list[etree._Element]:
    """Reference properties echoed as plain header blocks (WS-Addressing 2003/03 and
    2004/03 have no IsReferenceParameter marker)."""
    return [parse_fragment(p) for p in params]
