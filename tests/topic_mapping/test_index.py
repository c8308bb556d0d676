"""TopicIndex: agrees with brute-force ``PathPattern.matches``; add, replace, remove."""

from __future__ import annotations

import threading

from hypothesis import given, settings
from hypothesis import strategies as st
from wsnmom.topic_mapping import (
    ANY,
    DEEP,
    FULL,
    PathPattern,
    Segment,
    Topic,
    TopicIndex,
    parse_topic_expression,
)

NAMESPACES = ["urn:a", "urn:b"]
NAMES = ["a", "b", "c"]

segment_st: st.SearchStrategy[Segment] = st.sampled_from([*NAMES, ANY, DEEP])


@st.composite
def patterns(draw: st.DrawFn) -> PathPattern:
    ns = draw(st.sampled_from(NAMESPACES))
    segs = draw(st.lists(segment_st, min_size=1, max_size=5))
    if all(s is DEEP for s in segs):
        segs.append(draw(st.sampled_from([*NAMES, ANY])))
    return PathPattern(ns, tuple(segs))


topics_st = st.builds(
    Topic,
    st.sampled_from(NAMESPACES),
    st.lists(st.sampled_from(NAMES), min_size=1, max_size=6).map(tuple),
)

subscriptions_st = st.dictionaries(
    st.integers(0, 50), st.lists(patterns(), min_size=1, max_size=3), max_size=25
)


def brute(subs: dict[int, list[PathPattern]], topic: Topic) -> set[int]:
    return {k for k, ps in subs.items() if any(p.matches(topic) for p in ps)}


@settings(max_examples=300, deadline=None)
@given(subscriptions_st, st.lists(topics_st, min_size=1, max_size=10))
def test_index_agrees_with_brute_force(
    subs: dict[int, list[PathPattern]], topics: list[Topic]
) -> None:
    index: TopicIndex[int] = TopicIndex()
    for key, ps in subs.items():
        index.add(key, ps)
    assert len(index) == len(subs)
    for topic in topics:
        assert index.match(topic) == brute(subs, topic)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.booleans(), st.integers(0, 10), st.lists(patterns(), min_size=1, max_size=3)),
        max_size=40,
    ),
    st.lists(topics_st, min_size=1, max_size=8),
)
def test_add_replace_remove_sequence(
    ops: list[tuple[bool, int, list[PathPattern]]], topics: list[Topic]
) -> None:
    index: TopicIndex[int] = TopicIndex()
    model: dict[int, list[PathPattern]] = {}
    for is_add, key, ps in ops:
        if is_add:
            index.add(key, ps)
            model[key] = ps
        else:
            assert index.remove(key) == (key in model)
            model.pop(key, None)
        assert len(index) == len(model)
        for key in model:
            assert key in index
    for topic in topics:
        assert index.match(topic) == brute(model, topic)
    for key in list(model):
        index.remove(key)
    assert len(index) == 0
    assert index._roots == {}  # every trie node pruned


def test_add_expression_and_examples() -> None:
    index: TopicIndex[str] = TopicIndex()
    ns = {"p": "urn:a"}
    index.add("all", parse_topic_expression("p://*", FULL, ns))
    index.add("a-sub", parse_topic_expression("p:a//.", FULL, ns))
    index.add("a-kids", parse_topic_expression("p:a/*", FULL, ns))
    index.add("mid", parse_topic_expression("p:a//c | p:x", FULL, ns))
    assert index.match(Topic("urn:a", ("a",))) == {"all", "a-sub"}
    assert index.match(Topic("urn:a", ("a", "b"))) == {"all", "a-sub", "a-kids"}
    assert index.match(Topic("urn:a", ("a", "b", "c"))) == {"all", "a-sub", "mid"}
    assert index.match(Topic("urn:a", ("x",))) == {"all", "mid"}
    assert index.match(Topic("urn:b", ("a",))) == set()
    assert "mid" in index and "nope" not in index
    assert not index.remove("nope")
    assert index.remove("all")
    assert index.match(Topic("urn:a", ("x",))) == {"mid"}


def test_same_key_replaced_not_merged() -> None:
    index: TopicIndex[str] = TopicIndex()
    index.add("k", [PathPattern("urn:a", ("a",))])
    index.add("k", [PathPattern("urn:a", ("b",))])
    assert index.match(Topic("urn:a", ("a",))) == set()
    assert index.match(Topic("urn:a", ("b",))) == {"k"}
    assert index.patterns("k") == (PathPattern("urn:a", ("b",)),)
    assert len(index) == 1


def test_concurrent_readers_and_writer() -> None:
    index: TopicIndex[int] = TopicIndex()
    stable = PathPattern("urn:a", ("a", DEEP))
    index.add(-1, [stable])
    errors: list[BaseException] = []
    stop = threading.Event()

    def writer() -> None:
        try:
            for i in range(3000):
                index.add(i, [PathPattern("urn:a", ("a", NAMES[i % 3], ANY))])
                if i >= 10:
                    index.remove(i - 10)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            stop.set()

    def reader() -> None:
        try:
            topic = Topic("urn:a", ("a", "b", "c"))
            while not stop.is_set():
                assert -1 in index.match(topic)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer)]
    threads += [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(index) == 11
