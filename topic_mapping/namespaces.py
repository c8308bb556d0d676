"""Topic namespaces: WS-Topics 1.3 ``TopicNamespace`` / 1.0 ``TopicSpace`` documents read
into a tree of declarations (pure data and the functions reading it).

``load_topic_namespace`` reads a namespace document into a :class:`TopicNamespace` tree of
:class:`TopicDefinition` nodes.  Both the 1.3 spelling (``wstop:TopicNamespace`` with
``wstop:Topic`` children, ``parent`` attributes on top-level topics) and the 1.0 spelling
(``TopicSpace``/``topicSpace`` with ``Topic``/``topic`` children and ``AliasRef``) are read.

The broker's live set of topics, declared here and grown ad hoc, is ``topic_set.TopicSet``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from lxml import etree

from .dialects import CONCRETE, element_text, is_ncname, parse_path_dialect, parse_topic_expression
from .errors import InvalidTopicNamespace, TopicError
from .model import Topic, TopicExpression

__all__ = [
    "AD_HOC_NAMESPACE_10",
    "WSTOP_10",
    "WSTOP_13",
    "QueryExpression",
    "TopicDefinition",
    "TopicNamespace",
    "load_topic_namespace",
]

#: WS-Topics 1.3 namespace (TopicNamespace, TopicSet, the topic attribute).
WSTOP_13 = "http://docs.oasis-open.org/wsn/t-1"
#: WS-Topics 1.0 namespace (TopicSpace).
WSTOP_10 = "http://www.ibm.com/xmlns/stdwip/web-services/WS-Topics"
#: The WS-Topics 1.0 ad-hoc topic space (no declared roots, grows freely).
AD_HOC_NAMESPACE_10 = "http://www.ibm.com/xmlns/stdwip/web-services/WS-Topics/adHoc"

_XSD = "http://www.w3.org/2001/XMLSchema"


@dataclass(frozen=True, slots=True)
class QueryExpression:
    """A ``MessagePattern``: query dialect, expression text and its in-scope namespaces."""

    dialect: str
    text: str
    namespaces: tuple[tuple[str, str], ...] = ()


@dataclass(slots=True)
class TopicDefinition:
    """A topic declared in a namespace document.

    ``message_types`` is None for "any message type" (attribute missing, empty or
    ``xsd:any``), else the (namespace, local name) pairs.  ``alias`` is the parsed AliasRef
    expression for an alias topic (which has no children; its final/messageTypes are
    ignored).
    """

    name: str
    final: bool = False
    message_types: tuple[tuple[str, str], ...] | None = None
    message_pattern: QueryExpression | None = None
    alias: TopicExpression | None = None
    children: dict[str, TopicDefinition] = field(default_factory=dict)

    def add_child(self, child: TopicDefinition) -> TopicDefinition:
        """Attach ``child``; raises InvalidTopicNamespace on a duplicate or under an alias."""
        if self.alias is not None:
            raise InvalidTopicNamespace(f"alias topic {self.name!r} cannot have child topics")
        if child.name in self.children:
            raise InvalidTopicNamespace(
                f"duplicate child topic {child.name!r} under topic {self.name!r}"
            )
        self.children[child.name] = child
        return child


@dataclass(slots=True)
class TopicNamespace:
    """A topic namespace: its URI and the forest of declared topics."""

    target_namespace: str
    name: str | None = None
    final: bool = False
    roots: dict[str, TopicDefinition] = field(default_factory=dict)

    def find(self, path: Sequence[str]) -> TopicDefinition | None:
        """The declared topic at ``path`` (None when not declared)."""
        node: TopicDefinition | None = None
        level = self.roots
        for name in path:
            node = level.get(name)
            if node is None:
                return None
            level = node.children
        return node

    def define(self, path: Sequence[str], *, final: bool = False) -> TopicDefinition:
        """Declare the topic at ``path`` (and any missing ancestors) programmatically."""
        if not path:
            raise ValueError("empty topic path")
        for name in path:
            if not is_ncname(name):
                raise InvalidTopicNamespace(f"topic name {name!r} is not an NCName")
        level = self.roots
        node: TopicDefinition | None = None
        for name in path:
            nxt = level.get(name)
            if nxt is None:
                if node is not None and node.alias is not None:
                    raise InvalidTopicNamespace(f"alias topic {node.name!r} cannot have children")
                nxt = TopicDefinition(name)
                level[name] = nxt
            node = nxt
            level = node.children
        assert node is not None
        node.final = final
        return node

    def iter_topics(self) -> Iterator[tuple[Topic, TopicDefinition]]:
        """Every declared topic with its definition, depth first, roots in document order."""
        stack: list[tuple[tuple[str, ...], TopicDefinition]] = [
            ((d.name,), d) for d in reversed(self.roots.values())
        ]
        while stack:
            path, node = stack.pop()
            yield Topic(self.target_namespace, path), node
            stack.extend(((*path, c.name), c) for c in reversed(node.children.values()))

    def topics(self) -> list[Topic]:
        """Every declared topic (aliases included)."""
        return [t for t, _ in self.iter_topics()]

    def aliases(self) -> dict[Topic, TopicExpression]:
        """The declared alias topics and their AliasRef expressions."""
        return {t: d.alias for t, d in self.iter_topics() if d.alias is not None}


# --------------------------------------------------------------------------------------------
# Loading documents
# --------------------------------------------------------------------------------------------

_ROOTS = {
    (WSTOP_13, "TopicNamespace"),
    (WSTOP_10, "TopicSpace"),
    (WSTOP_10, "topicSpace"),
}


def _parse_bool(value: str | None, what: str) -> bool:
    if value is None:
        return False
    v = value.strip()
    if v in ("true", "1"):
        return True
    if v in ("false", "0"):
        return False
    raise InvalidTopicNamespace(f"{what}: {value!r} is not an xsd:boolean")


def _nsmap(element: etree._Element) -> dict[str | None, str]:
    return dict(element.nsmap)


def _is_wstop(element: etree._Element, wstop: str, *locals_: str) -> bool:
    if not isinstance(element.tag, str):
        return False
    q = etree.QName(element)
    return q.namespace == wstop and q.localname in locals_


def _message_types(element: etree._Element, where: str) -> tuple[tuple[str, str], ...] | None:
    raw = element.get("messageTypes")
    if raw is None or not raw.split():
        return None
    nsmap = _nsmap(element)
    out: list[tuple[str, str]] = []
    for token in raw.split():
        prefix, _, local = token.rpartition(":")
        if not is_ncname(local) or (prefix and not is_ncname(prefix)):
            raise InvalidTopicNamespace(f"{where}: messageTypes item {token!r} is not a QName")
        if prefix:
            uri = nsmap.get(prefix)
            if uri is None:
                raise InvalidTopicNamespace(
                    f"{where}: messageTypes prefix {prefix!r} is not declared"
                )
        else:
            uri = nsmap.get(None) or ""
        if (uri, local) == (_XSD, "any"):
            return None
        if (uri, local) not in out:
            out.append((uri, local))
    return tuple(out)


def _read_topic(element: etree._Element, wstop: str, where: str) -> TopicDefinition:
    name = element.get("name")
    if name is None:
        raise InvalidTopicNamespace(f"{where}: Topic element without a name attribute")
    name = name.strip()
    if not is_ncname(name):
        raise InvalidTopicNamespace(f"{where}: topic name {name!r} is not an NCName")
    here = f"{where}/{name}"
    definition = TopicDefinition(
        name,
        final=_parse_bool(element.get("final"), f"{here} @final"),
        message_types=_message_types(element, here),
    )
    children: list[etree._Element] = []
    alias_el: etree._Element | None = None
    pattern_el: etree._Element | None = None
    for child in element:
        if _is_wstop(child, wstop, "Topic", "topic"):
            children.append(child)
        elif _is_wstop(child, wstop, "AliasRef", "aliasRef"):
            if alias_el is not None:
                raise InvalidTopicNamespace(f"{here}: more than one AliasRef")
            alias_el = child
        elif _is_wstop(child, wstop, "MessagePattern"):
            pattern_el = child
    if pattern_el is not None:
        dialect = pattern_el.get("Dialect") or pattern_el.get("dialect")
        if not dialect:
            raise InvalidTopicNamespace(f"{here}: MessagePattern without a Dialect")
        bindings = tuple(sorted((p or "", u) for p, u in pattern_el.nsmap.items()))
        definition.message_pattern = QueryExpression(
            dialect, element_text(pattern_el).strip(), bindings
        )
    if alias_el is not None:
        if children:
            raise InvalidTopicNamespace(f"{here}: an alias topic cannot have child topics")
        if pattern_el is not None:
            raise InvalidTopicNamespace(f"{here}: an alias topic cannot have a MessagePattern")
        dialect = alias_el.get("Dialect") or alias_el.get("dialect")
        try:
            definition.alias = parse_topic_expression(
                element_text(alias_el), dialect, _nsmap(alias_el)
            )
        except TopicError as exc:
            raise InvalidTopicNamespace(f"{here}: invalid AliasRef: {exc}") from exc
        definition.final = False
        definition.message_types = None
    for child in children:
        definition.add_child(_read_topic(child, wstop, here))
    return definition


def load_topic_namespace(source: bytes | str | etree._Element) -> TopicNamespace:
    """Read a WS-Topics 1.3 ``TopicNamespace`` or 1.0 ``TopicSpace`` document.

    ``source`` is the document as bytes or str (XML text, not a file name) or an already
    parsed element.  Raises InvalidTopicNamespace for anything malformed: not XML, wrong
    root element, missing targetNamespace, bad or duplicate topic names, an AliasRef with
    children, an unresolvable ``parent``, ...
    """
    if isinstance(source, etree._Element):
        root = source
    else:
        data = source.encode("utf-8") if isinstance(source, str) else source
        parser = etree.XMLParser(resolve_entities=False, no_network=True, huge_tree=False)
        try:
            root = etree.fromstring(data, parser)
        except etree.XMLSyntaxError as exc:
            raise InvalidTopicNamespace(f"topic namespace document is not XML: {exc}") from exc
    if not isinstance(root.tag, str):
        raise InvalidTopicNamespace("topic namespace document has no root element")
    q = etree.QName(root)
    if (q.namespace, q.localname) not in _ROOTS:
        raise InvalidTopicNamespace(
            f"root element {q.text!r} is neither wstop:TopicNamespace (WS-Topics 1.3) nor "
            "wstop:TopicSpace (WS-Topics 1.0)"
        )
    wstop = q.namespace or ""
    target = (root.get("targetNamespace") or "").strip()
    if not target:
        raise InvalidTopicNamespace(f"{q.localname} without a targetNamespace attribute")
    name = root.get("name")
    ns = TopicNamespace(
        target,
        name=name.strip() if name else None,
        final=_parse_bool(root.get("final"), f"{q.localname} @final"),
    )
    where = "{" + target + "}"
    pending: list[tuple[etree._Element, TopicDefinition]] = []
    for child in root:
        if not _is_wstop(child, wstop, "Topic", "topic"):
            continue
        definition = _read_topic(child, wstop, where)
        if child.get("parent") is not None:
            pending.append((child, definition))
            continue
        if definition.name in ns.roots:
            raise InvalidTopicNamespace(f"{where}: duplicate root topic {definition.name!r}")
        ns.roots[definition.name] = definition
    # 1.3 'parent' attributes may refer to topics declared later, or to other parented topics.
    while pending:
        progressed = False
        for item in list(pending):
            element, definition = item
            parent_path = _parent_path(element, target, where)
            parent = ns.find(parent_path)
            if parent is None:
                continue
            parent.add_child(definition)
            pending.remove(item)
            progressed = True
        if not progressed:
            element, definition = pending[0]
            raise InvalidTopicNamespace(
                f"{where}: topic {definition.name!r} names parent {element.get('parent')!r}, "
                "which is not declared in this namespace"
            )
    return ns


def _parent_path(element: etree._Element, target: str, where: str) -> tuple[str, ...]:
    text = element.get("parent") or ""
    nsmap = _nsmap(element)
    if nsmap.get(None) is None:
        nsmap[None] = target  # an unprefixed parent path is relative to this namespace
    try:
        (pattern,) = parse_path_dialect(text.strip(), CONCRETE, nsmap)
    except TopicError as exc:
        raise InvalidTopicNamespace(f"{where}: invalid parent attribute: {exc}") from exc
    if pattern.namespace != target:
        raise InvalidTopicNamespace(
            f"{where}: parent {text!r} is not in the target namespace {target!r}"
        )
    return pattern.as_topic().path
