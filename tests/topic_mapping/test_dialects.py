"""Dialect URIs, the path grammars, prefix/default-namespace resolution and element parsing."""

from __future__ import annotations

import pytest
from lxml import etree
from wsnmom.topic_mapping import (
    ANY,
    CONCRETE,
    DEEP,
    DIALECT_ALIASES,
    FULL,
    SIMPLE,
    SUPPORTED_DIALECTS,
    XPATH,
    InvalidTopicExpression,
    MultipleTopicsSpecified,
    PathPattern,
    Segment,
    Topic,
    TopicExpressionDialectUnknown,
    canonical_dialect,
    is_ncname,
    parse_topic_expression,
    parse_topic_expression_element,
    require_concrete_topic,
)

URI = "http://example.org/ns"
OTHER = "http://example.org/other"

T10 = "http://www.ibm.com/xmlns/stdwip/web-services/WS-Topics/TopicExpression/"
D0406 = "http://docs.oasis-open.org/wsn/2004/06/TopicExpression/"


def test_canonical_uris() -> None:
    assert SIMPLE == "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Simple"
    assert CONCRETE == "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Concrete"
    assert FULL == "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Full"
    assert XPATH == "http://www.w3.org/TR/1999/REC-xpath-19991116"


@pytest.mark.parametrize(
    ("uri", "canonical"),
    [
        (T10 + "simple", SIMPLE),
        (T10 + "concreteTopicPath", CONCRETE),
        (T10 + "FullTopicPath", FULL),
        (D0406 + "Simple", SIMPLE),
        (D0406 + "Concrete", CONCRETE),
        (D0406 + "Full", FULL),
    ],
)
def test_old_dialect_uris_are_aliases(uri: str, canonical: str) -> None:
    assert DIALECT_ALIASES[uri] == canonical
    assert uri in SUPPORTED_DIALECTS
    assert canonical_dialect(uri) == canonical
    expr = parse_topic_expression("p:a", uri, {"p": URI})
    assert expr.dialect == canonical


def test_supported_dialects_lists_everything_once() -> None:
    assert len(set(SUPPORTED_DIALECTS)) == len(SUPPORTED_DIALECTS) == 11
    assert {SIMPLE, CONCRETE, FULL, XPATH} <= set(SUPPORTED_DIALECTS)


@pytest.mark.parametrize(
    "uri",
    [
        T10 + "Simple",
        T10 + "fullTopicPath",
        T10 + "ConcreteTopicPath",
        D0406 + "simple",
        "http://docs.oasis-open.org/wsn/t-1/TopicExpression/simple",
        "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Full/",
        "http://not.accepted/dialect.html",
        "",
    ],
)
def test_wrong_case_and_unknown_dialects_rejected(uri: str) -> None:
    with pytest.raises(TopicExpressionDialectUnknown):
        parse_topic_expression("p:a", uri, {"p": URI})


# -- missing dialect --------------------------------------------------------------------------


def test_missing_dialect_single_qname_is_simple() -> None:
    expr = parse_topic_expression("  p:a  ", None, {"p": URI})
    assert expr.dialect == SIMPLE
    assert expr.text == "p:a"
    assert expr.patterns == (PathPattern(URI, ("a",)),)


@pytest.mark.parametrize("text", ["p:a/b", "p:*", "p:a | p:b", "p://a"])
def test_missing_dialect_otherwise_full(text: str) -> None:
    assert parse_topic_expression(text, None, {"p": URI}).dialect == FULL


# -- patterns ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "segments"),
    [
        ("p:a", ("a",)),
        ("p:a/b/c", ("a", "b", "c")),
        ("p:a/*", ("a", ANY)),
        ("p:*", (ANY,)),
        ("p://b", (DEEP, "b")),
        ("p://*", (DEEP, ANY)),
        ("p:a//b", ("a", DEEP, "b")),
        ("p:a//.", ("a", DEEP)),
        ("p:a//*", ("a", DEEP, ANY)),
        ("p:a/.", ("a",)),
        ("p:a/./b", ("a", "b")),
        ("p:a//./b", ("a", DEEP, "b")),
        ("p:a//.//b", ("a", DEEP, "b")),
        ("p:*/b", (ANY, "b")),
        ("p:a/p:b", ("a", "b")),
        ("p:a/q:b", ("a", "b")),
    ],
)
def test_full_patterns(text: str, segments: tuple[Segment, ...]) -> None:
    expr = parse_topic_expression(text, FULL, {"p": URI, "q": URI})
    assert expr.patterns == (PathPattern(URI, segments),)


def test_union_spans_namespaces_and_tolerates_spaces_around_bar() -> None:
    ns = {"p": URI, "q": OTHER}
    for text in ["p:a|q:b", "p:a | q:b", "p:a\t|\nq:b"]:
        expr = parse_topic_expression(text, FULL, ns)
        assert expr.patterns == (PathPattern(URI, ("a",)), PathPattern(OTHER, ("b",)))
    assert parse_topic_expression("p:a | p:a", FULL, ns).patterns == (PathPattern(URI, ("a",)),)


def test_different_prefixes_for_the_same_namespace_meet() -> None:
    sub = parse_topic_expression("x:a/b", CONCRETE, {"x": URI})
    pub = require_concrete_topic(parse_topic_expression("y:a/b", CONCRETE, {"y": URI}))
    dflt = require_concrete_topic(parse_topic_expression("a/b", CONCRETE, {None: URI}))
    assert pub == dflt == Topic(URI, ("a", "b"))
    assert sub.matches(pub)
    assert sub.patterns == parse_topic_expression("z:a/b", FULL, {"z": URI}).patterns


def test_default_namespace_for_unprefixed_roots() -> None:
    expr = parse_topic_expression("a/b | //c | *", FULL, {None: URI})
    assert expr.patterns == (
        PathPattern(URI, ("a", "b")),
        PathPattern(URI, (DEEP, "c")),
        PathPattern(URI, (ANY,)),
    )
    # the empty-string key is accepted for the default namespace too
    assert parse_topic_expression("a", SIMPLE, {"": URI}).patterns == (PathPattern(URI, ("a",)),)


@pytest.mark.parametrize("ns", [{}, {"p": URI}, {None: ""}])
def test_unprefixed_root_without_default_namespace_is_invalid(ns: dict[str | None, str]) -> None:
    with pytest.raises(InvalidTopicExpression, match="default namespace"):
        parse_topic_expression("a/b", CONCRETE, ns)


def test_prefixed_child_in_other_namespace_is_invalid() -> None:
    with pytest.raises(InvalidTopicExpression, match="position 4"):
        parse_topic_expression("p:a/q:b", CONCRETE, {"p": URI, "q": OTHER})


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("p:a/b c", "position 5"),
        ("p:a/", "end of expression"),
        ("p:a[1]", "'['"),
        ("p:a/..", "'..'"),
        ("p:a/1b", "position 4"),
        ("p:a//", "end of expression"),
        ("p:a|", "end of expression"),
        ("q:a", "'q'"),
    ],
)
def test_error_messages_say_where(text: str, fragment: str) -> None:
    with pytest.raises(InvalidTopicExpression) as info:
        parse_topic_expression(text, FULL, {"p": URI})
    assert fragment in str(info.value)
    assert repr(text) in str(info.value)


def test_ncname_uses_xml_character_ranges() -> None:
    for good in ["Prüfung", "温度", "a·b", "stock.IBM", "_x", "a-b", "é1", "a\u0301"]:
        assert is_ncname(good), good
        expr = parse_topic_expression(f"p:{good}/{good}", CONCRETE, {"p": URI})
        assert expr.patterns[0].segments == (good, good)
    for bad in ["1a", "-a", ".a", "a:b", "a b", "", "·a", "a$", "\u0301a"]:
        assert not is_ncname(bad), bad
    with pytest.raises(InvalidTopicExpression):
        parse_topic_expression("p:a$b", FULL, {"p": URI})


def test_simple_and_concrete_are_subsets_of_full() -> None:
    ns = {"p": URI}
    for text in ["p:a", "p:a/b/c"]:
        c = parse_topic_expression(text, CONCRETE, ns)
        assert c.patterns == parse_topic_expression(text, FULL, ns).patterns
    assert (
        parse_topic_expression("p:a", SIMPLE, ns).patterns
        == parse_topic_expression("p:a", CONCRETE, ns).patterns
    )


def test_simple_does_not_match_children() -> None:
    expr = parse_topic_expression("p:a", SIMPLE, {"p": URI})
    assert expr.matches(Topic(URI, ("a",)))
    assert not expr.matches(Topic(URI, ("a", "b")))
    assert not expr.matches(Topic(OTHER, ("a",)))


def test_prefixes_are_not_kept() -> None:
    expr = parse_topic_expression("zzq:a/*", FULL, {"zzq": URI})
    assert expr.namespaces == ()
    assert "zzq" not in str(expr.patterns[0])


# -- element parsing --------------------------------------------------------------------------

WSNT = "http://docs.oasis-open.org/wsn/b-2"


def test_element_with_dialect_attribute_and_in_scope_namespaces() -> None:
    el = etree.fromstring(
        f'<root xmlns:p="{URI}"><wsnt:TopicExpression xmlns:wsnt="{WSNT}" Dialect="{FULL}">'
        "\n   p:a/*  \n</wsnt:TopicExpression></root>"
    )[0]
    expr = parse_topic_expression_element(el)
    assert expr.dialect == FULL
    assert expr.patterns == (PathPattern(URI, ("a", ANY)),)


def test_element_with_lowercase_dialect_and_default_namespace() -> None:
    el = etree.fromstring(
        f'<wsnt:Topic xmlns:wsnt="{WSNT}" xmlns="{URI}" dialect="{T10}simple">a</wsnt:Topic>'
    )
    expr = parse_topic_expression_element(el)
    assert expr.dialect == SIMPLE
    assert require_concrete_topic(expr) == Topic(URI, ("a",))


def test_element_without_dialect() -> None:
    el = etree.fromstring(f'<t xmlns:p="{URI}">p:a//b</t>')
    assert parse_topic_expression_element(el).dialect == FULL


def test_element_unknown_dialect() -> None:
    el = etree.fromstring(f'<t xmlns:p="{URI}" Dialect="http://not.accepted/dialect.html">p:a</t>')
    with pytest.raises(TopicExpressionDialectUnknown):
        parse_topic_expression_element(el)


# -- concrete topics --------------------------------------------------------------------------


def test_require_concrete_topic() -> None:
    ns = {"p": URI}
    assert require_concrete_topic(parse_topic_expression("p:a/b", FULL, ns)) == Topic(
        URI, ("a", "b")
    )
    assert require_concrete_topic(parse_topic_expression("p:a/./b", FULL, ns)) == Topic(
        URI, ("a", "b")
    )
    for text in ["p:a/*", "p:a | p:b", "p://a", "p:a//."]:
        with pytest.raises(MultipleTopicsSpecified):
            require_concrete_topic(parse_topic_expression(text, FULL, ns))
