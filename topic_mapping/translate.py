"""Translation between WS-Topics topics/expressions and native middleware names/patterns.

Pure functions over the canonical model (:mod:`.model`) and a :class:`~.syntax.WildcardSyntax`.

Names
    A topic ``{ns}a/b`` becomes the namespace's *root* followed by the escaped segments
    (:mod:`.escaping`), joined by the separator.  :func:`topic_to_native` returns a
    :class:`NativeName` ``(root, name)``: for syntaxes with ``root_in_name`` (MQTT, Kafka)
    ``name`` is the whole native name including the root (what one publishes to); for
    RabbitMQ ``root`` is the exchange and ``name`` the routing key (root excluded).

Roots (:class:`NamespaceRoots`, :mod:`.roots`)
    Which namespace a native name's first levels (RabbitMQ: its exchange) belong to:
    configured roots, roots derived from the namespace URI, and the fallback namespace
    ``urn:wsnmom:native`` of names under no known root.  The names of :mod:`.roots` are
    imported from here as well.

Patterns
    :func:`translate` compiles a union of :class:`~.model.PathPattern` branches to the
    tightest native patterns the syntax can express, plus a residual predicate when they are
    wider than the expression:

    * RabbitMQ: ``*`` and ``#`` anywhere: always exact.
    * MQTT: ``+`` anywhere, ``#`` last only.  A wildcard-only tail after the first ``//``
      is exact (``a//.`` -> ``a/#``, ``a//*`` -> ``a/+/#``); a ``//`` followed by a literal
      is cut at that ``//`` to ``prefix`` + one ``+`` per remaining non-``//`` step + ``#``
      (``a//c`` -> ``a/+/#``) and needs the residual.
    * Kafka: an anchored regular expression per branch over whole topic names: exact.
    * Branches in the fallback namespace of a root-in-name syntax are never exact (their
      patterns start outside any root and can match names of other namespaces).

    A native ``+``/``*``/regex single level also matches an *empty* native level.  That is
    consistent: an empty level is the topic segment ``_x_`` and the WS-Topics ``*`` selects
    it too.  A native name that would be entirely empty is not representable.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .errors import NameNotRepresentable
from .escaping import decode_segment, encode_segment
from .model import ANY, DEEP, PathPattern, Segment, Topic, TopicExpression, Wildcard
from .roots import (
    FALLBACK_NAMESPACE,
    NamespaceRoots,
    Root,
    derived_root,
    fallback_namespace,
    fallback_root,
)
from .syntax import WildcardSyntax

__all__ = [
    "FALLBACK_NAMESPACE",
    "NamespaceRoots",
    "NativeName",
    "NativePattern",
    "ResidualFilter",
    "Root",
    "Translation",
    "derived_root",
    "fallback_namespace",
    "fallback_root",
    "native_to_topic",
    "topic_to_native",
    "translate",
]


@dataclass(frozen=True, slots=True)
class NativeName:
    """Where a topic lives natively.

    ``root``: the namespace's root levels joined by the separator (RabbitMQ: the exchange).
    ``name``: what is published to: the full name (root included) for root-in-name syntaxes,
    the routing key (root excluded) for RabbitMQ.
    """

    root: str
    name: str


@dataclass(frozen=True, slots=True)
class NativePattern:
    """One native subscription.

    ``root`` as in :class:`NativeName` (RabbitMQ: the exchange to bind to); ``pattern``: the
    binding key (root excluded), MQTT topic filter (root included) or Kafka regex over full
    topic names; ``exact``: it matches exactly the topics of the branches it came from.
    """

    root: str
    pattern: str
    exact: bool


@dataclass(frozen=True, slots=True)
class ResidualFilter:
    """In-process predicate: the topic is selected by one of ``branches``."""

    branches: tuple[PathPattern, ...]

    def __call__(self, topic: Topic) -> bool:
        return any(p.matches(topic) for p in self.branches)

    def describe(self) -> str:
        """Human-readable form, e.g. ``topic in {urn:x}a//c | {urn:x}b``."""
        return "topic in " + " | ".join(str(p) for p in self.branches)


@dataclass(frozen=True, slots=True)
class Translation:
    """Native patterns for an expression; ``residual`` is None iff ``exact``."""

    patterns: tuple[NativePattern, ...]
    exact: bool
    residual: ResidualFilter | None

    def accepts(self, topic: Topic) -> bool:
        """Residual check for a delivered topic (always True when exact)."""
        return self.residual is None or self.residual(topic)


# --- names ---------------------------------------------------------------------------


def _check_root(root: Root, syntax: WildcardSyntax) -> None:
    if syntax.root_in_name:
        for level in root:
            if not syntax.is_plain_level(level):
                raise NameNotRepresentable(
                    f"root level {level!r} is not a plain {syntax.name} level"
                )
    elif len(root) > 1:
        raise NameNotRepresentable(f"{syntax.name} roots have one level, got {root!r}")


def _root_of(namespace: str, syntax: WildcardSyntax, roots: NamespaceRoots) -> Root:
    root = roots.root_for(namespace)
    fb = fallback_root(namespace)
    if fb is not None:
        if syntax.root_in_name and fb:
            raise NameNotRepresentable(
                f"{namespace!r}: {syntax.name} names under no known root belong to "
                f"{FALLBACK_NAMESPACE!r} itself"
            )
        if not syntax.root_in_name and fb and roots.namespace_for_root(root) is not None:
            raise NameNotRepresentable(
                f"{namespace!r}: exchange {fb!r} belongs to {roots.namespace_for_root(root)!r}"
            )
    _check_root(root, syntax)
    return root


def _finish_name(name: str, syntax: WildcardSyntax, what: str) -> None:
    if not name:
        raise NameNotRepresentable(f"the {syntax.name} {what} would be empty")
    if syntax.root_in_name:
        if syntax.reserved_prefix and name.startswith(syntax.reserved_prefix):
            raise NameNotRepresentable(
                f"{syntax.name} {what} {name!r} starts with reserved {syntax.reserved_prefix!r}"
            )
        if name in syntax.reserved_names:
            raise NameNotRepresentable(f"{name!r} is not a legal {syntax.name} {what}")
    syntax.check_length(name, what)


def topic_to_native(topic: Topic, syntax: WildcardSyntax, roots: NamespaceRoots) -> NativeName:
    """Native name of ``topic``; NameNotRepresentable when it cannot be written (too long,
    empty, reserved, or it would be read back as another namespace's topic)."""
    root = _root_of(topic.namespace, syntax, roots)
    words = tuple(encode_segment(s, syntax) for s in topic.path)
    sep = syntax.separator
    if syntax.root_in_name:
        if not root and roots.claims(words):
            raise NameNotRepresentable(
                f"{topic}: its native name would be read as a topic of another namespace"
            )
        name = sep.join((*root, *words))
    else:
        name = sep.join(words)
    _finish_name(name, syntax, "name")
    return NativeName(sep.join(root), name)


def native_to_topic(
    root: str | None, name: str, syntax: WildcardSyntax, roots: NamespaceRoots
) -> Topic:
    """Topic of a native name (inverse of :func:`topic_to_native`).

    For root-in-name syntaxes ``root`` may be None (it is found from ``name``); if given it
    must be the root the name lives under.  For RabbitMQ ``root`` is the exchange.
    """
    if not name:
        raise NameNotRepresentable(f"an empty {syntax.name} name has no topic")
    sep = syntax.separator
    levels = name.split(sep)
    if syntax.root_in_name:
        namespace, found, rest = roots.split(levels)
        if root is not None and root != sep.join(found):
            raise NameNotRepresentable(f"{name!r} does not live under the root {root!r}")
    else:
        exchange = root or ""
        known = roots.namespace_for_root((exchange,) if exchange else ())
        namespace = known if known is not None else fallback_namespace(exchange)
        rest = tuple(levels)
    return Topic(namespace, tuple(decode_segment(w, syntax) for w in rest))


# --- patterns ------------------------------------------------------------------------

# A native token sequence: native words (str), ANY (single-level) and DEEP (multi-level
# token, with the syntax's own parent-matching semantics).
_Tokens = tuple[str | Wildcard, ...]


def _at_least(
    prefix: Sequence[str | Wildcard], k: int, syntax: WildcardSyntax
) -> tuple[list[_Tokens], bool]:
    """Patterns matching ``prefix`` followed by at least ``k`` more levels, and whether they
    match exactly that (they are wider when the syntax lacks a single-level token)."""
    if syntax.multi_level is None:
        raise NameNotRepresentable(f"{syntax.name} has no multi-level wildcard to widen to")
    want = k
    if syntax.single_level is None:
        k = min(k, 0 if syntax.multi_level_matches_parent else 1)
    exact = k == want
    if syntax.multi_level_matches_parent:
        return [(*prefix, *([ANY] * k), DEEP)], exact
    if k >= 1:
        return [(*prefix, *([ANY] * (k - 1)), DEEP)], exact
    # one-or-more token: the prefix itself is a separate pattern
    return ([tuple(prefix), (*prefix, DEEP)] if prefix else [(DEEP,)]), exact


def _direct(seg: Segment, last: bool, syntax: WildcardSyntax) -> bool:
    if seg is ANY:
        return syntax.single_level is not None
    if seg is DEEP:
        return (
            syntax.multi_level is not None
            and syntax.multi_level_matches_parent
            and (last or syntax.multi_level_mid_path)
        )
    return True


def _native_tokens(
    segments: tuple[Segment, ...], syntax: WildcardSyntax
) -> tuple[list[_Tokens], bool]:
    """Token sequences covering ``segments`` (literals already native) and exactness."""
    n = len(segments)
    if all(_direct(s, i == n - 1, syntax) for i, s in enumerate(segments)):
        return [segments], True
    cut = next(i for i, s in enumerate(segments) if not _direct(s, i == n - 1, syntax))
    prefix = segments[:cut]
    tail = segments[cut:]
    if tail[0] is DEEP and all(isinstance(s, Wildcard) for s in tail):
        # "at least k more levels" (ANYs just before the DEEP count too): no residual needed
        k = sum(1 for s in tail if s is ANY)
        while prefix and prefix[-1] is ANY:
            prefix = prefix[:-1]
            k += 1
        return _at_least(prefix, k, syntax)
    # cut here: every remaining non-DEEP step still needs one level
    options, _ = _at_least(prefix, sum(1 for s in tail if s is not DEEP), syntax)
    return options, False


def _normalise(segments: tuple[Segment, ...]) -> tuple[Segment, ...]:
    """Rewrite every run of wildcards that contains a DEEP as its ANYs followed by one DEEP
    (both mean "at least k levels"): ``a//*`` becomes ``a/*//.``, i.e. ``a.*.#``."""
    out: list[Segment] = []
    run: list[Segment] = []

    def flush() -> None:
        if DEEP in run:
            out.extend([ANY] * run.count(ANY))
            out.append(DEEP)
        else:
            out.extend(run)
        run.clear()

    for seg in segments:
        if isinstance(seg, Wildcard):
            run.append(seg)
        else:
            flush()
            out.append(seg)
    flush()
    return tuple(out)


def _render_plain(root: Root, tokens: _Tokens, syntax: WildcardSyntax) -> str:
    parts: list[str] = []
    for t in tokens:
        if t is ANY:
            assert syntax.single_level is not None
            parts.append(syntax.single_level)
        elif t is DEEP:
            assert syntax.multi_level is not None
            parts.append(syntax.multi_level)
        else:
            assert isinstance(t, str)
            parts.append(t)
    if syntax.root_in_name:
        parts = [*root, *parts]
    return syntax.separator.join(parts)


def _render_regex(root: Root, tokens: _Tokens, syntax: WildcardSyntax) -> str:
    sep = re.escape(syntax.separator)
    level = "[^" + (sep if syntax.separator in "\\]^-" else syntax.separator) + "]*"
    elements: list[str | Wildcard] = [*root, *tokens]
    out: list[str] = []
    need_sep = False
    for i, e in enumerate(elements):
        if e is DEEP:
            if i == 0:
                out.append(f"({level}{sep})*")
                need_sep = False
            else:
                out.append(f"({sep}{level})*")
                need_sep = True
            continue
        if need_sep:
            out.append(sep)
        out.append(level if e is ANY else re.escape(str(e)))
        need_sep = True
    return "^" + "".join(out) + "$"


def _covers(p: _Tokens, q: _Tokens) -> bool:
    """Sound (not complete) test that every path matched by ``q`` is matched by ``p``; both
    use zero-or-more DEEP semantics."""
    memo: dict[tuple[int, int], bool] = {}

    def go(i: int, j: int) -> bool:
        key = (i, j)
        if key in memo:
            return memo[key]
        if j == len(q):
            result = all(t is DEEP for t in p[i:])
        elif i == len(p):
            result = False
        elif p[i] is DEEP:
            result = go(i + 1, j) or go(i, j + 1)
        elif q[j] is DEEP:
            # q's DEEP is either nothing, or one arbitrary level followed by DEEP again
            result = go(i, j + 1) and p[i] is ANY and go(i + 1, j)
        elif p[i] is ANY:
            result = go(i + 1, j + 1)
        else:
            result = q[j] == p[i] and go(i + 1, j + 1)
        memo[key] = result
        return result

    return go(0, 0)


def _semantic(tokens: _Tokens, syntax: WildcardSyntax) -> _Tokens:
    """Tokens with zero-or-more DEEP semantics (one-or-more DEEP becomes ANY DEEP)."""
    if syntax.regex or syntax.multi_level_matches_parent:
        return tokens
    out: list[str | Wildcard] = []
    for t in tokens:
        out.extend((ANY, DEEP) if t is DEEP else (t,))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class _Candidate:
    root: str
    tokens: _Tokens
    semantic: _Tokens
    pattern: str
    exact: bool


def translate(
    expr: TopicExpression | Iterable[PathPattern],
    syntax: WildcardSyntax,
    roots: NamespaceRoots,
) -> Translation:
    """Compile ``expr`` (a union of branches) to native patterns for ``syntax``.

    Patterns covered by another pattern on the same root are dropped (by a sound syntactic
    containment test; of equivalent patterns an exact one is kept, else the first).
    NameNotRepresentable when a branch cannot be written (pattern too long, empty, no
    wildcard to widen to).
    """
    branches = expr.patterns if isinstance(expr, TopicExpression) else tuple(expr)
    if not branches:
        raise ValueError("an expression has at least one branch")
    candidates: list[_Candidate] = []
    sep = syntax.separator
    for branch in branches:
        root = _root_of(branch.namespace, syntax, roots)
        segments: tuple[Segment, ...] = _normalise(
            tuple(encode_segment(s, syntax) if isinstance(s, str) else s for s in branch.segments)
        )
        loose_root = syntax.root_in_name and not root
        if syntax.regex:
            options, exact = [segments], True
        else:
            options, exact = _native_tokens(segments, syntax)
        for tokens in options:
            if syntax.regex:
                pattern = _render_regex(root, tokens, syntax)
            else:
                pattern = _render_plain(root, tokens, syntax)
                _finish_name(pattern, syntax, "pattern")
            candidates.append(
                _Candidate(
                    root=sep.join(root),
                    tokens=tokens,
                    semantic=_semantic(tokens, syntax),
                    pattern=pattern,
                    exact=exact and not loose_root,
                )
            )
    kept: list[_Candidate] = []
    for i, c in enumerate(candidates):
        dropped = False
        for j, d in enumerate(candidates):
            if i == j or d.root != c.root or not _covers(d.semantic, c.semantic):
                continue
            # strictly covered, or equivalent and d is preferred (exact first, then earlier)
            if (
                not _covers(c.semantic, d.semantic)
                or (d.exact and not c.exact)
                or (d.exact == c.exact and j < i)
            ):
                dropped = True
                break
        if not dropped:
            kept.append(c)
    exact = all(c.exact for c in kept)
    return Translation(
        patterns=tuple(NativePattern(c.root, c.pattern, c.exact) for c in kept),
        exact=exact,
        residual=None if exact else ResidualFilter(branches),
    )
