"""Worked examples of topic expressions evaluated over TREE-S and TREE-X (the trees of
conftest.py; WS-Topics §7.3.1 for the full dialect) and the alias resolution rules of
WS-Topics §8."""

from __future__ import annotations

import pytest
from wsnmom.topic_mapping import (
    CONCRETE,
    FULL,
    SIMPLE,
    InvalidTopicExpression,
    Topic,
    TopicNamespace,
    TopicNotSupported,
    TopicSet,
    load_topic_namespace,
    parse_topic_expression,
)

from .conftest import NS, TNS, paths, select

ALL_S = {"t1", "t1/t2", "t1/t3", "t4", "t4/t5", "t4/t6"}


@pytest.mark.parametrize(
    ("case", "dialect", "text", "expected"),
    [
        ("X1", SIMPLE, "tns:t1", {"t1"}),
        ("X2", CONCRETE, "tns:t1/t3", {"t1/t3"}),
        ("F1", FULL, "tns:t1/*", {"t1/t2", "t1/t3"}),
        ("F2", FULL, "tns:t1/*/t3", set()),
        ("F3", FULL, "tns:*", {"t1", "t4"}),
        ("F4", FULL, "tns:t1/t3//.", {"t1/t3"}),
        ("F5", FULL, "tns:t1/t3//*", set()),
        ("F6", FULL, "tns://*", ALL_S),
        ("F7", FULL, "tns:t1//t3", {"t1/t3"}),
        ("F8", FULL, "tns:t1/t2 | tns:t4/t5", {"t1/t2", "t4/t5"}),
    ],
)
def test_tree_s_examples(
    tree_s: TopicNamespace, case: str, dialect: str, text: str, expected: set[str]
) -> None:
    assert paths(tree_s.topics()) == ALL_S
    expr = parse_topic_expression(text, dialect, NS)
    assert select(expr, tree_s.topics()) == expected, case


def test_x3_alias_resolves_to_its_target(tree_s: TopicNamespace) -> None:
    ts = TopicSet([tree_s])
    expr = ts.validate(parse_topic_expression("tns:t4/t6", CONCRETE, NS))
    assert expr.is_concrete
    assert expr.patterns[0].as_topic() == Topic(TNS, ("t1", "t3"))
    assert paths(ts.select(expr)) == {"t1/t3"}


ALL_X = {
    "t1",
    "t1/t2",
    "t1/t2/t3",
    "t1/t2/t9",
    "t1/t3",
    "t1/t3/t7",
    "t1/t3/t7/t3",
    "t4",
    "t4/t5",
    "t4/t6",
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("tns:t1/*", {"t1/t2", "t1/t3"}),
        ("tns:t1/*/t3", {"t1/t2/t3"}),
        ("tns:*", {"t1", "t4"}),
        ("tns:t1/t3//.", {"t1/t3", "t1/t3/t7", "t1/t3/t7/t3"}),
        ("tns:t1/t3//*", {"t1/t3/t7", "t1/t3/t7/t3"}),
        ("tns://*", ALL_X),
        ("tns:t1//t3", {"t1/t2/t3", "t1/t3", "t1/t3/t7/t3"}),
        ("tns:t1/t2 | tns:t4/t5", {"t1/t2", "t4/t5"}),
        ("tns://t3", {"t1/t2/t3", "t1/t3", "t1/t3/t7/t3"}),
        ("tns:t1//*/t3", {"t1/t2/t3", "t1/t3/t7/t3"}),
        ("tns:t1/.", {"t1"}),
        ("tns:t1/./t2", {"t1/t2"}),
        ("tns:t1//./t2", {"t1/t2"}),
        ("tns:*/t5", {"t4/t5"}),
        ("tns:t1/*//.", {"t1/t2", "t1/t2/t3", "t1/t2/t9", "t1/t3", "t1/t3/t7", "t1/t3/t7/t3"}),
        ("tns:*//.", ALL_X),
        ("tns:t4/*", {"t4/t5", "t4/t6"}),
    ],
)
def test_tree_x_table(tree_x: TopicNamespace, text: str, expected: set[str]) -> None:
    assert paths(tree_x.topics()) == ALL_X
    expr = parse_topic_expression(text, FULL, NS)
    assert select(expr, tree_x.topics()) == expected


# -- open decision: §8 rule 3 (a wildcard selecting an alias) -----------------------------------


@pytest.mark.parametrize("fixture", ["tree_s", "tree_x"])
def test_wildcard_selecting_alias_uses_intent_reading(
    fixture: str, request: pytest.FixtureRequest
) -> None:
    """Decision: the intent reading.  ``tns:t4/*`` delivers t4/t5 traffic and the traffic of
    t1/t3, which is where anything published "on" the alias t4/t6 actually goes."""
    ts = TopicSet([request.getfixturevalue(fixture)])
    expr = ts.validate(parse_topic_expression("tns:t4/*", FULL, NS))
    assert paths(ts.select(expr)) == {"t4/t5", "t1/t3"}
    assert expr.matches(Topic(TNS, ("t1", "t3")))
    assert not expr.matches(Topic(TNS, ("t1", "t2")))


def test_whole_space_wildcard_with_alias(tree_x: TopicNamespace) -> None:
    ts = TopicSet([tree_x])
    expr = ts.validate(parse_topic_expression("tns://*", FULL, NS))
    assert paths(ts.select(expr)) == ALL_X - {"t4/t6"}


# -- syntax negatives (A.2.5) -------------------------------------------------------------------

FULL_NEGATIVES = [
    "tns:t1/",
    "tns:t1///t2",
    "tns:t1/..",
    "/tns:t1",
    "//tns:t1",
    "tns:t1/xyz:t2",
    "tns:t1[1]",
    "tns:t1/@name",
    "tns:1t",
    "tns:.",
    "tns:t1 /t2",
    "",
    "foo:t1",
]


@pytest.mark.parametrize("text", FULL_NEGATIVES)
def test_full_syntax_negatives(text: str) -> None:
    with pytest.raises(InvalidTopicExpression):
        parse_topic_expression(text, FULL, NS)


@pytest.mark.parametrize("text", ["//tns:t1", "/tns:t1"])
def test_full_negatives_also_with_a_default_namespace(text: str) -> None:
    ns: dict[str | None, str] = {**NS, None: TNS}
    with pytest.raises(InvalidTopicExpression):
        parse_topic_expression(text, FULL, ns)


@pytest.mark.parametrize("text", ["tns:t1/t2", "tns:*"])
def test_simple_syntax_negatives(text: str) -> None:
    with pytest.raises(InvalidTopicExpression):
        parse_topic_expression(text, SIMPLE, NS)


@pytest.mark.parametrize(
    "text", ["tns:t1/*", "tns:t1//t2", "tns:t1/.", "tns:t1|tns:t4", "tns:t1 | tns:t4"]
)
def test_concrete_syntax_negatives(text: str) -> None:
    with pytest.raises(InvalidTopicExpression):
        parse_topic_expression(text, CONCRETE, NS)


# -- A.3: §7.3.1 validation ---------------------------------------------------------------------

TNS1 = "http://example.org/tns1"
NS1 = {"tns1": TNS1}

TNS1_DOC = f"""<wstop:TopicNamespace xmlns:wstop="http://docs.oasis-open.org/wsn/t-1"
    name="Example" targetNamespace="{TNS1}">
  <wstop:Topic name="A" final="true"/>
  <wstop:Topic name="B" final="false"/>
</wstop:TopicNamespace>"""


@pytest.fixture
def tns1() -> TopicNamespace:
    return load_topic_namespace(TNS1_DOC)


@pytest.fixture
def fixed_b(tns1: TopicNamespace) -> TopicSet:
    return TopicSet([tns1], topics=[Topic(TNS1, ("B",))], fixed=True)


@pytest.fixture
def open_set(tns1: TopicNamespace) -> TopicSet:
    return TopicSet([tns1])


@pytest.mark.parametrize(
    "text", ["tns1:D", "tns1:A/X", "tns1:B/X", "tns1:A", "tns1:B | tns1:D", "tns1:D/*"]
)
def test_fixed_set_rejects(fixed_b: TopicSet, text: str) -> None:
    with pytest.raises(TopicNotSupported):
        fixed_b.validate(parse_topic_expression(text, FULL, NS1))


@pytest.mark.parametrize("text", ["tns1:*", "tns1://*", "tns1:A | tns1:B", "tns1:B"])
def test_fixed_set_permits_equivalent_to_b(fixed_b: TopicSet, text: str) -> None:
    expr = fixed_b.validate(parse_topic_expression(text, FULL, NS1))
    assert fixed_b.select(expr) == {Topic(TNS1, ("B",))}
    assert expr.matches(Topic(TNS1, ("B",)))


def test_union_branch_outside_fixed_set_is_dropped(fixed_b: TopicSet) -> None:
    expr = fixed_b.validate(parse_topic_expression("tns1:A | tns1:B", FULL, NS1))
    assert [p.as_topic() for p in expr.patterns] == [Topic(TNS1, ("B",))]


@pytest.mark.parametrize("text", ["tns1:B/X", "tns1:A", "tns1:B/X/Y", "tns1:*", "tns1:B//*"])
def test_open_set_permits(open_set: TopicSet, text: str) -> None:
    """Without a fixed set only rule 1 applies: B is non-final, so B/X and B/X/Y may grow."""
    open_set.validate(parse_topic_expression(text, FULL, NS1))


@pytest.mark.parametrize("text", ["tns1:D", "tns1:A/X", "tns1:A/X/Y", "tns1:B | tns1:D"])
def test_open_set_rule1_rejects(open_set: TopicSet, text: str) -> None:
    with pytest.raises(TopicNotSupported):
        open_set.validate(parse_topic_expression(text, FULL, NS1))


def test_growth_follows_rule1(open_set: TopicSet, fixed_b: TopicSet) -> None:
    bx = Topic(TNS1, ("B", "X"))
    assert open_set.permits(bx)
    open_set.admit(bx)
    assert bx in open_set
    assert not open_set.permits(Topic(TNS1, ("A", "X")))
    with pytest.raises(TopicNotSupported):
        open_set.admit(Topic(TNS1, ("A", "X")))
    with pytest.raises(TopicNotSupported):
        open_set.admit(Topic(TNS1, ("D",)))
    assert not fixed_b.permits(bx)
    assert not fixed_b.permits(Topic(TNS1, ("A",)))
    assert fixed_b.permits(Topic(TNS1, ("B",)))
    with pytest.raises(TopicNotSupported):
        fixed_b.admit(bx)


# -- §8 alias resolution ------------------------------------------------------------------------

C10 = "http://www.ibm.com/xmlns/stdwip/web-services/WS-Topics/TopicExpression/concreteTopicPath"
F10 = "http://www.ibm.com/xmlns/stdwip/web-services/WS-Topics/TopicExpression/FullTopicPath"


def _space(topics: str) -> TopicNamespace:
    return load_topic_namespace(
        f"""<w:TopicSpace xmlns:w="http://www.ibm.com/xmlns/stdwip/web-services/WS-Topics"
        xmlns:tns="{TNS}" targetNamespace="{TNS}">{topics}</w:TopicSpace>"""
    )


def _alias(name: str, dialect: str, text: str) -> str:
    return f'<w:Topic name="{name}"><w:AliasRef dialect="{dialect}">{text}</w:AliasRef></w:Topic>'


def _resolve(ts: TopicSet, text: str) -> set[str]:
    return paths(ts.select(ts.validate(parse_topic_expression(text, FULL, NS))))


def test_alias_chain_resolves_recursively() -> None:
    ts = TopicSet(
        [_space('<w:Topic name="a"/>' + _alias("b", C10, "tns:c") + _alias("c", C10, "tns:a"))]
    )
    assert _resolve(ts, "tns:b") == {"a"}


def test_alias_union_each_branch_resolved() -> None:
    ts = TopicSet(
        [
            _space(
                '<w:Topic name="a"/><w:Topic name="d"><w:Topic name="e"/></w:Topic>'
                + _alias("b", F10, "tns:a | tns:c")
                + _alias("c", C10, "tns:d/e")
            )
        ]
    )
    assert _resolve(ts, "tns:b") == {"a", "d/e"}


def test_alias_to_wildcard() -> None:
    ts = TopicSet(
        [
            _space(
                '<w:Topic name="d"><w:Topic name="e"/><w:Topic name="f"/></w:Topic>'
                + _alias("b", F10, "tns:d/*")
            )
        ]
    )
    assert _resolve(ts, "tns:b") == {"d/e", "d/f"}


def test_alias_cycle_contributes_nothing() -> None:
    ts = TopicSet(
        [_space('<w:Topic name="a"/>' + _alias("b", C10, "tns:c") + _alias("c", C10, "tns:b"))]
    )
    with pytest.raises(TopicNotSupported, match="no topic"):
        ts.validate(parse_topic_expression("tns:b", FULL, NS))
    # the cyclic branch is dropped, the other branch survives
    assert _resolve(ts, "tns:b | tns:a") == {"a"}


def test_alias_to_itself() -> None:
    ts = TopicSet([_space(_alias("b", C10, "tns:b"))])
    with pytest.raises(TopicNotSupported):
        ts.validate(parse_topic_expression("tns:b", CONCRETE, NS))


def test_alias_cycle_through_union_keeps_other_branch() -> None:
    ts = TopicSet([_space('<w:Topic name="a"/>' + _alias("b", F10, "tns:a | tns:b"))])
    assert _resolve(ts, "tns:b") == {"a"}


def test_wildcard_alias_cycle_terminates() -> None:
    """Alias b points at 'tns:*', which selects b itself: the self branch adds nothing."""
    ts = TopicSet([_space('<w:Topic name="a"/>' + _alias("b", F10, "tns:*"))])
    assert _resolve(ts, "tns:b") == {"a"}


def test_child_of_alias_is_rejected(tree_s: TopicNamespace) -> None:
    ts = TopicSet([tree_s])
    with pytest.raises(TopicNotSupported, match="alias"):
        ts.validate(parse_topic_expression("tns:t4/t6/x", FULL, NS))
    assert not ts.permits(Topic(TNS, ("t4", "t6", "x")))


def test_concrete_alias_to_wildcard_that_selects_another_alias() -> None:
    """Intent reading applies inside alias resolution too: b -> d/* selects alias d/x -> a."""
    ts = TopicSet(
        [
            _space(
                '<w:Topic name="a"/><w:Topic name="d"><w:Topic name="e"/>'
                + _alias("x", C10, "tns:a")
                + "</w:Topic>"
                + _alias("b", F10, "tns:d/*")
            )
        ]
    )
    assert _resolve(ts, "tns:b") == {"d/e", "a"}
