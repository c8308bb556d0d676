"""Property tests: translated native patterns (plus residual) select exactly the topics the
WS-Topics expression selects, judged by small reference matchers of each middleware's own
matching rules, on random topic trees and on random natively published names."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from wsnmom.topic_mapping import ANY, DEEP, NameNotRepresentable, PathPattern, Topic
from wsnmom.topic_mapping.syntax import KAFKA, MQTT, RABBITMQ, WildcardSyntax
from wsnmom.topic_mapping.translate import (
    FALLBACK_NAMESPACE,
    NamespaceRoots,
    Translation,
    derived_root,
    fallback_namespace,
    native_to_topic,
    topic_to_native,
    translate,
)

# --- reference matchers (written from the middleware documentation, not from translate) --


def rabbitmq_words(key: str) -> tuple[str, ...]:
    # RabbitMQ splits on '.'; the empty key has no words, "a." has words "a" and "".
    return () if key == "" else tuple(key.split("."))


def rabbitmq_match(binding: str, routing_key: str) -> bool:
    """Topic exchange: '*' is exactly one word, '#' zero or more words."""
    b = rabbitmq_words(binding)
    k = rabbitmq_words(routing_key)

    @cache
    def m(i: int, j: int) -> bool:
        if i == len(b):
            return j == len(k)
        if b[i] == "#":
            return m(i + 1, j) or (j < len(k) and m(i, j + 1))
        if j == len(k):
            return False
        return (b[i] == "*" or b[i] == k[j]) and m(i + 1, j + 1)

    return m(0, 0)


def mqtt_match(topic_filter: str, name: str) -> bool:
    """MQTT 3.1.1 §4.7 / 5.0 §4.7: '+' one level (possibly empty), '#' last, matching the
    parent and every descendant; wildcards at the start never match '$' names."""
    assert "+" not in name and "#" not in name
    if name.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    f = topic_filter.split("/")
    t = name.split("/")
    for i, level in enumerate(f):
        if level == "#":
            assert i == len(f) - 1, "# must be the last level"
            return True
        if i >= len(t):
            return False
        if level != "+" and level != t[i]:
            return False
    return len(t) == len(f)


def kafka_match(regex: str, name: str) -> bool:
    assert regex.startswith("^") and regex.endswith("$")
    return re.fullmatch(regex, name) is not None


MATCHERS: dict[str, Callable[[str, str], bool]] = {
    "rabbitmq": rabbitmq_match,
    "mqtt": mqtt_match,
    "kafka": kafka_match,
}


def test_reference_matchers_sanity() -> None:
    assert rabbitmq_match("a.#", "a")
    assert rabbitmq_match("a.#.b", "a.b")
    assert rabbitmq_match("a.*", "a.")
    assert not rabbitmq_match("*", "")
    assert rabbitmq_match("#", "")
    assert mqtt_match("a/#", "a")
    assert mqtt_match("a/+", "a/")
    assert not mqtt_match("a/+", "a")
    assert not mqtt_match("#", "$SYS/x")
    assert mqtt_match("+/+", "/x")


# --- the world: namespaces, roots, names --------------------------------------------------

P = "urn:example:p"  # configured root (RabbitMQ exchange "ex.p", MQTT "org/p", Kafka "org.p")
Q = "urn:example:q"  # derived root
CONFIG = {"rabbitmq": "ex.p", "mqtt": "org/p", "kafka": "org.p"}

# segments chosen to hit escaping: separators, wildcard characters, the empty level,
# escape look-alikes, a root level name, non-ASCII
SEGMENTS = [
    "a",
    "b",
    "org",
    "p",
    "_x_",  # empty native level
    "a.b",
    "_x002A_",  # raw '*'
    "_x0023_",  # raw '#'
    "_x002F_",  # raw '/'
    "a_x002A_",
    "_x005F_x_",
    "_x0041_",
    "温",
    "x-y",
    "_x0032_",  # raw '2'
]


def make_roots(syntax: WildcardSyntax) -> NamespaceRoots:
    r = NamespaceRoots.for_syntax({P: CONFIG[syntax.name]}, syntax)
    r.register(Q)
    return r


def namespaces_for(syntax: WildcardSyntax) -> list[str]:
    spaces = [P, Q, FALLBACK_NAMESPACE]
    if not syntax.root_in_name:
        spaces.append(fallback_namespace("amq.topic"))
    return spaces


topic_paths = st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=4).map(tuple)


# Strategies are built once, here, not at each draw: building one (and hypothesis's checks
# of it) cost more CPU than drawing from it.
branch_segments = st.lists(
    st.one_of(st.sampled_from(SEGMENTS), st.just(ANY), st.just(DEEP)), min_size=1, max_size=5
)


@st.composite
def branches(draw: st.DrawFn, namespaces: st.SearchStrategy[str]) -> PathPattern:
    ns = draw(namespaces)
    segs = draw(branch_segments)
    assume([s for s in segs if s is not DEEP])
    return PathPattern(ns, tuple(segs))


#: per syntax, the WS-Topics expression: one to three branches
pattern_lists = {
    s.name: st.lists(branches(st.sampled_from(namespaces_for(s))), min_size=1, max_size=3)
    for s in (RABBITMQ, MQTT, KAFKA)
}


def native_match(result: Translation, syntax: WildcardSyntax, root: str | None, name: str) -> bool:
    match = MATCHERS[syntax.name]
    for p in result.patterns:
        if syntax.root_in_name:
            if match(p.pattern, name):
                return True
        elif p.root == root and match(p.pattern, name):
            return True
    return False


def delivered(
    result: Translation, syntax: WildcardSyntax, root: str | None, name: str, t: Topic
) -> bool:
    """What the gateway hands to the subscriber: native match, then the residual."""
    return native_match(result, syntax, root, name) and (
        result.residual is None or result.residual(t)
    )


def check(
    syntax: WildcardSyntax, pats: list[PathPattern], names: list[tuple[str | None, str]]
) -> None:
    roots = make_roots(syntax)
    try:
        result = translate(pats, syntax, roots)
    except NameNotRepresentable:
        assume(False)
        raise
    assert (result.residual is None) == result.exact
    for root, name in names:
        topic = native_to_topic(root, name, syntax, roots)
        selected = any(p.matches(topic) for p in pats)
        assert delivered(result, syntax, root, name, topic) == selected, (topic, root, name)
        if result.exact:
            assert native_match(result, syntax, root, name) == selected, (topic, name)


SYNTAXES = [RABBITMQ, MQTT, KAFKA]
ids = [s.name for s in SYNTAXES]
settings_ = settings(max_examples=300, suppress_health_check=[HealthCheck.filter_too_much])


#: per syntax, a topic tree: up to 25 topics (with their ancestors) in its namespaces
topic_trees = {
    s.name: st.lists(
        st.tuples(st.sampled_from(namespaces_for(s)), topic_paths), min_size=1, max_size=25
    )
    for s in SYNTAXES
}


@pytest.mark.parametrize("syntax", SYNTAXES, ids=ids)
@settings_
@given(data=st.data())
def test_patterns_select_the_same_topics_on_topic_trees(
    syntax: WildcardSyntax, data: st.DataObject
) -> None:
    """Random topic trees (WS-N side) translated to native names."""
    pats = data.draw(pattern_lists[syntax.name])
    tree = data.draw(topic_trees[syntax.name])
    roots = make_roots(syntax)
    names: list[tuple[str | None, str]] = []
    for ns, path in tree:
        # the tree contains every ancestor of a drawn topic
        for i in range(1, len(path) + 1):
            topic = Topic(ns, path[:i])
            try:
                native = topic_to_native(topic, syntax, roots)
            except NameNotRepresentable:
                continue
            assert native_to_topic(native.root, native.name, syntax, roots) == topic
            names.append((native.root, native.name))
    check(syntax, pats, names)


def native_levels(syntax: WildcardSyntax) -> st.SearchStrategy[str]:
    """Levels a native publisher may use (never a wildcard token; MQTT: no '+', '#')."""
    if syntax is KAFKA:
        pool = ["a", "b", "org", "p", "", "_x002E_", "a_b", "x-y", "_x0041_", "_x006E_"]
    else:
        pool = ["a", "b", "org", "p", "", "a*b", "温", "2024", "_x002A_", "_x005F_x_", "x y"]
    if syntax is RABBITMQ:
        pool += ["a/b", "+"]
    if syntax is MQTT:
        pool += ["a.b", "*"]
    return st.sampled_from(pool)


#: per syntax, the levels of one natively published name (one to four)
native_level_lists = {s.name: st.lists(native_levels(s), min_size=1, max_size=4) for s in SYNTAXES}
#: per syntax, the roots a native name is published under, known and unknown
native_roots = {
    "rabbitmq": st.sampled_from(["ex.p", derived_root(Q), "amq.topic", ""]),
    "mqtt": st.sampled_from(["org/p", derived_root(Q), "org", ""]),
    "kafka": st.sampled_from(["org.p", derived_root(Q), "org", ""]),
}
name_counts = st.integers(1, 20)


@pytest.mark.parametrize("syntax", SYNTAXES, ids=ids)
@settings_
@given(data=st.data())
def test_patterns_select_the_same_topics_on_native_names(
    syntax: WildcardSyntax, data: st.DataObject
) -> None:
    """Random natively published names, under known and unknown roots."""
    pats = data.draw(pattern_lists[syntax.name])
    names: list[tuple[str | None, str]] = []
    for _ in range(data.draw(name_counts)):
        prefix = data.draw(native_roots[syntax.name])
        levels = data.draw(native_level_lists[syntax.name])
        rest = syntax.separator.join(levels)
        if syntax.root_in_name:
            name = syntax.separator.join([prefix, rest]) if prefix else rest
            root: str | None = None  # found from the name
        else:
            name, root = rest, prefix
        if name == "" or name in syntax.reserved_names:
            continue
        names.append((root, name))
    check(syntax, pats, names)
