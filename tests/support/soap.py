"""Raw SOAP helpers for tests: build request envelopes as text, read responses."""

from __future__ import annotations

import base64
import json
import uuid

from lxml import etree

SOAP11 = "http://schemas.xmlsoap.org/soap/envelope/"
SOAP12 = "http://www.w3.org/2003/05/soap-envelope"
WSA = "http://www.w3.org/2005/08/addressing"
WSNT = "http://docs.oasis-open.org/wsn/b-2"
WSNBR = "http://docs.oasis-open.org/wsn/br-2"
WSRF_BF = "http://docs.oasis-open.org/wsrf/bf-2"
WSRF_R = "http://docs.oasis-open.org/wsrf/r-2"
WSRF_RP = "http://docs.oasis-open.org/wsrf/rp-2"
WSNMOM = "urn:wsnmom:ns:1"
SIMPLE = "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Simple"
CONCRETE = "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Concrete"
FULL = "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Full"
XPATH = "http://www.w3.org/TR/1999/REC-xpath-19991116"
BW = "http://docs.oasis-open.org/wsn/bw-2"

NS = {
    "s11": SOAP11,
    "s12": SOAP12,
    "wsa": WSA,
    "wsnt": WSNT,
    "wsn-br": WSNBR,
    "wsrf-bf": WSRF_BF,
    "wsrf-r": WSRF_R,
    "wsrf-rp": WSRF_RP,
    "wsnmom": WSNMOM,
}

_DECLS = (
    f'xmlns:wsa="{WSA}" xmlns:wsnt="{WSNT}" xmlns:wsn-br="{WSNBR}" '
    f'xmlns:wsrf-rp="{WSRF_RP}" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"'
)


def envelope(
    body: str,
    *,
    version: str = "1.2",
    action: str | None = None,
    to: str | None = None,
    headers: str = "",
    message_id: str | None = None,
) -> bytes:
    """A request envelope; ``body`` is the Body content as XML text using the standard
    prefixes (wsa, wsnt, wsn-br, wsrf-rp, xsi)."""
    ns = SOAP12 if version == "1.2" else SOAP11
    hdr = []
    if action:
        hdr.append(f"<wsa:Action>{action}</wsa:Action>")
    if to:
        hdr.append(f"<wsa:To>{to}</wsa:To>")
    hdr.append(f"<wsa:MessageID>{message_id or 'urn:uuid:' + str(uuid.uuid4())}</wsa:MessageID>")
    hdr.append(headers)
    return (
        f'<s:Envelope xmlns:s="{ns}" {_DECLS}><s:Header>{"".join(hdr)}</s:Header>'
        f"<s:Body>{body}</s:Body></s:Envelope>"
    ).encode()


def content_type(version: str = "1.2") -> str:
    """The Content-Type for a SOAP version."""
    return "application/soap+xml; charset=utf-8" if version == "1.2" else "text/xml; charset=utf-8"


def body_child(data: bytes) -> etree._Element:
    """First element child of the Body of a response envelope."""
    env = etree.fromstring(data)
    body = env.find("{*}Body")
    assert body is not None, data
    kids = [c for c in body if isinstance(c.tag, str)]
    assert kids, data
    return kids[0]


def fault_name(data: bytes) -> str:
    """Local name of the WS-N fault element in a fault response's detail."""
    fault = body_child(data)
    assert fault.tag.endswith("}Fault"), data
    for detail in list(fault.iter("{*}Detail")) + list(fault.iter("detail")):
        for d in detail:
            if isinstance(d.tag, str):
                return etree.QName(d).localname
    raise AssertionError(f"fault without detail: {data!r}")


def subscribe_body(
    consumer: str,
    topic: str | None = "tns:myTopic",
    *,
    ns: str = "urn:test:topics",
    dialect: str | None = SIMPLE,
    itt: str | None = None,
    extra_filter: str = "",
    policy: str = "",
    extra: str = "",
    consumer_params: str = "",
) -> str:
    """A wsnt:Subscribe body."""
    filt = ""
    if topic is not None or extra_filter:
        te = ""
        if topic is not None:
            d = f' Dialect="{dialect}"' if dialect else ""
            te = f'<wsnt:TopicExpression xmlns:tns="{ns}"{d}>{topic}</wsnt:TopicExpression>'
        filt = f"<wsnt:Filter>{te}{extra_filter}</wsnt:Filter>"
    params = (
        f"<wsa:ReferenceParameters>{consumer_params}</wsa:ReferenceParameters>"
        if consumer_params
        else ""
    )
    time = f"<wsnt:InitialTerminationTime>{itt}</wsnt:InitialTerminationTime>" if itt else ""
    pol = f"<wsnt:SubscriptionPolicy>{policy}</wsnt:SubscriptionPolicy>" if policy else ""
    return (
        f"<wsnt:Subscribe><wsnt:ConsumerReference><wsa:Address>{consumer}</wsa:Address>"
        f"{params}</wsnt:ConsumerReference>{filt}{time}{pol}{extra}</wsnt:Subscribe>"
    )


def notify_body(
    *messages: tuple[str | None, str],
    ns: str = "urn:test:topics",
    dialect: str = SIMPLE,
    producer: str | None = None,
) -> str:
    """A wsnt:Notify body with (topic, payload XML) pairs."""
    parts = []
    for topic, payload in messages:
        t = (
            f'<wsnt:Topic xmlns:tns="{ns}" Dialect="{dialect}">{topic}</wsnt:Topic>'
            if topic
            else ""
        )
        p = (
            f"<wsnt:ProducerReference><wsa:Address>{producer}</wsa:Address></wsnt:ProducerReference>"
            if producer
            else ""
        )
        parts.append(
            f"<wsnt:NotificationMessage>{t}{p}<wsnt:Message>{payload}</wsnt:Message>"
            "</wsnt:NotificationMessage>"
        )
    return "<wsnt:Notify>" + "".join(parts) + "</wsnt:Notify>"


def epr_address(el: etree._Element) -> str:
    """wsa:Address text of an EPR element."""
    addr = el.find(f"{{{WSA}}}Address")
    assert addr is not None
    return (addr.text or "").strip()


def resource_id(el: etree._Element) -> str:
    """wsnmom:ResourceId reference parameter of an EPR element."""
    rid = el.find(f"{{{WSA}}}ReferenceParameters/{{{WSNMOM}}}ResourceId")
    assert rid is not None
    return (rid.text or "").strip()


# -- natively published messages, as WS-N consumers get them --------------------------------

#: what a native client publishes in the interop tests of every middleware: JSON, binary
#: and XML bodies, in this order
NATIVE_BODIES = (
    b'{"order": 17, "total": 9.5}',
    bytes([0, 255, 7]),
    b'<order xmlns="urn:o" id="18"/>',
)


def native_message(element: etree._Element) -> tuple[str | None, str | None, str]:
    """(content type, encoding, text) of the ``wsnmom:NativeMessage`` in a Notify's
    NotificationMessage ``element``."""
    wrapper = element.find(f"wsnt:Message/{{{WSNMOM}}}NativeMessage", NS)
    assert wrapper is not None, etree.tostring(element)
    return wrapper.get("contentType"), wrapper.get("encoding"), wrapper.text or ""


def check_native_bodies(messages: list[etree._Element], path: str) -> None:
    """The NotificationMessages a consumer got for :data:`NATIVE_BODIES` published on the
    native topic ``path``: JSON and binary wrapped (text, base64), XML as it is."""
    first, second = native_message(messages[0]), native_message(messages[1])
    assert first[0] == "application/json" and json.loads(first[2]) == {"order": 17, "total": 9.5}
    assert second[:2] == ("application/octet-stream", "base64")
    assert base64.b64decode(second[2]) == bytes([0, 255, 7])
    xml = messages[2].find("wsnt:Message/{urn:o}order", NS)
    assert xml is not None and xml.get("id") == "18"
    topic = messages[0].find("wsnt:Topic", NS)
    assert topic is not None and (topic.text or "").endswith(path)
