"""Translation tables (WS-Topics onto the middleware's names: docs/topic-mapping.md) and
name/root mapping examples."""

from __future__ import annotations

import re

import pytest
from wsnmom.topic_mapping import (
    ANY,
    CONCRETE,
    DEEP,
    FULL,
    SIMPLE,
    NameNotRepresentable,
    PathPattern,
    Topic,
    parse_topic_expression,
)
from wsnmom.topic_mapping.syntax import KAFKA, MQTT, RABBITMQ, WildcardSyntax
from wsnmom.topic_mapping.translate import (
    FALLBACK_NAMESPACE,
    NamespaceRoots,
    NativeName,
    derived_root,
    fallback_namespace,
    fallback_root,
    native_to_topic,
    topic_to_native,
    translate,
)

P = "urn:example:p"
Q = "urn:example:q"
NS = {"p": P, "q": Q}
QROOT = derived_root(Q)
L = "[^.]*"  # one Kafka level


def roots(syntax: WildcardSyntax) -> NamespaceRoots:
    return NamespaceRoots.for_syntax({P: "N"}, syntax)


# (dialect, expression, RabbitMQ binding keys, MQTT filters, MQTT exact, Kafka regexes)
TABLE = [
    # Simple root
    (SIMPLE, "p:a", ["a"], ["N/a"], True, [r"^N\.a$"]),
    # Concrete
    (CONCRETE, "p:a/b/c", ["a.b.c"], ["N/a/b/c"], True, [r"^N\.a\.b\.c$"]),
    # Full /*
    (FULL, "p:a/*", ["a.*"], ["N/a/+"], True, [rf"^N\.a\.{L}$"]),
    # Full root *
    (FULL, "p:*", ["*"], ["N/+"], True, [rf"^N\.{L}$"]),
    # Full * mid-path
    (FULL, "p:a/*/c", ["a.*.c"], ["N/a/+/c"], True, [rf"^N\.a\.{L}\.c$"]),
    # trailing //.
    (FULL, "p:a//.", ["a.#"], ["N/a/#"], True, [rf"^N\.a(\.{L})*$"]),
    # trailing //*
    (FULL, "p:a//*", ["a.*.#"], ["N/a/+/#"], True, [rf"^N\.a\.{L}(\.{L})*$"]),
    # whole space
    (FULL, "p://*", ["*.#"], ["N/+/#"], True, [rf"^N\.{L}(\.{L})*$"]),
    (FULL, "p:*//.", ["*.#"], ["N/+/#"], True, [rf"^N\.{L}(\.{L})*$"]),
    # mid-path //: MQTT cut at the // (tighter than N/a/#: a itself is excluded)
    (FULL, "p:a//c", ["a.#.c"], ["N/a/+/#"], False, [rf"^N\.a(\.{L})*\.c$"]),
    # root //
    (FULL, "p://c", ["#.c"], ["N/+/#"], False, [rf"^N(\.{L})*\.c$"]),
    # // then *
    (FULL, "p:a//*/c", ["a.*.#.c"], ["N/a/+/+/#"], False, [rf"^N\.a\.{L}(\.{L})*\.c$"]),
    # several //
    (
        FULL,
        "p:a//b//c",
        ["a.#.b.#.c"],
        ["N/a/+/+/#"],
        False,
        [rf"^N\.a(\.{L})*\.b(\.{L})*\.c$"],
    ),
    # . self steps normalise
    (FULL, "p:a/./b", ["a.b"], ["N/a/b"], True, [r"^N\.a\.b$"]),
    (FULL, "p:a//./b", ["a.#.b"], ["N/a/+/#"], False, [rf"^N\.a(\.{L})*\.b$"]),
    (FULL, "p:a/.", ["a"], ["N/a"], True, [r"^N\.a$"]),
    # union across namespaces: one pattern per branch
    (
        FULL,
        "p:a/b | q:c",
        ["a.b", "c"],
        ["N/a/b", f"{QROOT}/c"],
        True,
        [r"^N\.a\.b$", rf"^{QROOT}\.c$"],
    ),
    # union where one branch covers the other: one pattern
    (FULL, "p:a//. | p:a/b/*", ["a.#"], ["N/a/#"], True, [rf"^N\.a(\.{L})*$"]),
    # an exact branch covering an inexact one makes the whole translation exact
    (FULL, "p:a//c | p:a//*", ["a.*.#"], ["N/a/+/#"], True, [rf"^N\.a\.{L}(\.{L})*$"]),
]


def _ids(row: tuple[object, ...]) -> str:
    return str(row[1])


@pytest.mark.parametrize("row", TABLE, ids=_ids)
def test_rabbitmq_table(row: tuple[str, str, list[str], list[str], bool, list[str]]) -> None:
    dialect, text, keys, _, _, _ = row
    result = translate(parse_topic_expression(text, dialect, NS), RABBITMQ, roots(RABBITMQ))
    assert [p.pattern for p in result.patterns] == keys
    assert [p.root for p in result.patterns] == ["N" if k in keys[:1] else QROOT for k in keys]
    assert result.exact and result.residual is None


@pytest.mark.parametrize("row", TABLE, ids=_ids)
def test_mqtt_table(row: tuple[str, str, list[str], list[str], bool, list[str]]) -> None:
    dialect, text, _, filters, exact, _ = row
    expr = parse_topic_expression(text, dialect, NS)
    result = translate(expr, MQTT, roots(MQTT))
    assert [p.pattern for p in result.patterns] == filters
    assert result.exact is exact
    assert (result.residual is None) is exact
    if result.residual is not None:
        assert result.residual.branches == expr.patterns


@pytest.mark.parametrize("row", TABLE, ids=_ids)
def test_kafka_table(row: tuple[str, str, list[str], list[str], bool, list[str]]) -> None:
    dialect, text, _, _, _, regexes = row
    result = translate(parse_topic_expression(text, dialect, NS), KAFKA, roots(KAFKA))
    assert [p.pattern for p in result.patterns] == regexes
    assert result.exact and result.residual is None
    for p in result.patterns:
        re.compile(p.pattern)


def test_mqtt_residual_filters_the_superset() -> None:
    expr = parse_topic_expression("p:a//c", FULL, NS)
    result = translate(expr, MQTT, roots(MQTT))
    assert result.residual is not None
    assert result.accepts(Topic(P, ("a", "x", "c")))
    assert result.accepts(Topic(P, ("a", "c")))
    assert not result.accepts(Topic(P, ("a", "x")))
    assert not result.accepts(Topic(Q, ("a", "c")))
    assert "a//c" in result.residual.describe()


def test_translate_accepts_path_patterns() -> None:
    branches = [PathPattern(P, ("a", ANY)), PathPattern(P, (DEEP, "z"))]
    result = translate(branches, RABBITMQ, roots(RABBITMQ))
    assert [p.pattern for p in result.patterns] == ["a.*", "#.z"]


def test_escaped_literals_in_patterns() -> None:
    expr = parse_topic_expression("p:stock.IBM/*", FULL, NS)
    assert translate(expr, RABBITMQ, roots(RABBITMQ)).patterns[0].pattern == "stock_x002E_IBM.*"
    assert translate(expr, MQTT, roots(MQTT)).patterns[0].pattern == "N/stock.IBM/+"
    kafka = translate(expr, KAFKA, roots(KAFKA)).patterns[0].pattern
    assert re.fullmatch(kafka, "N.stock_x002E_IBM.x")
    assert not re.fullmatch(kafka, "N.stock.IBM.x")


NATS = WildcardSyntax(
    name="nats",
    separator=".",
    single_level="*",
    multi_level=">",
    multi_level_mid_path=False,
    multi_level_matches_parent=False,
    allowed_char=lambda ch: ch not in " \t\r\n\x00",
    max_length=None,
)


@pytest.mark.parametrize(
    ("text", "patterns", "exact"),
    [
        ("p:a//*", ["N.a.>"], True),
        ("p:a//.", ["N.a", "N.a.>"], True),
        ("p:a//*/*", ["N.a.*.>"], True),
        ("p:a//c", ["N.a.>"], False),
    ],
)
def test_third_party_one_or_more_wildcard(text: str, patterns: list[str], exact: bool) -> None:
    result = translate(parse_topic_expression(text, FULL, NS), NATS, roots(NATS))
    assert [p.pattern for p in result.patterns] == patterns
    assert result.exact is exact


# --- names ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("syntax", "topic", "native"),
    [
        (RABBITMQ, Topic(P, ("a", "b")), NativeName("N", "a.b")),
        (MQTT, Topic(P, ("a", "b")), NativeName("N", "N/a/b")),
        (KAFKA, Topic(P, ("a", "b")), NativeName("N", "N.a.b")),
        (MQTT, Topic(P, ("a", "_x_", "b")), NativeName("N", "N/a//b")),
        (KAFKA, Topic(P, ("温度",)), NativeName("N", "N._x6E29__x5EA6_")),
        (RABBITMQ, Topic(Q, ("c",)), NativeName(QROOT, "c")),
        (MQTT, Topic(FALLBACK_NAMESPACE, ("x", "y")), NativeName("", "x/y")),
        (RABBITMQ, Topic(fallback_namespace("amq.topic"), ("x",)), NativeName("amq.topic", "x")),
    ],
    # the syntax by name: its repr holds function addresses and a frozenset, which differ
    # between processes (pytest-xdist workers must collect the same ids)
    ids=lambda v: v.name if isinstance(v, WildcardSyntax) else repr(v),
)
def test_topic_native_round_trip(syntax: WildcardSyntax, topic: Topic, native: NativeName) -> None:
    r = roots(syntax)
    assert topic_to_native(topic, syntax, r) == native
    assert native_to_topic(native.root, native.name, syntax, r) == topic
    if syntax.root_in_name:
        assert native_to_topic(None, native.name, syntax, r) == topic


def test_multi_level_roots() -> None:
    r = NamespaceRoots.for_syntax({P: "org/wsn/p"}, MQTT)
    assert r.root_for(P) == ("org", "wsn", "p")
    native = topic_to_native(Topic(P, ("a",)), MQTT, r)
    assert native == NativeName("org/wsn/p", "org/wsn/p/a")
    assert native_to_topic(None, "org/wsn/p/a", MQTT, r) == Topic(P, ("a",))
    # the bare root is no topic of P: it is read under the fallback namespace
    assert native_to_topic(None, "org/wsn/p", MQTT, r) == Topic(
        FALLBACK_NAMESPACE, ("org", "wsn", "p")
    )
    with pytest.raises(NameNotRepresentable):
        native_to_topic("org", "org/wsn/p/a", MQTT, r)


def test_rabbitmq_exchange_is_not_split() -> None:
    r = NamespaceRoots.for_syntax({P: "amq.topic"}, RABBITMQ)
    assert topic_to_native(Topic(P, ("a",)), RABBITMQ, r) == NativeName("amq.topic", "a")
    assert native_to_topic("amq.topic", "a.b", RABBITMQ, r) == Topic(P, ("a", "b"))
    assert native_to_topic("other", "a.b", RABBITMQ, r) == Topic(
        "urn:wsnmom:native:other", ("a", "b")
    )


def test_derived_roots() -> None:
    root = derived_root("http://example.org/ns")
    assert root == derived_root("http://example.org/ns")
    assert re.fullmatch(r"n[a-z2-7]{16}", root)
    assert derived_root("http://Example.org/ns") != root  # no URI normalisation
    r = NamespaceRoots()
    # unknown until used, then mapped back
    assert native_to_topic(None, f"{root}/a", MQTT, r).namespace == FALLBACK_NAMESPACE
    r.register("http://example.org/ns")
    assert native_to_topic(None, f"{root}/a", MQTT, r) == Topic("http://example.org/ns", ("a",))


def test_fallback_namespace_forms() -> None:
    assert fallback_namespace("") == FALLBACK_NAMESPACE
    assert fallback_namespace("a b/c") == "urn:wsnmom:native:a%20b%2Fc"
    assert fallback_root("urn:wsnmom:native:a%20b%2Fc") == "a b/c"
    assert fallback_root("urn:wsnmom:native:%61") is None  # not canonical
    assert fallback_root("urn:other") is None


def test_roots_configuration_errors() -> None:
    with pytest.raises(ValueError):
        NamespaceRoots.for_syntax({P: "a/b", Q: "a"}, MQTT)
    with pytest.raises(ValueError):
        NamespaceRoots({FALLBACK_NAMESPACE: "x"})
    with pytest.raises(ValueError):
        NamespaceRoots({"urn:wsnmom:native:x": "x"})
    with pytest.raises(ValueError):
        NamespaceRoots.for_syntax({P: "a//b"}, MQTT)


def test_unrepresentable_names() -> None:
    r = roots(MQTT)
    # MQTT root levels must be plain and not start with '$'
    with pytest.raises(NameNotRepresentable):
        topic_to_native(Topic(FALLBACK_NAMESPACE, ("_x0024_SYS", "x")), MQTT, r)
    with pytest.raises(NameNotRepresentable):
        topic_to_native(
            Topic("urn:z", ("a",)), MQTT, NamespaceRoots.for_syntax({"urn:z": "a+b"}, MQTT)
        )
    # a fallback topic that would be read back under a configured root
    with pytest.raises(NameNotRepresentable):
        topic_to_native(Topic(FALLBACK_NAMESPACE, ("N", "a")), MQTT, r)
    # a non-empty fallback root only exists for RabbitMQ exchanges
    with pytest.raises(NameNotRepresentable):
        topic_to_native(Topic(fallback_namespace("x"), ("a",)), MQTT, r)
    with pytest.raises(NameNotRepresentable):
        topic_to_native(Topic(fallback_namespace("N"), ("a",)), RABBITMQ, roots(RABBITMQ))
    # empty names
    with pytest.raises(NameNotRepresentable):
        topic_to_native(Topic(P, ("_x_",)), RABBITMQ, roots(RABBITMQ))
    with pytest.raises(NameNotRepresentable):
        native_to_topic("N", "", RABBITMQ, roots(RABBITMQ))
    # Kafka reserved names
    with pytest.raises(NameNotRepresentable):
        topic_to_native(Topic(FALLBACK_NAMESPACE, ("_x_", "_x_")), KAFKA, roots(KAFKA))


def test_length_limits() -> None:
    # RabbitMQ counts UTF-8 bytes of the routing key only: 85 CJK characters = 255 bytes
    ok = Topic(P, ("温" * 85,))
    assert topic_to_native(ok, RABBITMQ, roots(RABBITMQ)).name == "温" * 85
    with pytest.raises(NameNotRepresentable):
        topic_to_native(Topic(P, ("温" * 86,)), RABBITMQ, roots(RABBITMQ))
    # Kafka counts characters of the full name, after escaping (7 per CJK character)
    assert len(topic_to_native(Topic(P, ("a" * 247,)), KAFKA, roots(KAFKA)).name) == 249
    with pytest.raises(NameNotRepresentable):
        topic_to_native(Topic(P, ("a" * 248,)), KAFKA, roots(KAFKA))
    with pytest.raises(NameNotRepresentable):
        topic_to_native(Topic(P, ("温" * 40,)), KAFKA, roots(KAFKA))
    with pytest.raises(NameNotRepresentable):
        topic_to_native(Topic(P, ("a" * 65535,)), MQTT, roots(MQTT))
    # binding keys are limited like routing keys
    with pytest.raises(NameNotRepresentable):
        translate([PathPattern(P, ("a" * 254, ANY))], RABBITMQ, roots(RABBITMQ))


def test_fallback_branches_need_the_residual_on_root_in_name_syntaxes() -> None:
    expr = [PathPattern(FALLBACK_NAMESPACE, (ANY, "b"))]
    mqtt = translate(expr, MQTT, roots(MQTT))
    assert [p.pattern for p in mqtt.patterns] == ["+/b"]
    assert not mqtt.exact  # '+/b' also matches N/b, a topic of P
    assert mqtt.residual is not None and not mqtt.residual(Topic(P, ("b",)))
    rabbit = translate(
        [PathPattern(fallback_namespace("amq.topic"), (ANY, "b"))], RABBITMQ, roots(RABBITMQ)
    )
    assert rabbit.exact and rabbit.patterns[0].root == "amq.topic"
