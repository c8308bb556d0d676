"""Subscription index: which keys' topic expressions select a given concrete topic.

:class:`TopicIndex` is a trie per namespace over pattern segments, with one branch per
literal name plus an ``ANY`` branch (exactly one level) and a ``DEEP`` branch (zero or
more levels).  Matching runs the trie as an NFA over the topic path: the active state set
is bounded by the distinct pattern shapes, so the cost grows with topic depth and the
number of matching keys, not with the number of subscriptions.

Concurrency: mutations are serialised by a lock.  Readers take no lock: a node's key set
is changed in place by the writer (one ``set.add``/``set.discard``) and read by the reader
in one ``set.update`` call, and child tables are only read with ``dict.get``; each of
these is a single C call, atomic under the GIL, so a concurrent reader sees either the old
or the new state of each node.  (Replacing a node's set by a copy on every change, as an
earlier version did, made adding n keys under one pattern cost O(n²).)
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

from .model import ANY, DEEP, PathPattern, Segment, Topic, TopicExpression

__all__ = ["TopicIndex"]

K = TypeVar("K", bound=Hashable)


class _Node:
    __slots__ = ("any", "children", "deep", "keys", "loops")

    def __init__(self, loops: bool = False) -> None:
        self.children: dict[str, _Node] = {}
        self.any: _Node | None = None
        self.deep: _Node | None = None
        #: created on the first key (most nodes are inner nodes and hold none)
        self.keys: set[object] | None = None
        #: True for a node reached through a DEEP edge: it absorbs any number of levels.
        self.loops = loops

    def empty(self) -> bool:
        return not (self.children or self.any or self.deep or self.keys)


class TopicIndex(Generic[K]):
    """Maps keys (e.g. subscription ids) to topic patterns and finds the keys of a topic."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._roots: dict[str, _Node] = {}
        self._patterns: dict[K, tuple[PathPattern, ...]] = {}

    def add(self, key: K, expr: TopicExpression | Iterable[PathPattern]) -> None:
        """Index ``key`` under the expression's patterns (replacing any previous entry)."""
        patterns = expr.patterns if isinstance(expr, TopicExpression) else tuple(expr)
        patterns = tuple(dict.fromkeys(patterns))
        with self._lock:
            if key in self._patterns:
                self._remove_locked(key)
            self._patterns[key] = patterns
            for pattern in patterns:
                node = self._roots.get(pattern.namespace)
                if node is None:
                    node = _Node()
                    self._roots[pattern.namespace] = node
                for seg in pattern.segments:
                    node = _step_create(node, seg)
                if node.keys is None:
                    node.keys = set()
                node.keys.add(key)

    def remove(self, key: K) -> bool:
        """Drop ``key``; returns False when it was not indexed."""
        with self._lock:
            if key not in self._patterns:
                return False
            self._remove_locked(key)
            return True

    def _remove_locked(self, key: K) -> None:
        for pattern in self._patterns.pop(key):
            root = self._roots.get(pattern.namespace)
            if root is None:
                continue
            trail: list[tuple[_Node, Segment]] = []
            node: _Node | None = root
            for seg in pattern.segments:
                assert node is not None
                nxt = _step(node, seg)
                if nxt is None:
                    node = None
                    break
                trail.append((node, seg))
                node = nxt
            if node is None:
                continue
            if node.keys is not None:
                node.keys.discard(key)
                if not node.keys:
                    node.keys = None
            # prune empty nodes bottom-up
            child = node
            for parent, seg in reversed(trail):
                if not child.empty():
                    break
                if seg is ANY:
                    parent.any = None
                elif seg is DEEP:
                    parent.deep = None
                else:
                    assert isinstance(seg, str)
                    del parent.children[seg]
                child = parent
            if root.empty():
                del self._roots[pattern.namespace]

    def match(self, topic: Topic) -> set[K]:
        """Keys whose patterns select ``topic``."""
        root = self._roots.get(topic.namespace)
        if root is None:
            return set()
        states = _closure([root])
        for name in topic.path:
            nxt: list[_Node] = []
            for node in states:
                child = node.children.get(name)
                if child is not None:
                    nxt.append(child)
                if node.any is not None:
                    nxt.append(node.any)
                if node.loops:
                    nxt.append(node)
            if not nxt:
                return set()
            states = _closure(nxt)
        result: set[K] = set()
        for node in states:
            keys = node.keys  # one read: the writer may swap it for None meanwhile
            if keys:
                result.update(keys)  # type: ignore[arg-type]
        return result

    def patterns(self, key: K) -> tuple[PathPattern, ...]:
        """The patterns indexed for ``key`` (KeyError when absent)."""
        return self._patterns[key]

    def keys(self) -> list[K]:
        """All indexed keys."""
        return list(self._patterns)

    def __len__(self) -> int:
        return len(self._patterns)

    def __contains__(self, key: object) -> bool:
        return key in self._patterns


def _step(node: _Node, seg: Segment) -> _Node | None:
    if seg is ANY:
        return node.any
    if seg is DEEP:
        return node.deep
    assert isinstance(seg, str)
    return node.children.get(seg)


def _step_create(node: _Node, seg: Segment) -> _Node:
    if seg is ANY:
        if node.any is None:
            node.any = _Node()
        return node.any
    if seg is DEEP:
        if node.deep is None:
            node.deep = _Node(loops=True)
        return node.deep
    assert isinstance(seg, str)
    child = node.children.get(seg)
    if child is None:
        child = _Node()
        node.children[seg] = child
    return child


def _closure(nodes: list[_Node]) -> list[_Node]:
    """Add the epsilon moves (into DEEP nodes) and drop duplicates, keeping order."""
    seen: set[int] = set()
    out: list[_Node] = []
    for node in nodes:
        cur: _Node | None = node
        while cur is not None and id(cur) not in seen:
            seen.add(id(cur))
            out.append(cur)
            cur = cur.deep
    return out
