"""XML plumbing of the SOAP frontend: namespace constants, a hardened parser and helpers.

Every byte that reaches the broker from the network is parsed by :func:`parse_xml`, which
refuses document type declarations (no DTD, so no entity expansion of any kind), never
touches the network, keeps libxml2's default size limits (``huge_tree`` off) and rejects
documents nested deeper than :data:`MAX_DEPTH` elements.

Payloads are kept as serialised XML that carries every namespace declaration it needs
(:func:`serialize_standalone`): a payload element cut out of a Notify must still parse on
its own, including prefixes that are only used inside text or attribute values (QNames).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any, Final, cast

from lxml import etree

# --- namespaces ------------------------------------------------------------------------
SOAP11: Final = "http://schemas.xmlsoap.org/soap/envelope/"
SOAP12: Final = "http://www.w3.org/2003/05/soap-envelope"
WSA: Final = "http://www.w3.org/2005/08/addressing"
WSAM: Final = "http://www.w3.org/2007/05/addressing/metadata"
WSNT: Final = "http://docs.oasis-open.org/wsn/b-2"
WSNBW: Final = "http://docs.oasis-open.org/wsn/bw-2"
WSNBR: Final = "http://docs.oasis-open.org/wsn/br-2"
WSNBRW: Final = "http://docs.oasis-open.org/wsn/brw-2"
WSTOP: Final = "http://docs.oasis-open.org/wsn/t-1"
WSRF_BF: Final = "http://docs.oasis-open.org/wsrf/bf-2"
WSRF_R: Final = "http://docs.oasis-open.org/wsrf/r-2"
WSRF_RP: Final = "http://docs.oasis-open.org/wsrf/rp-2"
WSRF_RPW: Final = "http://docs.oasis-open.org/wsrf/rpw-2"
WSRF_RL: Final = "http://docs.oasis-open.org/wsrf/rl-2"
XSI: Final = "http://www.w3.org/2001/XMLSchema-instance"
XSD: Final = "http://www.w3.org/2001/XMLSchema"
XML_NS: Final = "http://www.w3.org/XML/1998/namespace"
#: NCIA broker profile extension namespace (SubscriptionEndTopic, SubscriptionEnd)
NATO: Final = "http://nc3a.nato.int/ces/wsn/extension"
#: wsnmom's own elements: the ResourceId reference parameter, wrapped native messages
WSNMOM: Final = "urn:wsnmom:ns:1"
#: wsnmom broker policy assertions (GET /wsn/policy, BrokerPolicy property, WS-Policy)
WSNMOM_POLICY: Final = "urn:wsnmom:policy:1"
WSP: Final = "http://www.w3.org/ns/ws-policy"
WSU: Final = "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-utility-1.0.xsd"

#: Action of every WS-N fault (BN L201, BR L254) and of WS-RF faults
WSN_FAULT_ACTION: Final = "http://docs.oasis-open.org/wsn/fault"
WSRF_FAULT_ACTION: Final = "http://docs.oasis-open.org/wsrf/fault"
WSA_ANONYMOUS: Final = "http://www.w3.org/2005/08/addressing/anonymous"

#: preferred prefixes for the namespaces the frontend writes
PREFIXES: Final[dict[str, str]] = {
    "wsa": WSA,
    "wsnt": WSNT,
    "wsn-br": WSNBR,
    "wstop": WSTOP,
    "wsrf-bf": WSRF_BF,
    "wsrf-r": WSRF_R,
    "wsrf-rp": WSRF_RP,
    "wsrf-rl": WSRF_RL,
    "xsi": XSI,
    "wsnmom": WSNMOM,
}

#: namespaces of the envelope and protocol layers; never needed by a payload unless used
INFRASTRUCTURE_NAMESPACES: Final = frozenset(
    {SOAP11, SOAP12, WSA, WSNT, WSNBR, WSRF_BF, WSRF_R, WSRF_RP, WSNMOM}
)

#: deepest element nesting accepted in a request
MAX_DEPTH: Final = 128


class XmlRejected(ValueError):
    """The bytes are not acceptable XML (syntax error, DTD, too deep)."""


_local = threading.local()


def _parser() -> etree.XMLParser:
    parser: etree.XMLParser | None = getattr(_local, "parser", None)
    if parser is None:
        parser = etree.XMLParser(
            resolve_entities=False,
            no_network=True,
            load_dtd=False,
            dtd_validation=False,
            huge_tree=False,
            remove_pis=True,
            collect_ids=False,
        )
        _local.parser = parser
    return parser


def _check_depth(root: etree._Element, limit: int) -> None:
    """Raise :class:`XmlRejected` when an element of ``root``'s document is nested deeper
    than ``limit`` elements (``root`` counts as depth 1; comments and PIs do not count).

    One compiled XPath (``/*/*/...``, ``limit + 1`` steps) evaluated in C: each step only
    looks at the children of the previous one, so the cost is linear in the elements down
    to that depth, without a Python-level walk of the tree.
    """
    probe = _DEPTH_PROBES.get(limit)
    if probe is None:
        probe = _DEPTH_PROBES[limit] = etree.XPath("boolean(" + "/*" * (limit + 1) + ")")
    if probe(root):
        raise XmlRejected(f"XML nested deeper than {limit} elements")


#: per depth limit: an XPath that is true when an element sits below that depth
_DEPTH_PROBES: dict[int, etree.XPath] = {}


def parse_xml(data: bytes, *, max_depth: int = MAX_DEPTH) -> etree._Element:
    """Parse untrusted bytes into an element; raise :class:`XmlRejected` on anything unsafe."""
    if not data or not data.strip():
        raise XmlRejected("empty document")
    try:
        root = etree.fromstring(data, _parser())
    except etree.XMLSyntaxError as exc:
        raise XmlRejected(f"not well-formed XML: {exc}") from None
    tree = root.getroottree()
    docinfo: Any = tree.docinfo
    if docinfo.doctype or docinfo.internalDTD is not None:
        raise XmlRejected("document type declarations are not accepted")
    _check_depth(root, max_depth)
    return root


def qname(ns: str, local: str) -> str:
    """Clark notation ``{ns}local``."""
    return f"{{{ns}}}{local}"


def split_qname(tag: str) -> tuple[str | None, str]:
    """``{ns}local`` → (ns, local); a tag without namespace → (None, local)."""
    if tag.startswith("{"):
        ns, local = tag[1:].split("}", 1)
        return ns, local
    return None, tag


def children(el: etree._Element) -> list[etree._Element]:
    """Element children only (no comments or processing instructions)."""
    return [c for c in el if isinstance(c.tag, str)]


def text_of(el: etree._Element) -> str:
    """All text content of an element, stripped."""
    if len(el) == 0:  # no child nodes (elements, comments, PIs): the text is all there is
        text = el.text
        return text.strip() if text else ""
    return "".join(str(t) for t in el.itertext()).strip()


def is_nil(el: etree._Element) -> bool:
    """Whether ``xsi:nil`` is true on ``el``."""
    return el.get(qname(XSI, "nil"), "").strip() in ("true", "1")


def resolve_qname(text: str, nsmap: Mapping[str | None, str]) -> str | None:
    """Resolve a lexical QName against in-scope namespaces; None when a prefix is unbound."""
    text = text.strip()
    if not text:
        return None
    if ":" in text:
        prefix, local = text.split(":", 1)
        ns = nsmap.get(prefix)
        if ns is None or not local:
            return None
        return qname(ns, local)
    default = nsmap.get(None)
    return qname(default, text) if default else text


def serialize_standalone(el: etree._Element) -> bytes:
    """Serialise ``el`` as a standalone UTF-8 document fragment with the namespace
    declarations it needs.

    In-scope declarations of the surrounding document are copied onto the root, then the
    envelope/protocol namespaces that the fragment does not use are dropped.  Application
    namespaces are kept even when unused by element or attribute names, because a payload
    may use their prefixes inside QName-valued text.

    The common case takes one C serialisation and a few byte operations
    (:func:`_serialize_fast`); anything unusual falls back to the general path (re-parse,
    walk, ``cleanup_namespaces``), which gives the same bytes.
    """
    fast = _serialize_fast(el)
    return fast if fast is not None else _serialize_general(el)


def _serialize_fast(el: etree._Element) -> bytes | None:
    """:func:`serialize_standalone` without re-parsing, or None when it cannot be sure.

    ``etree.tostring`` of an element already declares every in-scope namespace on the
    fragment's root.  When no descendant declares a namespace of its own (the number of
    ``xmlns`` in the output equals the in-scope declarations, so every ``xmlns`` in the
    bytes is one of the root's declarations), the general path only ever removes root
    declarations of envelope/protocol namespaces whose prefix no element or attribute name
    uses (and an unused default namespace); those are cut out of the bytes.  Any doubt (an
    element or attribute of a leaf in such a namespace, the prefix appearing after ``<`` or
    a space in a larger fragment, a default namespace the root does not use) returns None.

    What to look for and what to cut depends only on the in-scope namespaces, which are the
    same for every payload of a Notify: it is worked out once per distinct ``nsmap``
    (:func:`_fast_plan`).
    """
    tag = el.tag
    if not isinstance(tag, str):
        return None
    nsmap = el.nsmap
    key = tuple(nsmap.items())
    plan = _PLANS.get(key)
    if plan is None:
        plan = _fast_plan(nsmap)
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        _PLANS[key] = plan
    if plan is _NO_PLAN:
        return None
    data: bytes = etree.tostring(el, encoding="utf-8", with_tail=False)
    if data.count(b"xmlns") != len(key):
        return None
    default_ns, used, cut, cuts, block = plan
    if default_ns is not None and (el.prefix is not None or not tag.startswith(default_ns)):
        return None  # a default namespace the root does not use: maybe used below
    if used is None:
        return data
    if len(el) == 0:
        # a leaf (the usual payload): its own names are all there is to look at
        if tag[0] == "{" and tag[1 : tag.index("}")] in INFRASTRUCTURE_NAMESPACES:
            return None
        for name in el.keys():  # noqa: SIM118 (attribute names; iterating el gives children)
            if name[0] == "{" and name[1 : name.index("}")] in INFRASTRUCTURE_NAMESPACES:
                return None
    elif used.search(data) is not None:
        return None  # perhaps used by a name (or just text that looks like one)
    if block:
        # the declarations to cut, as lxml writes them when they are adjacent
        cut_data = data.replace(block, b"", 1)
        if len(cut_data) == len(data) - len(block):
            return cut_data
    assert cut is not None
    data, n = cut.subn(b"", data, count=cuts)
    return data if n == cuts else None


#: see :func:`_fast_plan`
_Plan = tuple[str | None, re.Pattern[bytes] | None, re.Pattern[bytes] | None, int, bytes]
#: the plan of in-scope namespaces that always take the general path
_NO_PLAN: Final[_Plan] = (None, None, None, -1, b"")
#: fast-path plans by in-scope namespaces (``tuple(nsmap.items())``)
_PLANS: dict[tuple[tuple[str | None, str], ...], _Plan] = {}
_MAX_PLANS: Final = 256


def _fast_plan(nsmap: Mapping[str | None, str]) -> _Plan:
    """What :func:`_serialize_fast` checks and cuts for an element with these in-scope
    namespaces: ``(default, used, cut, cuts, block)``.

    ``default`` is ``{uri}`` of an application default namespace (the root must be in it),
    ``used`` finds an envelope/protocol prefix used by an element or attribute name (lxml
    writes ``<p:`` and `` p:``), ``cut`` matches the root's declarations of those prefixes
    (``cuts`` of them; ``None`` when there is nothing to cut) and ``block`` is those
    declarations as one byte string when they are adjacent in ``nsmap`` (lxml declares
    the in-scope namespaces in that order), else empty.  :data:`_NO_PLAN` when an
    envelope/protocol namespace is the default namespace.
    """
    default: str | None = None
    prefixes: list[str] = []
    positions: list[int] = []
    for position, (prefix, uri) in enumerate(nsmap.items()):
        if uri in INFRASTRUCTURE_NAMESPACES:
            if prefix is None:
                return _NO_PLAN
            prefixes.append(prefix)
            positions.append(position)
        elif prefix is None:
            default = "{" + uri + "}"
    if not prefixes:
        return (default, None, None, 0, b"")
    names = b"|".join(re.escape(p.encode()) for p in prefixes)
    used = re.compile(b"[< ](?:" + names + b"):")
    cut = re.compile(b" xmlns:(?:" + names + b')="[^"]*"')
    block = b""
    if positions[-1] - positions[0] == len(positions) - 1:
        block = b"".join(f' xmlns:{p}="{nsmap[p]}"'.encode() for p in prefixes)
    return (default, used, cut, len(prefixes), block)


def _serialize_general(el: etree._Element) -> bytes:
    """The general path of :func:`serialize_standalone`."""
    copy = etree.fromstring(etree.tostring(el))  # re-rooted: inherits in-scope nsmap
    keep = sorted(
        {
            p
            for el in copy.iter()
            if isinstance(el.tag, str)
            for p, uri in el.nsmap.items()
            if p and uri not in INFRASTRUCTURE_NAMESPACES
        }
    )
    etree.cleanup_namespaces(copy, keep_ns_prefixes=keep)
    return etree.tostring(copy, encoding="utf-8")


def parse_fragment(data: bytes) -> etree._Element:
    """Parse a fragment the broker produced or stored (still hardened)."""
    return parse_xml(data, max_depth=MAX_DEPTH * 2)


def sub(
    parent: etree._Element,
    tag: str,
    text: str | None = None,
    attrib: Mapping[str, str] | None = None,
    nsmap: Mapping[str | None, str] | None = None,
) -> etree._Element:
    """Append a child element with optional text."""
    child = etree.SubElement(
        parent, tag, attrib=dict(attrib or {}), nsmap=cast(Any, dict(nsmap or {}))
    )
    if text is not None:
        child.text = text
    return child


def element(
    tag: str,
    text: str | None = None,
    nsmap: Mapping[str | None, str] | None = None,
) -> etree._Element:
    """A new element using the preferred prefixes."""
    el = etree.Element(tag, nsmap=cast(Any, dict(nsmap) if nsmap is not None else dict(PREFIXES)))
    if text is not None:
        el.text = text
    return el


def append_serialized(parent: etree._Element, fragments: Iterable[bytes]) -> None:
    """Parse stored fragments and append them to ``parent``."""
    for frag in fragments:
        parent.append(parse_fragment(frag))
