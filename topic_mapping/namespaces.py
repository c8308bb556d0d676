"""Topic namespaces (WS-Topics 1.3 ``TopicNamespace`` / 1.0 ``TopicSpace`` documents) and
the broker's topic set.

``load_topic_namespace`` reads a namespace document into a :class:`TopicNamespace` tree of
:class:`TopicDefinition` nodes.  Both the 1.3 spelling (``wstop:TopicNamespace`` with
``wstop:Topic`` children, ``parent`` attributes on top-level topics) and the 1.0 spelling
(``TopicSpace``/``topicSpace`` with ``Topic``/``topic`` children and ``AliasRef``) are read.

:class:`TopicSet` is the set of topics a producer (the broker) supports: topics declared in
its namespaces plus topics admitted ad hoc.  It implements WS-Topics §7.3.1 validation,
§8 alias resolution and §9 growth rules:

* **Rule 1** (TopicNotSupported): an expression may not explicitly reference (by the
  literal steps before its first wildcard) an undeclared root of a declared namespace, an
  undeclared child of a ``final="true"`` topic, or a child of an alias topic.
* **Rule 2** (TopicNotSupported): with a fixed topic set, the topics the (alias-resolved)
  expression selects must intersect the set.  Branches that select nothing in a fixed set
  are dropped from the returned expression, which is equivalent (nothing can be published
  outside a fixed set) and keeps middleware bindings tight.
* **Aliases** (§8): a branch naming an alias is replaced by the alias' resolution,
  recursively; a cycle contributes nothing (rule 5); an empty resolution is
  TopicNotSupported.  **Decision on §8 rule 3 (wildcards selecting aliases):** we take the
  intent reading.  A wildcard branch is kept as it is (matched dynamically) and, for every
  declared alias it selects, that alias' resolution is added too.  So ``tns:t4/*`` on
  TREE-S selects t4/t5 and t1/t3 (the alias t4/t6 itself never carries messages).
* Namespaces that are not declared are ad hoc: any topic may be used and grows the set,
  unless the set is fixed.  The growth can be bounded: ``admit(topic, limit=n)`` refuses
  (TopicSetFull, a TopicNotSupported) a topic that would make more than ``n`` members
  beyond the initial ones (:attr:`TopicSet.grown`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from lxml import etree

from .dialects import CONCRETE, element_text, is_ncname, parse_path_dialect, parse_topic_expression
from .errors import InvalidTopicNamespace, TopicError, TopicNotSupported, TopicSetFull
from .model import PathPattern, Topic, TopicExpression

__all__ = [
    "AD_HOC_NAMESPACE_10",
    "WSTOP_10",
    "WSTOP_13",
    "QueryExpression",
    "TopicDefinition",
    "TopicNamespace",
    "TopicSet",
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


# --------------------------------------------------------------------------------------------
# The topic set
# --------------------------------------------------------------------------------------------


class TopicSet:
    """Topics a producer supports: declared namespaces, member topics, ad-hoc growth.

    ``topics`` (default: every topic declared in ``namespaces``) are the initial members.
    With ``fixed=True`` the membership never changes (FixedTopicSet resource property) and
    only members may be used.  :attr:`grown` counts the members added since construction
    (by :meth:`admit` and :meth:`take_in`), which ``admit``'s ``limit`` bounds.  All
    methods are safe to call from several threads.
    """

    def __init__(
        self,
        namespaces: Iterable[TopicNamespace] = (),
        topics: Iterable[Topic] | None = None,
        *,
        fixed: bool = False,
    ) -> None:
        self._lock = threading.RLock()
        self._namespaces: dict[str, TopicNamespace] = {}
        self._members: set[Topic] = set()
        #: members added after construction (``admit``, ``take_in``)
        self._grown = 0
        #: told each topic :meth:`admit` adds (``watch``), outside the lock
        self._listener: Callable[[Topic], None] | None = None
        self.fixed = False
        for ns in namespaces:
            self.add_namespace(ns, include_topics=topics is None)
        for topic in topics or ():
            self.admit(topic)
        self.fixed = fixed
        self._grown = 0  # the initial members are not growth

    # -- configuration ---------------------------------------------------------------------
    def add_namespace(self, namespace: TopicNamespace, *, include_topics: bool = True) -> None:
        """Declare a namespace; with ``include_topics`` its declared topics become members."""
        with self._lock:
            if namespace.target_namespace in self._namespaces:
                raise InvalidTopicNamespace(
                    f"topic namespace {namespace.target_namespace!r} is declared twice"
                )
            self._namespaces[namespace.target_namespace] = namespace
            if include_topics:
                self._members.update(namespace.topics())

    @property
    def namespaces(self) -> Mapping[str, TopicNamespace]:
        """Declared namespaces by URI (a copy)."""
        with self._lock:
            return dict(self._namespaces)

    # -- membership ------------------------------------------------------------------------
    def definition(self, topic: Topic) -> TopicDefinition | None:
        """The declaration of ``topic`` (None for ad-hoc or unknown topics)."""
        ns = self._namespaces.get(topic.namespace)
        return None if ns is None else ns.find(topic.path)

    def is_alias(self, topic: Topic) -> bool:
        """True when ``topic`` is a declared alias topic."""
        d = self.definition(topic)
        return d is not None and d.alias is not None

    def _rule1_violation(self, topic: Topic) -> str | None:
        """Why ``topic`` is not permitted by its topic namespace (§7.3.1 rule 1), or None."""
        ns = self._namespaces.get(topic.namespace)
        if ns is None:
            return None  # ad-hoc namespace
        node = ns.roots.get(topic.root)
        if node is None:
            return f"root topic {topic.root!r} is not defined in namespace {topic.namespace!r}"
        for name in topic.path[1:]:
            if node.alias is not None:
                return f"topic {node.name!r} is an alias and has no child topics"
            child = node.children.get(name)
            if child is None:
                if node.final:
                    return f"topic {node.name!r} is final and has no child topic {name!r}"
                return None  # grown below a non-final topic
            node = child
        return None

    def permits(self, topic: Topic) -> bool:
        """Whether ``topic`` may be used: allowed by its namespace and, when fixed, a member."""
        with self._lock:
            if self._rule1_violation(topic) is not None:
                return False
            return not self.fixed or topic in self._members

    def admit(self, topic: Topic, *, limit: int | None = None) -> bool:
        """Add ``topic`` to the set (ad-hoc growth, §9); no-op for members.  True when it
        was added (the listener :meth:`watch` set is told, once the set's lock is
        released).

        Raises TopicNotSupported when the set is fixed or the namespace forbids the topic,
        and TopicSetFull (a TopicNotSupported) when :attr:`grown` has reached ``limit``.
        """
        with self._lock:
            if topic in self._members:
                return False
            if self.fixed:
                raise TopicNotSupported(f"topic {topic} is not in the fixed topic set")
            reason = self._rule1_violation(topic)
            if reason is not None:
                raise TopicNotSupported(f"topic {topic} is not permitted: {reason}")
            if limit is not None and self._grown >= limit:
                raise TopicSetFull(
                    f"topic {topic} is new and the topic set holds its maximum of {limit} "
                    "topics beyond the declared ones",
                    limit,
                )
            self._members.add(topic)
            self._grown += 1
            listener = self._listener
        if listener is not None:
            listener(topic)
        return True

    def watch(self, listener: Callable[[Topic], None] | None) -> None:
        """Tell ``listener`` every topic :meth:`admit` adds from now on (None: nobody);
        it is called on the admitting thread, so it must be quick and must not raise."""
        with self._lock:
            self._listener = listener

    def take_in(self, topics: Iterable[Topic]) -> list[Topic]:
        """Add topics admitted elsewhere (another instance of a cluster) without telling
        the listener; a fixed set takes none, and a topic its namespaces forbid is left
        out.  The topics added."""
        added: list[Topic] = []
        with self._lock:
            if self.fixed:
                return added
            for topic in topics:
                if topic not in self._members and self._rule1_violation(topic) is None:
                    self._members.add(topic)
                    added.append(topic)
            self._grown += len(added)
        return added

    @property
    def grown(self) -> int:
        """Members added since construction (ad-hoc growth, here and taken in)."""
        with self._lock:
            return self._grown

    def __contains__(self, topic: object) -> bool:
        with self._lock:
            return topic in self._members

    def __len__(self) -> int:
        with self._lock:
            return len(self._members)

    def topics(self) -> list[Topic]:
        """The member topics (aliases included), sorted."""
        with self._lock:
            return sorted(self._members)

    def select(self, expr: TopicExpression) -> set[Topic]:
        """Non-alias member topics that ``expr`` selects (use on a validated expression)."""
        with self._lock:
            members = [t for t in self._members if not self.is_alias(t)]
        return {t for t in members if expr.matches(t)}

    # -- validation ------------------------------------------------------------------------
    def validate(self, expr: TopicExpression) -> TopicExpression:
        """Apply §7.3.1 rules 1 and 2 and §8 alias resolution; return the resolved expression.

        Raises TopicNotSupported when a rule fails or aliases resolve to nothing.
        """
        with self._lock:
            for pattern in expr.patterns:
                literal = _literal_prefix(pattern)
                if literal:
                    reason = self._rule1_violation(Topic(pattern.namespace, literal))
                    if reason is not None:
                        raise TopicNotSupported(
                            f"TopicExpression {expr.text!r} refers to a topic that is not "
                            f"permitted: {reason}"
                        )
            aliases: list[tuple[Topic, TopicExpression]] = []
            if not all(p.is_concrete for p in expr.patterns):
                aliases = list(self._alias_items())
            resolved = self._resolve(expr.patterns, frozenset(), aliases)
            if expr.patterns and not resolved:
                raise TopicNotSupported(
                    f"TopicExpression {expr.text!r} resolves (through aliases) to no topic"
                )
            if self.fixed:
                members = [t for t in self._members if not self.is_alias(t)]
                resolved = [p for p in resolved if any(p.matches(t) for t in members)]
                if not resolved:
                    raise TopicNotSupported(
                        f"TopicExpression {expr.text!r} selects no topic of the fixed topic set"
                    )
            return replace(expr, patterns=tuple(dict.fromkeys(resolved)))

    def _alias_items(self) -> Iterator[tuple[Topic, TopicExpression]]:
        for ns in self._namespaces.values():
            for topic, d in ns.iter_topics():
                if d.alias is not None:
                    yield topic, d.alias

    def _resolve(
        self,
        patterns: Iterable[PathPattern],
        visited: frozenset[Topic],
        aliases: list[tuple[Topic, TopicExpression]],
    ) -> list[PathPattern]:
        out: list[PathPattern] = []
        for pattern in patterns:
            if pattern.is_concrete:
                topic = pattern.as_topic()
                d = self.definition(topic)
                if d is None or d.alias is None:
                    out.append(pattern)
                elif topic not in visited:  # rule 5: a cycle contributes nothing
                    if not aliases and not d.alias.is_concrete:
                        aliases.extend(self._alias_items())
                    out.extend(self._resolve(d.alias.patterns, visited | {topic}, aliases))
                continue
            out.append(pattern)
            # Intent reading of rule 3: aliases a wildcard selects are resolved as well.
            for topic, alias in aliases:
                if topic not in visited and pattern.matches(topic):
                    out.extend(self._resolve(alias.patterns, visited | {topic}, aliases))
        return out

    # -- resource property -----------------------------------------------------------------
    def to_element(self, visible: Callable[[Topic], bool] | None = None) -> etree._Element:
        """The ``wstop:TopicSet`` document: member topics (and their ancestors) as nested
        elements in the topic's namespace; members carry ``wstop:topic="true"``.  With
        ``visible``, only the members it accepts (and their ancestors) appear."""
        with self._lock:
            members = set(self._members)
        if visible is not None:
            members = {t for t in members if visible(t)}
        uris = sorted({t.namespace for t in members})
        nsmap: dict[str, str] = {"wstop": WSTOP_13}
        prefixes: dict[str, str] = {}
        for i, uri in enumerate(uris, start=1):
            if uri == WSTOP_13:
                prefixes[uri] = "wstop"
                continue
            prefixes[uri] = f"tns{i}"
            nsmap[f"tns{i}"] = uri
        root = etree.Element(f"{{{WSTOP_13}}}TopicSet", nsmap=nsmap)
        elements: dict[Topic, etree._Element] = {}
        for topic in sorted(members):
            for node in topic.ancestors_and_self():
                if node in elements:
                    continue
                parent = node.parent()
                container = root if parent is None else elements[parent]
                elements[node] = etree.SubElement(container, f"{{{node.namespace}}}{node.path[-1]}")
        for topic in members:
            elements[topic].set(f"{{{WSTOP_13}}}topic", "true")
        return root


def _literal_prefix(pattern: PathPattern) -> tuple[str, ...]:
    out: list[str] = []
    for seg in pattern.segments:
        if not isinstance(seg, str):
            break
        out.append(seg)
    return tuple(out)
