"""XML plumbing of the SOAP frontend: namespace constants, a hardened parser and helpers.

Every byte that reaches the broker from the network is parsed by :func:`parse_xml`, which
refuses document type declarations (no DTD, so no entity expansion of any kind), never
touches the network or a file (``core.safe_xml``), keeps libxml2's default size limits
(``huge_tree`` off) and rejects documents nested deeper than :data:`MAX_DEPTH` elements.

Payloads are kept as serialised XML that carries every namespace declaration it needs
(:func:`serialize_standalone`): a payload element cut out of a Notify must still parse on
its own, including prefixes that are only used inside text or attribute values (QNames).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, NamedTuple, cast

from lxml import etree
from wsnmom.core.per_thread import PerThread
from wsnmom.core.safe_xml import hardened_parser

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
#: the ONVIF event service (soap_frontend.onvif, client.onvif)
TEV: Final = "http://www.onvif.org/ver10/events/wsdl"
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


def _new_parser() -> etree.XMLParser:
    return hardened_parser(remove_pis=True, collect_ids=False)


#: one parser per request thread: a shared lxml parser serialises its callers
_PARSERS: Final[PerThread[etree.XMLParser]] = PerThread(_new_parser)


def _check_depth(root: etree._Element, limit: int) -> None:
    """Raise :class:`XmlRejected` when an element of ``root``'s document is nested deeper
    than ``limit`` elements (``root`` counts as depth 1; comments and PIs do not count).

    One compiled XPath (``/*/*/...``, ``limit + 1`` steps) evaluated in C: each step only
    looks at the children of the previous one, so the cost is linear in the elements down
    to that depth, without a Python-level walk of the tree.
    """
    probes = _DEPTH_PROBES.get(limit)
    if probes is None:
        expression = "boolean(" + "/*" * (limit + 1) + ")"
        probes = _DEPTH_PROBES[limit] = PerThread(lambda: etree.XPath(expression))
    if probes.get()(root):
        raise XmlRejected(f"XML nested deeper than {limit} elements")


#: per depth limit: an XPath that is true when an element sits below that depth (one
#: compiled copy per thread, as a compiled XPath serialises its callers)
_DEPTH_PROBES: dict[int, PerThread[etree.XPath]] = {}


def parse_xml(data: bytes, *, max_depth: int = MAX_DEPTH) -> etree._Element:
    """Parse untrusted bytes into an element; raise :class:`XmlRejected` on anything unsafe."""
    if not data or not data.strip():
        raise XmlRejected("empty document")
    try:
        root = etree.fromstring(data, _PARSERS.get())
    except etree.XMLSyntaxError as exc:
        raise XmlRejected(f"not well-formed XML: {exc}") from None
    tree = root.getroottree()
    docinfo: Any = tree.docinfo
    if docinfo.doctype or docinfo.internalDTD is not None:
        raise XmlRejected("document type declarations are not accepted")
    if len(data) >= _MIN_DEPTH_BYTES * max_depth:
        _check_depth(root, max_depth)
    return root


#: a document nested deeper than ``limit`` elements is at least ``7 * limit + 4`` bytes
#: (each enclosing element at least ``<a>`` + ``</a>``, the innermost ``<a/>``), so
#: shorter ones need no depth probe
_MIN_DEPTH_BYTES = 7


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

    ``etree.tostring`` of an element declares every in-scope namespace on the fragment's
    root.  When no descendant declares a namespace of its own, the general path only ever
    removes root declarations of envelope/protocol namespaces whose prefix no element or
    attribute name uses (and an unused default namespace); those are cut out of the bytes.

    A leaf (the usual payload) has no descendants, and its names are its tag and
    attributes, which are checked directly.  For a larger fragment, the number of
    ``xmlns`` in the bytes must equal the in-scope declarations (so no descendant declares
    any, and every ``xmlns`` is a root declaration), and no envelope/protocol prefix may
    follow ``<`` or a space anywhere.  Any doubt (also: a default namespace the root does
    not use) returns None.

    What to look for and what to cut depends only on the in-scope namespaces, which are the
    same for every payload of a Notify: it is worked out once per distinct ``nsmap``
    (:func:`_fast_plan`).
    """
    tag = el.tag
    if not isinstance(tag, str):
        return None
    global _last_plan
    nsmap = el.nsmap
    last_nsmap, plan = _last_plan
    if nsmap != last_nsmap:
        key = tuple(nsmap.items())
        found = _PLANS.get(key)
        if found is None:
            found = _fast_plan(nsmap)
            if len(_PLANS) >= _MAX_PLANS:
                _PLANS.clear()
            _PLANS[key] = found
        plan = found
        _last_plan = (nsmap, plan)
    if plan is None:
        return None
    default_ns, prefixes, used, cut, block = plan
    if default_ns is not None and (el.prefix is not None or not tag.startswith(default_ns)):
        return None  # a default namespace the root does not use: maybe used below
    data: bytes
    if len(el) == 0:
        if prefixes:
            if el.prefix in prefixes:
                return None
            for attribute in el.keys():  # noqa: SIM118 (names; iterating el gives children)
                name = str(attribute)
                if name[0] == "{" and name[1 : name.index("}")] in INFRASTRUCTURE_NAMESPACES:
                    return None
        data = etree.tostring(el, encoding="utf-8", with_tail=False)
        if not prefixes:
            return data
    else:
        data = etree.tostring(el, encoding="utf-8", with_tail=False)
        if data.count(b"xmlns") != len(nsmap):
            return None
        if not prefixes:
            return data
        assert used is not None
        if used.search(data) is not None:
            return None  # perhaps used by a name (or just text that looks like one)
    if block:
        # the declarations to cut, as lxml writes them when they are adjacent
        cut_data = data.replace(block, b"", 1)
        if len(cut_data) == len(data) - len(block):
            return cut_data
    assert cut is not None
    data, n = cut.subn(b"", data, count=len(prefixes))
    return data if n == len(prefixes) else None


class _Plan(NamedTuple):
    """What :func:`_serialize_fast` checks and cuts for one set of in-scope namespaces."""

    #: ``{uri}`` of an application default namespace (the root must be in it), or None
    default: str | None
    #: the prefixes bound to envelope/protocol namespaces: their declarations are cut
    prefixes: frozenset[str]
    #: finds such a prefix used by an element or attribute name (lxml writes ``<p:`` and
    #: `` p:``); None when there are no such prefixes
    used: re.Pattern[bytes] | None
    #: matches the root's declarations of those prefixes
    cut: re.Pattern[bytes] | None
    #: those declarations as one byte string when they are adjacent in ``nsmap`` (lxml
    #: declares the in-scope namespaces in that order), else empty
    block: bytes


#: fast-path plans by in-scope namespaces (``tuple(nsmap.items())``); None: take the
#: general path (an envelope/protocol namespace is the default namespace)
_PLANS: dict[tuple[tuple[str | None, str], ...], _Plan | None] = {}
_MAX_PLANS: Final = 256
#: the in-scope namespaces of the last element planned for, and its plan: consecutive
#: payloads of a Notify usually share them (dict equality; a plan does not depend on the
#: order of the declarations, only its ``block`` shortcut does, and that is verified on
#: the bytes).  Replaced as a whole: safe to read from any thread.
_last_plan: tuple[dict[str | None, str], _Plan | None] = (
    {},
    _Plan(None, frozenset(), None, None, b""),
)


def _fast_plan(nsmap: Mapping[str | None, str]) -> _Plan | None:
    """The :class:`_Plan` for elements with these in-scope namespaces (None: always take
    the general path)."""
    default: str | None = None
    prefixes: list[str] = []
    positions: list[int] = []
    for position, (prefix, uri) in enumerate(nsmap.items()):
        if uri in INFRASTRUCTURE_NAMESPACES:
            if prefix is None:
                return None
            prefixes.append(prefix)
            positions.append(position)
        elif prefix is None:
            default = "{" + uri + "}"
    if not prefixes:
        return _Plan(default, frozenset(), None, None, b"")
    names = b"|".join(re.escape(p.encode()) for p in prefixes)
    block = b""
    if positions[-1] - positions[0] == len(positions) - 1:
        block = b"".join(f' xmlns:{p}="{nsmap[p]}"'.encode() for p in prefixes)
    return _Plan(
        default,
        frozenset(prefixes),
        re.compile(b"[< ](?:" + names + b"):"),
        re.compile(b" xmlns:(?:" + names + b')="[^"]*"'),
        block,
    )


def _serialize_general(el: etree._Element) -> bytes:
    """The general path of :func:`serialize_standalone`."""
    data = etree.tostring(el)
    copy = etree.fromstring(data)  # re-rooted: inherits in-scope nsmap
    keep = sorted(
        {
            p
            for el in copy.iter()
            if isinstance(el.tag, str)
            for p, uri in el.nsmap.items()
            if p and uri not in INFRASTRUCTURE_NAMESPACES
        }
    )
    made = drop_unused_namespaces(copy, keep, undeclaring=UNDECLARATION in data)
    return etree.tostring(made, encoding="utf-8")


#: how lxml writes an element's undeclaration of the default namespace
UNDECLARATION: Final = b'xmlns=""'


def drop_unused_namespaces(
    root: etree._Element, keep: Sequence[str], *, undeclaring: bool
) -> etree._Element:
    """``root`` (a document's root) without the namespace declarations no element or
    attribute name uses, but those of the prefixes ``keep``: ``etree.cleanup_namespaces``,
    which changes ``root`` in place, unless ``undeclaring`` (:data:`UNDECLARATION` is in
    the bytes ``root`` was parsed from: an element may undeclare the default namespace).
    ``cleanup_namespaces`` drops such an undeclaration (libxml2 sees no name using it),
    and the element would be read back in its parent's default namespace; then only the
    root's declarations are cleaned (those ``cleanup_namespaces`` keeps on it, found on a
    copy), the root is made anew with them and the children moved under it, the
    descendants keeping their declarations.  Returns the element to serialise."""
    if not undeclaring:
        etree.cleanup_namespaces(root, keep_ns_prefixes=list(keep))
        return root
    probe = etree.fromstring(etree.tostring(root))
    etree.cleanup_namespaces(probe, keep_ns_prefixes=list(keep))
    made = etree.Element(
        root.tag, attrib={str(k): str(v) for k, v in root.items()}, nsmap=cast(Any, probe.nsmap)
    )
    made.text = root.text
    for child in list(root):
        made.append(child)  # its tail moves with it
    return made


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
