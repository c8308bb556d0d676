"""The broker's topic set (WS-Topics §7.3.1, §8, §9): live, shared by request threads.

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

The set is shared by request threads: every method takes its lock.  The namespaces it
declares are read by ``namespaces.load_topic_namespace``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from lxml import etree

from .errors import InvalidTopicNamespace, TopicNotSupported, TopicSetFull
from .model import PathPattern, Topic, TopicExpression

if TYPE_CHECKING:
    from .model import XPathDocument
from .namespaces import WSTOP_13, TopicDefinition, TopicNamespace

__all__ = ["TopicSet"]


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
        #: bumped whenever the members or namespaces change (:attr:`version`)
        self._version = 0
        #: told each topic :meth:`admit` adds (``watch``), outside the lock
        self._listener: Callable[[Topic], None] | None = None
        #: (version, document) of :meth:`xpath_document`; one thread builds at a time
        self._xpath: tuple[int, XPathDocument] | None = None
        self._xpath_building = threading.Lock()
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
            self._version += 1

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
        return bool(self.admit_all((topic,), limit=limit))

    def admit_all(self, topics: Iterable[Topic], *, limit: int | None = None) -> list[Topic]:
        """Add ``topics`` all together or none of them: the new ones (returned, in order)
        are added only if each is allowed (:meth:`check`) and :attr:`grown` stays within
        ``limit`` with all of them (TopicSetFull naming the first new one otherwise)."""
        with self._lock:
            new = [t for t in dict.fromkeys(topics) if t not in self._members]
            for topic in new:
                self._check_new(topic)
            if new and limit is not None and self._grown + len(new) > limit:
                raise TopicSetFull(
                    f"topic {new[0]} is new and the topic set holds its maximum of {limit} "
                    "topics beyond the declared ones",
                    limit,
                    new[0],
                )
            self._members.update(new)
            self._grown += len(new)
            if new:
                self._version += 1
            listener = self._listener
        if listener is not None:
            for topic in new:
                listener(topic)
        return new

    def check(self, topic: Topic, *, limit: int | None = None, ahead: int = 0) -> bool:
        """What :meth:`admit` would do with ``topic`` after ``ahead`` other new topics,
        without adding it: False for a member, True for a topic it would add; the same
        errors as ``admit`` for one it would refuse."""
        with self._lock:
            if topic in self._members:
                return False
            self._check_new(topic)
            if limit is not None and self._grown + ahead >= limit:
                raise TopicSetFull(
                    f"topic {topic} is new and the topic set holds its maximum of {limit} "
                    "topics beyond the declared ones",
                    limit,
                    topic,
                )
            return True

    def check_name(self, topic: Topic) -> None:
        """Raise TopicNotSupported when ``topic``'s declared namespace forbids it (rule
        1), whether the set holds it, is fixed or may grow: for a topic that is only
        carried, never added (a Notify sent to a pull point, a NotificationConsumer)."""
        with self._lock:
            reason = self._rule1_violation(topic)
        if reason is not None:
            raise TopicNotSupported(f"topic {topic} is not permitted: {reason}")

    def _check_new(self, topic: Topic) -> None:
        """Raise TopicNotSupported unless ``topic`` (not a member) may be added."""
        if self.fixed:
            raise TopicNotSupported(f"topic {topic} is not in the fixed topic set")
        reason = self._rule1_violation(topic)
        if reason is not None:
            raise TopicNotSupported(f"topic {topic} is not permitted: {reason}")

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
            if added:
                self._version += 1
        return added

    @property
    def version(self) -> int:
        """A number that changes whenever the members or namespaces do (read it *before*
        reading the members, so what is read is at least as new as the number): what a
        cache of anything derived from the set is keyed by."""
        with self._lock:
            return self._version

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
    def xpath_document(self) -> XPathDocument:
        """The :meth:`to_element` document (every member) as the XPath dialect's node
        tree (``xpath_dialect.topic_document``), built once per :attr:`version` and
        shared by every caller until a topic is added: an XPath TopicExpression costs a
        selection, not a document of every topic.  Callers only read it."""
        version = self.version  # before the members are read: never too new
        kept = self._xpath
        if kept is not None and kept[0] == version:
            return kept[1]
        from .xpath_dialect import topic_document  # elementpath: only where XPath is used

        with self._xpath_building:  # requests arriving together build it once
            kept = self._xpath
            if kept is not None and kept[0] >= version:
                return kept[1]
            built = topic_document(self.to_element())
            self._xpath = (version, built)
            return built

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
