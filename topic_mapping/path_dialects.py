"""TopicExpression dialect URIs, and the parser of the path dialects: Simple, Concrete, Full
and ONVIF's ConcreteSet (the XPath dialect is in ``xpath_dialect``; ``dialects`` chooses
between them).

Every accepted dialect URI is normalised to one of five canonical URIs (the WS-Topics 1.3
ones, XPath 1.0 and ONVIF's ConcreteSet).  The WS-Topics 1.0 (2004/03, IBM namespace) and
WSN 1.2 draft (2004/06) URIs are exact-match aliases; URIs are compared case-sensitively.

Parsing resolves namespace prefixes against the namespace declarations that were in scope
on the carrying element and produces a :class:`~wsnmom.topic_mapping.model.TopicExpression`
whose branches are :class:`~wsnmom.topic_mapping.model.PathPattern` values.  Prefixes are
never kept.

Grammar accepted for the Full dialect (WS-Topics 1.3, ``t-1.xsd``)::

    TopicPathExpression  ::= TopicPath ( S? '|' S? TopicPath )*
    TopicPath            ::= RootTopic ChildTopicExpression*
    RootTopic            ::= (NCName ':')? ('//')? (NCName | '*')
    ChildTopicExpression ::= '/' '/'? (QName | NCName | '*' | '.')

Whitespace is allowed around ``|`` only (the specs' own examples write ``a | b``).  A
prefixed child step (allowed by the 1.3 schema) must resolve to the namespace of its root:
a topic tree lives in one namespace, so ``tns:t1/xyz:t2`` is rejected.  An unprefixed root
uses the in-scope default namespace; with no default namespace declared it is an
InvalidTopicExpression.

ONVIF's ConcreteSet dialect (``http://www.onvif.org/ver10/tev/topicExpression/ConcreteSet``,
what ONVIF event clients subscribe with) is a union of Concrete paths::

    ConcreteSetExpression ::= ConcretePath ( S? '|' S? ConcretePath )*
    ConcretePath          ::= QName ( '/' (QName | NCName) )* ( '//.' )?

No ``*`` and no ``//`` inside a path; the one extension is a trailing ``//.`` ("this topic
and everything below it"), which ONVIF's own examples use (``tns1:RuleEngine//.``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from lxml import etree

from .errors import InvalidTopicExpression, TopicExpressionDialectUnknown
from .model import ANY, DEEP, PathPattern, Segment

__all__ = [
    "CONCRETE",
    "DIALECT_ALIASES",
    "FULL",
    "NCNAME_PATTERN",
    "NCNAME_RE",
    "ONVIF_CONCRETE_SET",
    "SIMPLE",
    "SUPPORTED_DIALECTS",
    "XPATH",
    "canonical_dialect",
    "element_text",
    "is_ncname",
    "is_single_qname",
    "parse_path_dialect",
]

SIMPLE: Final = "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Simple"
CONCRETE: Final = "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Concrete"
FULL: Final = "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Full"
XPATH: Final = "http://www.w3.org/TR/1999/REC-xpath-19991116"
#: ONVIF's topic expression dialect: a union (``|``) of concrete paths
ONVIF_CONCRETE_SET: Final = "http://www.onvif.org/ver10/tev/topicExpression/ConcreteSet"

_T10 = "http://www.ibm.com/xmlns/stdwip/web-services/WS-Topics/TopicExpression/"
_D0406 = "http://docs.oasis-open.org/wsn/2004/06/TopicExpression/"

#: Older dialect URIs (exact, case-sensitive) and the canonical URI each one means.
DIALECT_ALIASES: Final[dict[str, str]] = {
    _T10 + "simple": SIMPLE,
    _T10 + "concreteTopicPath": CONCRETE,
    _T10 + "FullTopicPath": FULL,
    _D0406 + "Simple": SIMPLE,
    _D0406 + "Concrete": CONCRETE,
    _D0406 + "Full": FULL,
}

#: Every dialect URI this engine accepts (the TopicExpressionDialect resource property).
SUPPORTED_DIALECTS: Final[tuple[str, ...]] = (
    SIMPLE,
    CONCRETE,
    FULL,
    XPATH,
    ONVIF_CONCRETE_SET,
    *DIALECT_ALIASES,
)

_CANONICAL = frozenset((SIMPLE, CONCRETE, FULL, XPATH, ONVIF_CONCRETE_SET))

_DIALECT_NAMES: Final[dict[str, str]] = {
    SIMPLE: "Simple",
    CONCRETE: "Concrete",
    FULL: "Full",
    XPATH: "XPath",
    ONVIF_CONCRETE_SET: "ConcreteSet",
}

#: dialects whose expressions may be unions of paths (``a | b``)
_UNION_DIALECTS = frozenset((FULL, ONVIF_CONCRETE_SET))

# XML 1.0 (5th edition) NameStartChar and NameChar, without ':'.
_NAME_START = (
    "A-Z_a-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u02ff\u0370-\u037d\u037f-\u1fff"
    "\u200c-\u200d\u2070-\u218f\u2c00-\u2fef\u3001-\ud7ff\uf900-\ufdcf\ufdf0-\ufffd"
    "\U00010000-\U000effff"
)
_NAME_CHAR = _NAME_START + r"\-.0-9\u00b7\u0300-\u036f\u203f-\u2040"
NCNAME_PATTERN = f"[{_NAME_START}][{_NAME_CHAR}]*"

#: Compiled NCName pattern (use ``fullmatch``).
NCNAME_RE: Final = re.compile(NCNAME_PATTERN)
_QNAME_RE: Final = re.compile(f"(?:({NCNAME_PATTERN}):)?({NCNAME_PATTERN})")
_NAME_CHAR_RE: Final = re.compile(f"[{_NAME_CHAR}]")


def is_ncname(name: str) -> bool:
    """True when ``name`` is an XML NCName."""
    return NCNAME_RE.fullmatch(name) is not None


def canonical_dialect(dialect: str) -> str:
    """The canonical URI for an accepted dialect URI, else TopicExpressionDialectUnknown."""
    if dialect in _CANONICAL:
        return dialect
    try:
        return DIALECT_ALIASES[dialect]
    except KeyError:
        raise TopicExpressionDialectUnknown(
            f"TopicExpression dialect {dialect!r} is not supported; supported dialects: "
            + ", ".join(SUPPORTED_DIALECTS)
        ) from None


def _default_namespace(namespaces: Mapping[str | None, str]) -> str | None:
    uri = namespaces.get(None)
    if uri is None:
        uri = namespaces.get("")
    return uri or None  # xmlns="" undeclares the default namespace


class _Parser:
    """Scanner for the Simple, Concrete and Full grammars (one instance per parse)."""

    def __init__(self, text: str, dialect: str, namespaces: Mapping[str | None, str]) -> None:
        self.text = text
        self.dialect = dialect
        self.name = _DIALECT_NAMES[dialect]
        self.namespaces = namespaces
        self.pos = 0

    # -- error reporting -------------------------------------------------------------------
    def fail(self, reason: str, pos: int | None = None) -> InvalidTopicExpression:
        at = self.pos if pos is None else pos
        if at >= len(self.text):
            where = "at end of expression"
        else:
            token = self.text[at : at + 12]
            where = f"at position {at} (near {token!r})"
        return InvalidTopicExpression(
            f"invalid {self.name} TopicExpression {self.text!r}: {reason} {where}"
        )

    # -- lexical helpers -------------------------------------------------------------------
    def peek(self, s: str) -> bool:
        return self.text.startswith(s, self.pos)

    def ncname(self) -> str | None:
        m = NCNAME_RE.match(self.text, self.pos)
        if m is None:
            return None
        self.pos = m.end()
        return m.group(0)

    def resolve(self, prefix: str | None, pos: int) -> str:
        if prefix is None:
            uri = _default_namespace(self.namespaces)
            if uri is None:
                raise self.fail("unprefixed root topic and no default namespace is declared", pos)
            return uri
        uri = self.namespaces.get(prefix)
        if not uri:
            raise self.fail(f"namespace prefix {prefix!r} is not declared", pos)
        return uri

    # -- grammar ---------------------------------------------------------------------------
    def parse(self) -> tuple[PathPattern, ...]:
        if not self.text:
            raise self.fail("empty expression")
        branches: list[PathPattern] = []
        while True:
            branches.append(self.path())
            if self.pos == len(self.text):
                break
            start = self.pos
            while self.pos < len(self.text) and self.text[self.pos].isspace():
                self.pos += 1
            if self.peek("|"):
                if self.dialect not in _UNION_DIALECTS:
                    raise self.fail(f"union '|' is not allowed in the {self.name} dialect")
                self.pos += 1
                while self.pos < len(self.text) and self.text[self.pos].isspace():
                    self.pos += 1
                continue
            if self.pos > start:
                raise self.fail("whitespace is only allowed around '|'", start)
            raise self.fail(f"unexpected character {self.text[self.pos]!r}")
        return tuple(branches)

    def path(self) -> PathPattern:
        start = self.pos
        prefix: str | None = None
        segments: list[Segment] = []
        if not (self.peek("//") or self.peek("*")):
            name = self.ncname()
            if name is None:
                raise self.fail("expected a topic name (NCName), '*' or '//'")
            if self.peek(":"):
                prefix = name
                self.pos += 1
            else:
                segments.append(name)
        namespace = self.resolve(prefix, start)
        if not segments:
            if self.peek("//"):
                self.forbid_wildcard("descendant '//'")
                self.pos += 2
                segments.append(DEEP)
            if self.peek("*"):
                self.forbid_wildcard("wildcard '*'")
                self.pos += 1
                segments.append(ANY)
            else:
                name = self.ncname()
                if name is None:
                    raise self.fail("expected a root topic name (NCName) or '*'")
                if self.peek(":"):
                    raise self.fail("a namespace prefix must come first (write 'p://x')")
                segments.append(name)
        while self.peek("/"):
            if self.dialect == SIMPLE:
                raise self.fail("the Simple dialect names a root topic only; '/' is not allowed")
            step_pos = self.pos
            self.pos += 1
            if self.peek("/") and self.dialect == ONVIF_CONCRETE_SET:
                self.subtree_step(step_pos)
                segments.append(DEEP)
                break
            if self.peek("/"):
                self.forbid_wildcard("descendant '//'", step_pos)
                self.pos += 1
                if self.peek("/"):
                    raise self.fail("'///' is not a valid step", step_pos)
                segments.append(DEEP)
            segments.extend(self.child_step(namespace))
        return PathPattern(namespace, tuple(segments))

    def child_step(self, namespace: str) -> list[Segment]:
        if self.peek("*"):
            self.forbid_wildcard("wildcard '*'")
            self.pos += 1
            return [ANY]
        if self.peek("."):
            if self.peek(".."):
                raise self.fail("the parent step '..' is not allowed")
            nxt = self.text[self.pos + 1 : self.pos + 2]
            if nxt and _NAME_CHAR_RE.match(nxt):
                raise self.fail("a topic name cannot start with '.'")
            self.forbid_wildcard("self step '.'")
            self.pos += 1
            return []
        step_start = self.pos
        name = self.ncname()
        if name is None:
            if self.pos >= len(self.text):
                raise self.fail("a path cannot end with '/'")
            raise self.fail("expected a child topic name (NCName), '*' or '.'")
        if self.peek(":"):
            self.pos += 1
            local = self.ncname()
            if local is None:
                raise self.fail("expected a local name after the prefix")
            uri = self.namespaces.get(name)
            if not uri:
                raise self.fail(f"namespace prefix {name!r} is not declared", step_start)
            if uri != namespace:
                raise self.fail(
                    f"child step prefix {name!r} names namespace {uri!r}, not the root's "
                    f"namespace {namespace!r}",
                    step_start,
                )
            return [local]
        return [name]

    def subtree_step(self, step_pos: int) -> None:
        """ConcreteSet's trailing ``//.`` (the topic and its descendants): consume it, or
        fail when ``//`` is used any other way."""
        end = self.pos + 2  # past "/."
        if not self.text.startswith("/.", self.pos) or (
            end < len(self.text) and not (self.text[end] == "|" or self.text[end].isspace())
        ):
            raise self.fail(
                "the ConcreteSet dialect allows '//' only as a final '//.' (the topic and "
                "everything below it)",
                step_pos,
            )
        self.pos = end

    def forbid_wildcard(self, what: str, pos: int | None = None) -> None:
        if self.dialect in (SIMPLE, CONCRETE, ONVIF_CONCRETE_SET):
            raise self.fail(f"{what} is not allowed in the {self.name} dialect", pos)


def is_single_qname(text: str) -> bool:
    return _QNAME_RE.fullmatch(text) is not None


def parse_path_dialect(
    text: str, dialect: str, namespaces: Mapping[str | None, str]
) -> tuple[PathPattern, ...]:
    """Parse ``text`` in the Simple, Concrete or Full grammar (canonical URI) into branches."""
    return _Parser(text, dialect, namespaces).parse()


def element_text(element: etree._Element) -> str:
    """The character content of ``element`` (its descendants' text, not its tail)."""
    return "".join(str(t) for t in element.itertext())
