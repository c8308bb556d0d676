"""SOAP 1.1 / 1.2 envelopes and WS-Addressing 1.0 (2005/08) headers.

Inbound: :func:`parse_request` checks the HTTP method and content type, parses the body
with the hardened parser, works out the SOAP version from the envelope namespace (the
content type only has to be one of the two SOAP media types: real clients mix them up)
and collects the addressing headers.  Transport-level problems raise :class:`HttpError`
with the HTTP status to answer (405, 415, 400; 500 for an Envelope of an unknown SOAP
version) and the SOAP version and fault code of the fault that answers them
(``faults.transport_fault``): the envelope's version when it could be read, else the one
the Content-Type names, else SOAP 1.1.

Outbound: :func:`build_envelope` wraps body elements in an envelope of the given version
with ``wsa:Action``, ``wsa:MessageID``, ``wsa:RelatesTo`` and ``wsa:To`` and any extra
header elements (echoed reference parameters).
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from lxml import etree
from wsnmom.core.model import EndpointReference, SoapVersion, WireVersion

from .splice import Spliced
from .xml import (
    SOAP11,
    SOAP12,
    WSA,
    WSA_ANONYMOUS,
    WSNMOM,
    XmlRejected,
    children,
    parse_xml,
    qname,
    serialize_standalone,
    text_of,
)

_RESOURCE_ID = f"{{{WSNMOM}}}ResourceId"

SOAP_NS: dict[SoapVersion, str] = {SoapVersion.SOAP11: SOAP11, SoapVersion.SOAP12: SOAP12}

#: media types accepted on POST (parameters such as charset/action are ignored)
ACCEPTED_MEDIA_TYPES = frozenset({"text/xml", "application/soap+xml"})


class HttpError(Exception):
    """A request refused at the HTTP level, before SOAP processing: answered with HTTP
    ``status`` and a SOAP fault of ``version`` whose code is ``code`` ("Sender", or
    "VersionMismatch" for an Envelope of another namespace)."""

    def __init__(
        self,
        status: int,
        message: str,
        version: SoapVersion | None = None,
        code: str = "Sender",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.version = version
        self.code = code


class SoapProtocolError(Exception):
    """A SOAP envelope that is well-formed but unusable (answered with a Sender fault)."""


@dataclass(slots=True)
class Addressing:
    """The WS-Addressing message addressing properties of a request."""

    to: str | None = None
    action: str | None = None
    message_id: str | None = None
    reply_to: EndpointReference | None = None
    #: non-WS-A header blocks: echoed reference parameters (marked or not) and others
    other_headers: list[etree._Element] = field(default_factory=list)

    @property
    def resource_id(self) -> str | None:
        """The resource named by an echoed ``wsnmom:ResourceId`` reference parameter (the
        EPRs the broker issues carry one), None without one."""
        for block in self.other_headers:
            if block.tag == _RESOURCE_ID:
                value = text_of(block)
                if value:
                    return value
        return None


@dataclass(slots=True)
class SoapRequest:
    """A parsed SOAP request."""

    version: SoapVersion
    envelope: etree._Element
    #: first child of the Body (the operation element)
    body: etree._Element
    addressing: Addressing
    #: the WS-N wire format it came in (an older one is rewritten into 1.3 by ``legacy``)
    wire: WireVersion = WireVersion.WSN_13

    @property
    def operation(self) -> str:
        """Clark-notation QName of the body's first child."""
        return str(self.body.tag)


def media_type(content_type: str | None) -> str:
    """The bare media type of a Content-Type header, lower-cased."""
    return (content_type or "").split(";", 1)[0].strip().lower()


def version_for_media_type(content_type: str | None) -> SoapVersion | None:
    """The SOAP version a content type indicates, or None when it is not a SOAP type."""
    mt = media_type(content_type)
    if mt == "text/xml":
        return SoapVersion.SOAP11
    if mt == "application/soap+xml":
        return SoapVersion.SOAP12
    return None


def parse_epr(el: etree._Element) -> EndpointReference:
    """An EndpointReferenceType element → EndpointReference (Address required)."""
    address: str | None = None
    params: list[bytes] = []
    metadata: bytes | None = None
    for child in children(el):
        if child.tag == qname(WSA, "Address"):
            address = text_of(child)
        elif child.tag == qname(WSA, "ReferenceParameters"):
            params.extend(serialize_standalone(p) for p in children(child))
        elif child.tag == qname(WSA, "Metadata"):
            metadata = serialize_standalone(child)
    if not address:
        raise ValueError(f"{el.tag} has no wsa:Address")
    return EndpointReference(address, tuple(params), metadata)


def parse_request(method: str, content_type: str | None, data: bytes) -> SoapRequest:
    """Check and parse an HTTP request carrying a SOAP envelope."""
    typed = version_for_media_type(content_type)
    if method.upper() != "POST":
        raise HttpError(405, "SOAP requests must be POSTed", typed)
    if media_type(content_type) not in ACCEPTED_MEDIA_TYPES:
        raise HttpError(
            415,
            "Content-Type must be text/xml (SOAP 1.1) or application/soap+xml (SOAP 1.2)",
            _sniff_version(data),
        )
    try:
        root = parse_xml(data)
    except XmlRejected as exc:
        raise HttpError(400, str(exc), typed) from None
    version = _ENVELOPE_VERSIONS.get(root.tag)
    if version is None:
        if etree.QName(root).localname == "Envelope":
            raise HttpError(
                500,
                f"{etree.QName(root).namespace or 'no namespace'} is not a SOAP envelope "
                "namespace; this endpoint speaks SOAP 1.1 and SOAP 1.2",
                typed,
                "VersionMismatch",
            )
        raise HttpError(400, "the document is not a SOAP 1.1 or 1.2 Envelope", typed)
    # the first Header and the first Body child, as root.find() would (without its path
    # parser)
    header_tag, body_tag = _PART_TAGS[version]
    header: etree._Element | None = None
    body: etree._Element | None = None
    for child in root:
        tag = child.tag
        if tag == body_tag:
            if body is None:
                body = child
        elif tag == header_tag and header is None:
            header = child
    if body is None:
        raise HttpError(400, "the SOAP Envelope has no Body", version)
    addressing = parse_addressing(header)
    ops = children(body)
    if not ops:
        raise SoapProtocolErrorWithContext(version, addressing, "the SOAP Body is empty")
    return SoapRequest(version, root, ops[0], addressing)


def _sniff_version(data: bytes) -> SoapVersion | None:
    """The SOAP version of ``data``'s Envelope, when it is one (for the fault answering a
    request whose Content-Type is wrong)."""
    try:
        root = parse_xml(data)
    except XmlRejected:
        return None
    return _ENVELOPE_VERSIONS.get(root.tag)


#: Clark name of the Envelope element -> SOAP version
_ENVELOPE_VERSIONS: dict[object, SoapVersion] = {
    qname(ns, "Envelope"): version for version, ns in SOAP_NS.items()
}
#: per SOAP version: Clark names of the Header and Body elements
_PART_TAGS: dict[SoapVersion, tuple[str, str]] = {
    version: (qname(ns, "Header"), qname(ns, "Body")) for version, ns in SOAP_NS.items()
}


class SoapProtocolErrorWithContext(SoapProtocolError):
    """A SoapProtocolError that knows the request's version and addressing."""

    def __init__(self, version: SoapVersion, addressing: Addressing, message: str) -> None:
        super().__init__(message)
        self.version = version
        self.addressing = addressing


def parse_addressing(header: etree._Element | None) -> Addressing:
    """Collect WS-A headers; everything else is kept in ``other_headers``."""
    result = Addressing()
    if header is None:
        return result
    for block in children(header):
        tag = block.tag
        if tag == _WSA_TO:
            result.to = text_of(block)
        elif tag == _WSA_ACTION:
            result.action = text_of(block)
        elif tag == _WSA_MESSAGE_ID:
            result.message_id = text_of(block)
        elif tag == _WSA_REPLY_TO:
            try:
                result.reply_to = parse_epr(block)
            except ValueError:
                result.reply_to = None
        elif isinstance(tag, str) and tag.startswith(_WSA_PREFIX):
            continue
        else:
            result.other_headers.append(block)
    return result


_WSA_TO = qname(WSA, "To")
_WSA_ACTION = qname(WSA, "Action")
_WSA_MESSAGE_ID = qname(WSA, "MessageID")
_WSA_REPLY_TO = qname(WSA, "ReplyTo")
_WSA_PREFIX = "{" + WSA + "}"


def build_envelope(
    version: SoapVersion,
    body: Sequence[etree._Element] | etree._Element | None,
    *,
    action: str | None,
    relates_to: str | None = None,
    to: str | None = None,
    message_id: str | None = None,
    extra_headers: Iterable[etree._Element] = (),
) -> etree._Element:
    """An Envelope of ``version`` with WS-A headers and the given body elements."""
    template = _ENVELOPES.get(version)
    if template is None:
        ns = SOAP_NS[version]
        template = etree.Element(qname(ns, "Envelope"), nsmap={"s": ns, "wsa": WSA})
        etree.SubElement(template, qname(ns, "Header"))
        etree.SubElement(template, qname(ns, "Body"))
        _ENVELOPES[version] = template
    env = copy.copy(template)  # cheaper than declaring the namespaces again; same bytes
    header, body_el = env[0], env[1]
    if action:
        etree.SubElement(header, qname(WSA, "Action")).text = action
    etree.SubElement(header, qname(WSA, "MessageID")).text = message_id or new_message_id()
    if relates_to:
        etree.SubElement(header, qname(WSA, "RelatesTo")).text = relates_to
    etree.SubElement(header, qname(WSA, "To")).text = to or WSA_ANONYMOUS
    for extra in extra_headers:
        header.append(extra)
    if body is None:
        pass
    elif isinstance(body, etree._Element):
        body_el.append(body)
    else:
        for item in body:
            body_el.append(item)
    return env


#: per SOAP version: an empty Envelope (Header, Body) that build_envelope copies
_ENVELOPES: dict[SoapVersion, etree._Element] = {}


def new_message_id() -> str:
    """A fresh ``urn:uuid:`` message id."""
    return f"urn:uuid:{uuid.uuid4()}"


def content_type_for(version: SoapVersion, action: str | None = None) -> str:
    """Content-Type of a message of ``version`` (SOAP 1.2 carries the action parameter)."""
    if version is SoapVersion.SOAP11:
        return "text/xml; charset=utf-8"
    if action:
        return f'application/soap+xml; charset=utf-8; action="{action}"'
    return "application/soap+xml; charset=utf-8"


def to_bytes(env: etree._Element) -> bytes:
    """Serialise an envelope as UTF-8 with an XML declaration."""
    return etree.tostring(env, encoding="utf-8", xml_declaration=True)


def envelope_bytes(
    version: SoapVersion,
    body: etree._Element | Spliced | None,
    *,
    action: str | None,
    relates_to: str | None = None,
    to: str | None = None,
    extra_headers: Iterable[etree._Element] = (),
) -> bytes:
    """:func:`build_envelope` serialised with :func:`to_bytes`; a :class:`Spliced` body
    gets its content put in place of its marker."""
    element = body.element if isinstance(body, Spliced) else body
    if isinstance(body, Spliced) and body.headers:
        extra_headers = (*extra_headers, *body.headers)
    env = build_envelope(
        version, element, action=action, relates_to=relates_to, to=to, extra_headers=extra_headers
    )
    data = to_bytes(env)
    return body.fill(data) if isinstance(body, Spliced) else data
