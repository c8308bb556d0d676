"""The MQTT session's filter planner (``adapters/mqtt/filters.py``): pure, no broker."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from wsnmom.adapters.mqtt.filters import Change, FilterSet, covers, join, overlaps


def matches(f: str, topic: str) -> bool:
    """MQTT matching, written plainly (the reference for the tests)."""
    fl, tl = f.split("/"), topic.split("/")
    for i, level in enumerate(fl):
        if level == "#":
            return True
        if i >= len(tl):
            return False
        if level != "+" and level != tl[i]:
            return False
    return len(fl) == len(tl)


LEVELS = ["a", "b", "c"]
TOPICS = ["/".join(p) for n in range(1, 5) for p in itertools.product(LEVELS, repeat=n)]


def topics_of(f: str) -> set[str]:
    return {t for t in TOPICS if matches(f, t)}


filters_st = st.lists(st.sampled_from([*LEVELS, "+"]), min_size=1, max_size=3).flatmap(
    lambda levels: st.sampled_from(["/".join(levels), "/".join([*levels, "#"])])
)


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("a/#", "a", True),
        ("a/#", "a/b/c", True),
        ("a/+", "a/b", True),
        ("a/+", "a", False),
        ("a/+", "a/b/c", False),
        ("+/+", "a/+", True),
        ("a/b", "a/+", False),
        ("#", "x/y", True),
        ("a/+/#", "a", False),
        ("a/+/#", "a/b", True),
    ],
)
def test_covers(a: str, b: str, expected: bool) -> None:
    assert covers(a, b) is expected


@given(filters_st, filters_st)
@settings(max_examples=300, deadline=None)
def test_covers_overlaps_and_join_agree_with_matching(a: str, b: str) -> None:
    ta, tb = topics_of(a), topics_of(b)
    if covers(a, b):
        assert tb <= ta
    assert overlaps(a, b) == bool(ta & tb)
    j = join(a, b)
    assert covers(j, a) and covers(j, b)
    assert ta | tb <= topics_of(j)


def check(fs: FilterSet) -> None:
    """The planner's invariants: effective filters are pairwise disjoint, every requested
    filter is covered by the effective filter that owns it."""
    for e in fs.effective:
        assert fs._trie.overlapping(e) == [e], e
    for f in fs.requested:
        owner = fs.owner[f]
        assert owner in fs.effective and covers(owner, f)
        assert f in fs.effective[owner].members
    ids = [e.id for e in fs.effective.values()]
    assert len(set(ids)) == len(ids)


def test_covered_filter_is_served_by_the_wider_one() -> None:
    fs = FilterSet()
    first = fs.assign("s1", {"a/#"})
    assert [f for f, _ in first.subscribe] == ["a/#"]
    second = fs.assign("s2", {"a/b"})
    assert not second  # nothing to subscribe: a/# brings a/b already
    assert fs.serving("s2") == fs.serving("s1")
    check(fs)


def test_wider_filter_replaces_narrower_ones_after_its_ack() -> None:
    fs = FilterSet()
    fs.assign("s1", {"a/b"})
    fs.assign("s2", {"a/c"})
    change = fs.assign("s3", {"a/+"})
    assert [f for f, _ in change.subscribe] == ["a/+"]
    assert sorted(f for f, _ in change.retire) == ["a/b", "a/c"]
    check(fs)


def test_overlapping_filters_are_joined() -> None:
    fs = FilterSet()
    fs.assign("s1", {"a/+/c"})
    change = fs.assign("s2", {"a/b/+"})
    assert [f for f, _ in change.subscribe] == ["a/+/+"]
    assert [f for f, _ in change.retire] == ["a/+/c"]
    assert list(fs.effective) == ["a/+/+"]
    check(fs)


def test_release_shrinks_back_to_what_is_needed() -> None:
    fs = FilterSet()
    fs.assign("narrow", {"a/b"})
    fs.assign("wide", {"a/#"})
    change = fs.release("wide")
    assert [f for f, _ in change.subscribe] == ["a/b"]
    assert [f for f, _ in change.retire] == ["a/#"]
    change = fs.release("narrow")
    assert change.subscribe == [] and [f for f, _ in change.retire] == ["a/b"]
    assert len(fs) == 0


def test_a_filter_shared_by_two_subscriptions_stays_until_both_are_gone() -> None:
    fs = FilterSet()
    fs.assign("s1", {"x/y"})
    assert not fs.assign("s2", {"x/y"})
    assert not fs.release("s1")
    assert [f for f, _ in fs.release("s2").retire] == ["x/y"]


def test_known_filters_keep_their_identifier_and_a_comeback_gets_a_new_one() -> None:
    fs = FilterSet({"a/b": 7})
    change = fs.assign("s", {"a/b"})
    assert change.subscribe == [("a/b", 7)]
    assert fs.acked("a/b", 7)
    retire = fs.release("s")
    assert retire.retire == [("a/b", 7)]
    again = fs.assign("s", {"a/b"})
    assert again.subscribe and again.subscribe[0][1] != 7


def test_a_change_that_subscribes_and_retires_the_same_filter_cancels_out() -> None:
    change = Change(subscribe=[("a", 1)])
    change.merge(Change(retire=[("a", 1)]))
    assert not change.cancel()


@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.lists(filters_st, max_size=3)),
        min_size=1,
        max_size=25,
    )
)
@settings(max_examples=200, deadline=None)
def test_any_sequence_keeps_the_invariants_and_covers_every_topic_once(
    steps: list[tuple[int, list[str]]],
) -> None:
    fs = FilterSet()
    for name, wanted in steps:
        fs.assign(f"s{name}", set(wanted))
        check(fs)
        for topic in TOPICS:
            serving = [e for e in fs.effective if matches(e, topic)]
            assert len(serving) <= 1
            if any(matches(f, topic) for f in fs.requested):
                assert len(serving) == 1
    for name in {n for n, _ in steps}:
        fs.release(f"s{name}")
    assert len(fs) == 0 and not fs.requested and not fs.owner


def test_many_filters_collapse_into_one_that_covers_them() -> None:
    fs = FilterSet()
    for i in range(2_000):
        fs.assign(f"s{i}", {f"ns/dev{i}/+/temp", f"ns/dev{i}/status"})
    assert len(fs) == 4_000
    change = fs.assign("all", {"ns/#"})
    assert [f for f, _ in change.subscribe] == ["ns/#"] and len(change.retire) == 4_000
    assert list(fs.effective) == ["ns/#"]
    change = fs.release("all")
    assert len(change.subscribe) == 4_000 and [f for f, _ in change.retire] == ["ns/#"]
    check(fs)
