"""Canonical topic model shared by every part of wsnmom.

A concrete topic is ``Topic(namespace, path)``: the topic namespace URI and a non-empty
tuple of NCName segments.  Prefixes never survive parsing.

Every Simple, Concrete and Full TopicExpression normalises to a union of
``PathPattern`` branches.  A pattern is a namespace plus a tuple of segments, where a
segment is either a literal NCName, ``ANY`` (exactly one level: Full ``*``) or ``DEEP``
(zero or more levels).  The Full dialect's axes map onto this alphabet as follows::

    a/b      -> (a, b)             a/*     -> (a, ANY)
    a//b     -> (a, DEEP, b)       a//*    -> (a, DEEP, ANY)
    a//.     -> (a, DEEP)          a/.     -> (a,)
    //b      -> (DEEP, b)          *       -> (ANY,)

Consecutive ``DEEP`` segments collapse into one.  This is the same alphabet as a RabbitMQ
binding key (words, ``*``, ``#``), which keeps translation to middleware patterns simple.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from elementpath import DocumentNode, ElementNode

    #: a ``wstop:TopicSet`` document as elementpath's node tree (``TopicDocument``)
    XPathDocument = DocumentNode | ElementNode


class Wildcard(enum.Enum):
    """Wildcard segments of a ``PathPattern``."""

    #: exactly one topic level (Full ``*``)
    ANY = "*"
    #: zero or more topic levels (Full ``//`` descendant-or-self axis)
    DEEP = "**"

    def __repr__(self) -> str:
        return f"Wildcard.{self.name}"


ANY = Wildcard.ANY
DEEP = Wildcard.DEEP

Segment = str | Wildcard


@dataclass(frozen=True, slots=True, order=True)
class Topic:
    """A concrete topic: namespace URI and a non-empty path of NCNames."""

    namespace: str
    path: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.path:
            raise ValueError("a topic path has at least one segment")

    @property
    def root(self) -> str:
        """Name of the root topic."""
        return self.path[0]

    def child(self, name: str) -> Topic:
        """The child topic called ``name``."""
        return Topic(self.namespace, (*self.path, name))

    def parent(self) -> Topic | None:
        """The parent topic, or None for a root topic."""
        return Topic(self.namespace, self.path[:-1]) if len(self.path) > 1 else None

    def ancestors_and_self(self) -> list[Topic]:
        """Root first, this topic last."""
        return [Topic(self.namespace, self.path[: i + 1]) for i in range(len(self.path))]

    def __str__(self) -> str:
        return "{" + self.namespace + "}" + "/".join(self.path)


def _collapse_deep(segments: tuple[Segment, ...]) -> tuple[Segment, ...]:
    out: list[Segment] = []
    for seg in segments:
        if seg is DEEP and out and out[-1] is DEEP:
            continue
        out.append(seg)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class PathPattern:
    """One branch of a topic expression: namespace plus segments (literals and wildcards)."""

    namespace: str
    segments: tuple[Segment, ...]

    def __post_init__(self) -> None:
        if not self.segments:
            raise ValueError("a path pattern has at least one segment")
        object.__setattr__(self, "segments", _collapse_deep(self.segments))
        if self.segments == (DEEP,):
            raise ValueError("a path pattern must select at least one level")

    @property
    def is_concrete(self) -> bool:
        """True when the pattern has no wildcard, i.e. names exactly one topic."""
        return all(isinstance(s, str) for s in self.segments)

    def as_topic(self) -> Topic:
        """The topic named by a concrete pattern."""
        if not self.is_concrete:
            raise ValueError(f"{self} has wildcards")
        return Topic(self.namespace, tuple(s for s in self.segments if isinstance(s, str)))

    def matches(self, topic: Topic) -> bool:
        """Whether ``topic`` is selected by this pattern (dynamic evaluation)."""
        if topic.namespace != self.namespace:
            return False
        return match_segments(self.segments, topic.path)

    def __str__(self) -> str:
        parts: list[str] = []
        for seg in self.segments:
            if seg is DEEP:
                parts.append("")  # renders as '//' between neighbours
            elif seg is ANY:
                parts.append("*")
            else:
                parts.append(str(seg))
        text = "/".join(parts)
        if self.segments[-1] is DEEP:
            text += "/."
        if self.segments[0] is DEEP:
            text = "/" + text
        return "{" + self.namespace + "}" + text


def match_segments(pattern: tuple[Segment, ...], path: tuple[str, ...]) -> bool:
    """Glob match of ``pattern`` against a concrete ``path`` (iterative, no blow-up)."""
    # Classic wildcard matching with a single backtrack point per DEEP (like fnmatch's '*').
    p = 0
    t = 0
    star_p = -1
    star_t = 0
    n_p = len(pattern)
    n_t = len(path)
    while t < n_t:
        if p < n_p:
            seg = pattern[p]
            if seg is DEEP:
                star_p = p
                star_t = t
                p += 1
                continue
            if seg is ANY or seg == path[t]:
                p += 1
                t += 1
                continue
        if star_p >= 0:
            p = star_p + 1
            star_t += 1
            t = star_t
            continue
        return False
    while p < n_p and pattern[p] is DEEP:
        p += 1
    return p == n_p


@dataclass(frozen=True, slots=True)
class TopicExpression:
    """A parsed TopicExpression: its dialect, source text and the union of its branches.

    ``patterns`` is what matching and translation use.  For the XPath dialect the patterns
    are the concrete topics the XPath selected from the topic set when it was evaluated
    (``static`` is then True: topics added later are not selected).
    """

    dialect: str
    text: str
    patterns: tuple[PathPattern, ...]
    namespaces: tuple[tuple[str, str], ...] = field(default=())
    static: bool = False

    @property
    def is_concrete(self) -> bool:
        """True when the expression names exactly one topic."""
        return len(self.patterns) == 1 and self.patterns[0].is_concrete

    def matches(self, topic: Topic) -> bool:
        """Whether ``topic`` is selected by any branch."""
        return any(p.matches(topic) for p in self.patterns)


class TopicDocument(Protocol):
    """What the XPath dialect evaluates over: a topic set as a ``wstop:TopicSet`` document
    (``topic_set.TopicSet`` is one)."""

    def xpath_document(self) -> XPathDocument:
        """The ``wstop:TopicSet`` element, each topic an element nested under its parent,
        as the XPath evaluator's node tree (``xpath_dialect.topic_document``); read only
        (the holder may share it between calls and threads)."""
        ...


def pattern_covers(outer: PathPattern, inner: PathPattern) -> bool:
    """Whether every topic ``inner`` selects is selected by ``outer`` (inclusion of two
    patterns, wildcards included: ``a//*`` covers ``a/b/*``; ``a/*`` does not cover
    ``a//*``).  Sound: True only when the inclusion holds."""
    if outer.namespace != inner.namespace:
        return False
    return _covers(_canonical(outer.segments), _canonical(inner.segments))


def _canonical(segments: tuple[Segment, ...]) -> tuple[Segment, ...]:
    """``segments`` with each run of wildcards that holds a ``//`` written as its ``*``
    steps first and one ``//`` last: the same topics (a run with k ``*`` and a ``//``
    is "at least k levels", whatever their order), in the one form :func:`_covers`
    compares step by step (so ``//*``, "one level or more", covers ``a//.``)."""
    out: list[Segment] = []
    run: list[Segment] = []
    for seg in (*segments, None):
        if seg is ANY or seg is DEEP:
            run.append(seg)
            continue
        if DEEP in run:
            out.extend([ANY] * run.count(ANY) + [DEEP])
        else:
            out.extend(run)
        run = []
        if seg is not None:
            out.append(seg)
    return tuple(out)


def _covers(outer: tuple[Segment, ...], inner: tuple[Segment, ...]) -> bool:
    # reachable[j]: outer[:i] can stand for inner[:j]; one row per outer segment
    n = len(inner)
    reachable = [True] + [False] * n
    for seg in outer:
        row = [False] * (n + 1)
        if seg is DEEP:
            # absorbs any run of inner segments, inner DEEP included
            seen = False
            for j in range(n + 1):
                seen = seen or reachable[j]
                row[j] = seen
        else:
            for j in range(n):
                if not reachable[j]:
                    continue
                step = inner[j]
                if step is DEEP:
                    continue  # a run of any length: only an outer DEEP stands for it
                if seg is ANY or seg == step:
                    row[j + 1] = True
        reachable = row
    return reachable[n]
