"""Values the WS-N client sends and receives: topic expressions, outgoing messages, received
notifications, termination times.

A topic expression is text plus the namespace prefixes it uses::

    TopicExpression("tns:sensors/temperature", {"tns": "urn:example:topics"})
    TopicExpression.parse("{urn:example:topics}sensors/temperature")   # the same topic

Without an explicit ``dialect`` one is chosen from the text: Simple for a root topic, Concrete
for a path, Full as soon as a wildcard (``*``, ``//``) or a union (``|``) appears.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Final

import isodate
from lxml import etree

from wsnmom.core.codec import WSNMOM_NS, wrap_native
from wsnmom.core.model import EndpointReference, ExpressionSource
from wsnmom.soap_frontend.faults import xsd_datetime
from wsnmom.soap_frontend.xml import (
    UNDECLARATION,
    XmlRejected,
    drop_unused_namespaces,
    parse_xml,
    serialize_standalone,
)
from wsnmom.topic_mapping.dialects import CONCRETE, FULL, ONVIF_CONCRETE_SET, SIMPLE, XPATH

__all__ = [
    "CONCRETE",
    "FULL",
    "NO_TERMINATION",
    "ONVIF_CONCRETE_SET",
    "SIMPLE",
    "XPATH",
    "EndpointReference",
    "Message",
    "Notification",
    "Payload",
    "TerminationTime",
    "TopicExpression",
    "payload_element",
    "termination_text",
    "text_payload",
    "tidy_xml",
]


class _NoTermination:
    """``xsi:nil`` termination time: no scheduled termination (if the broker allows it)."""

    def __repr__(self) -> str:
        return "NO_TERMINATION"


#: ask for a resource that never expires (sent as ``xsi:nil="true"``)
NO_TERMINATION: Final = _NoTermination()

#: a requested termination time: an absolute time (naive = UTC), a lifetime from now, an
#: xsd:dateTime or xsd:duration text, or :data:`NO_TERMINATION`
TerminationTime = datetime | timedelta | str | _NoTermination


def termination_text(value: datetime | timedelta | str) -> str:
    """The xsd:dateTime or xsd:duration text of a requested termination time."""
    if isinstance(value, datetime):
        return xsd_datetime(value)
    if isinstance(value, timedelta):
        return str(isodate.duration_isoformat(value))
    return value.strip()


_CLARK = re.compile(r"\{([^{}]*)\}")


@dataclass(frozen=True, slots=True)
class TopicExpression:
    """A WS-Topics topic expression: its text, the prefixes it uses and its dialect."""

    text: str
    #: prefix -> namespace URI for every prefix the text uses
    namespaces: Mapping[str, str] = field(default_factory=dict)
    #: dialect URI; None: chosen from the text (see :attr:`effective_dialect`)
    dialect: str | None = None

    @classmethod
    def parse(
        cls,
        value: str | TopicExpression,
        namespaces: Mapping[str, str] | None = None,
        dialect: str | None = None,
    ) -> TopicExpression:
        """A topic expression from ``prefix:path`` text (prefixes from ``namespaces``) or
        Clark notation ``{uri}path`` (``{urn:a}x | {urn:b}y//*``: each URI gets a prefix)."""
        if isinstance(value, TopicExpression):
            # prefixes the expression uses without binding them come from ``namespaces``
            extra = {
                p: u
                for p, u in (namespaces or {}).items()
                if p not in value.namespaces and _uses_prefix(value.text, p)
            }
            if not extra and (dialect is None or value.dialect == dialect):
                return value
            return TopicExpression(
                value.text, {**value.namespaces, **extra}, dialect or value.dialect
            )
        bound = dict(namespaces or {})
        by_uri: dict[str, str] = {}

        def prefix_for(match: re.Match[str]) -> str:
            uri = match.group(1)
            prefix = by_uri.get(uri)
            if prefix is None:
                prefix = next(
                    (p for p, u in bound.items() if u == uri),
                    None,
                ) or _fresh_prefix(bound)
                bound[prefix] = uri
                by_uri[uri] = prefix
            return prefix + ":"

        text = _CLARK.sub(prefix_for, value.strip())
        used = {p: u for p, u in bound.items() if _uses_prefix(text, p)}
        return cls(text, used, dialect)

    @property
    def effective_dialect(self) -> str:
        """The dialect URI sent: the explicit one, else Simple / Concrete / Full by shape."""
        if self.dialect is not None:
            return self.dialect
        if any(token in self.text for token in ("*", "//", "|")):
            return FULL
        return CONCRETE if "/" in self.text else SIMPLE

    @classmethod
    def from_source(cls, source: ExpressionSource) -> TopicExpression:
        """A received expression (text, dialect and in-scope namespaces) as sent on."""
        used = {
            str(p): u for p, u in source.namespaces.items() if p and _uses_prefix(source.text, p)
        }
        return cls(source.text, used, source.dialect)

    def __str__(self) -> str:
        """Clark notation of the expression (prefixes replaced by ``{uri}``)."""
        text = self.text
        for prefix, uri in self.namespaces.items():
            text = re.sub(rf"(?<![\w.-]){re.escape(prefix)}:", "{" + uri + "}", text)
        return text


def _uses_prefix(text: str, prefix: str) -> bool:
    return re.search(rf"(?<![\w.-]){re.escape(prefix)}:", text) is not None


def tidy_xml(el: etree._Element) -> bytes:
    """``el`` serialised standalone, without the namespace declarations it does not use.

    A declaration is kept when an element or attribute name uses it, or when its prefix is
    followed by ``:`` in some text or attribute value (it may be a QName there)."""
    data = serialize_standalone(el)
    copy = etree.fromstring(data)
    values = [t for node in copy.iter() for t in (node.text, node.tail) if t] + [
        v for node in copy.iter() if isinstance(node.tag, str) for v in node.attrib.values()
    ]
    blob = "\n".join(str(v) for v in values)
    keep = sorted(
        {
            p
            for node in copy.iter()
            if isinstance(node.tag, str)
            for p in node.nsmap
            if p and f"{p}:" in blob
        }
    )
    made = drop_unused_namespaces(copy, keep, undeclaring=UNDECLARATION in data)
    return etree.tostring(made, encoding="utf-8")


def _fresh_prefix(bound: Mapping[str, str]) -> str:
    for candidate in ("tns", *(f"ns{i}" for i in range(1, 1000))):
        if candidate not in bound:
            return candidate
    raise ValueError("too many namespaces in one topic expression")  # pragma: no cover


#: what can be sent as a notification payload: an element, or XML text/bytes of one element
Payload = etree._Element | str | bytes


def payload_element(payload: Payload) -> etree._Element:
    """The payload as an element; XML text must be exactly one element (ValueError else:
    use :func:`text_payload` for non-XML content)."""
    if isinstance(payload, etree._Element):
        return payload
    data = payload.encode("utf-8") if isinstance(payload, str) else payload
    try:
        return parse_xml(data)
    except XmlRejected as exc:
        raise ValueError(
            f"the payload is not one XML element ({exc}); wrap text or binary content "
            "with wsnmom.client.text_payload()"
        ) from None


def text_payload(data: str | bytes, content_type: str = "text/plain") -> etree._Element:
    """Non-XML content wrapped as the gateway wraps native messages
    (``<wsnmom:NativeMessage contentType=... encoding="text|base64">``)."""
    body = data.encode("utf-8") if isinstance(data, str) else data
    return parse_xml(wrap_native(body, content_type))


@dataclass(frozen=True, slots=True)
class Message:
    """One notification to send with ``notify``."""

    payload: Payload
    topic: TopicExpression | str | None = None
    #: the publisher's endpoint (``wsnt:ProducerReference``)
    producer: EndpointReference | str | None = None
    #: application headers, carried as middleware headers to every consumer (a wsnmom
    #: gateway's ``wsnmom:Messages`` SOAP header; other brokers ignore it)
    headers: Mapping[str, str] | None = None


_NATIVE = f"{{{WSNMOM_NS}}}NativeMessage"


@dataclass(slots=True)
class Notification:
    """A notification received (pushed to a consumer, pulled, or a current message)."""

    #: the payload element (the content of ``wsnt:Message``, or the whole Body when raw)
    payload: etree._Element
    #: the topic it was published on (None: raw delivery or no topic)
    topic: TopicExpression | None = None
    subscription_reference: EndpointReference | None = None
    producer_reference: EndpointReference | None = None
    #: delivered raw (UseRaw): the payload was the SOAP Body itself, no wsnt:Notify
    raw: bool = False
    #: the URL path it was posted to (consumer server only)
    path: str = ""
    #: SOAP header blocks besides WS-Addressing (echoed reference parameters)
    headers: tuple[etree._Element, ...] = ()
    #: the broker's message id and publication time (xsd:dateTime), where a wsnmom gateway
    #: sent them (its ``wsnmom:Messages`` header; consumer server only)
    message_id: str | None = None
    published: str | None = None
    #: the publisher's application headers (a wsnmom gateway's ``wsnmom:Messages`` header)
    app_headers: dict[str, str] = field(default_factory=dict)

    @property
    def payload_xml(self) -> bytes:
        """The payload serialised on its own, declaring the namespaces it uses: in element
        and attribute names, or as a ``prefix:`` inside text or attribute values (QNames).
        Declarations it inherited from the envelope and does not use are left out."""
        return tidy_xml(self.payload)

    @property
    def is_native(self) -> bool:
        """The payload is non-XML content wrapped in ``wsnmom:NativeMessage``."""
        return self.payload.tag == _NATIVE

    @property
    def content_type(self) -> str:
        """``application/xml``, or the content type of a wrapped native message."""
        if self.is_native:
            return self.payload.get("contentType") or "application/octet-stream"
        return "application/xml"

    @property
    def data(self) -> bytes:
        """The content: a native message unwrapped (text or base64 decoded), else the XML."""
        if self.is_native:
            text = self.payload.text or ""
            if self.payload.get("encoding") == "base64":
                return base64.b64decode(text)
            return text.encode("utf-8")
        return self.payload_xml

    @property
    def subscription_address(self) -> str | None:
        """Address of the subscription that delivered it, when the broker said."""
        ref = self.subscription_reference
        return ref.address if ref is not None else None
