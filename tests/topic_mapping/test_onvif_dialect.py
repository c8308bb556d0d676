"""ONVIF's ConcreteSet topic expression dialect: a union of concrete paths, with the trailing
``//.`` (a topic and everything below it) that ONVIF's examples use."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from wsnmom.topic_mapping import (
    CONCRETE,
    DEEP,
    FULL,
    ONVIF_CONCRETE_SET,
    RABBITMQ,
    SUPPORTED_DIALECTS,
    InvalidTopicExpression,
    NamespaceRoots,
    PathPattern,
    Topic,
    canonical_dialect,
    parse_topic_expression,
    require_concrete_topic,
    translate,
)
from wsnmom.topic_mapping.cli import topics

TNS1 = "http://www.onvif.org/ver10/topics"
NS = {"tns1": TNS1}


def test_uri_is_canonical_and_advertised() -> None:
    assert ONVIF_CONCRETE_SET == "http://www.onvif.org/ver10/tev/topicExpression/ConcreteSet"
    assert ONVIF_CONCRETE_SET in SUPPORTED_DIALECTS
    assert canonical_dialect(ONVIF_CONCRETE_SET) == ONVIF_CONCRETE_SET


def test_single_path_is_concrete() -> None:
    expr = parse_topic_expression(
        " tns1:RuleEngine/CellMotionDetector/Motion ", ONVIF_CONCRETE_SET, NS
    )
    assert expr.dialect == ONVIF_CONCRETE_SET
    assert expr.is_concrete
    assert require_concrete_topic(expr) == Topic(
        TNS1, ("RuleEngine", "CellMotionDetector", "Motion")
    )


@pytest.mark.parametrize("bar", ["|", " | ", "| "])
def test_union_of_paths(bar: str) -> None:
    text = f"tns1:RuleEngine/CellMotionDetector/Motion{bar}tns1:VideoSource/MotionAlarm"
    expr = parse_topic_expression(text, ONVIF_CONCRETE_SET, NS)
    assert expr.patterns == (
        PathPattern(TNS1, ("RuleEngine", "CellMotionDetector", "Motion")),
        PathPattern(TNS1, ("VideoSource", "MotionAlarm")),
    )
    assert not expr.is_concrete
    assert expr.matches(Topic(TNS1, ("VideoSource", "MotionAlarm")))
    assert not expr.matches(Topic(TNS1, ("VideoSource",)))
    assert not expr.matches(Topic(TNS1, ("RuleEngine", "CellMotionDetector")))


def test_union_across_namespaces() -> None:
    ns = {**NS, "tnsaxis": "http://www.axis.com/2009/event/topics"}
    expr = parse_topic_expression(
        "tns1:Device/Trigger/DigitalInput|tnsaxis:CameraApplicationPlatform/VMD",
        ONVIF_CONCRETE_SET,
        ns,
    )
    assert {p.namespace for p in expr.patterns} == {TNS1, ns["tnsaxis"]}


def test_trailing_subtree_step_selects_the_topic_and_its_descendants() -> None:
    expr = parse_topic_expression(
        "tns1:RuleEngine//.|tns1:VideoAnalytics//.", ONVIF_CONCRETE_SET, NS
    )
    assert expr.patterns[0] == PathPattern(TNS1, ("RuleEngine", DEEP))
    # the same selection as the Full dialect's reading of the text
    assert expr.patterns == parse_topic_expression(expr.text, FULL, NS).patterns
    assert expr.matches(Topic(TNS1, ("RuleEngine",)))
    assert expr.matches(Topic(TNS1, ("RuleEngine", "LineDetector", "Crossed")))
    assert not expr.matches(Topic(TNS1, ("Device", "Trigger")))


def test_translation_to_native_patterns() -> None:
    roots = NamespaceRoots.for_syntax({TNS1: "onvif"}, RABBITMQ)
    motion = parse_topic_expression(
        "tns1:RuleEngine/CellMotionDetector/Motion|tns1:VideoSource//.", ONVIF_CONCRETE_SET, NS
    )
    result = translate(motion, RABBITMQ, roots)
    assert result.exact
    assert sorted(p.pattern for p in result.patterns) == [
        "RuleEngine.CellMotionDetector.Motion",
        "VideoSource.#",
    ]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("tns1:RuleEngine/*", "wildcard '*' is not allowed in the ConcreteSet dialect"),
        ("tns1:*", "wildcard '*' is not allowed in the ConcreteSet dialect"),
        ("tns1://Motion", "descendant '//' is not allowed in the ConcreteSet dialect"),
        ("tns1:RuleEngine//Motion", "only as a final '//.'"),
        ("tns1:RuleEngine//./Motion", "only as a final '//.'"),
        ("tns1:RuleEngine/.", "self step '.' is not allowed in the ConcreteSet dialect"),
        ("tns1:RuleEngine|", "expected a topic name"),
        ("tns1:RuleEngine tns1:Device", "whitespace is only allowed around '|'"),
        ("tns9:RuleEngine", "namespace prefix 'tns9' is not declared"),
    ],
)
def test_invalid_expressions_say_why(text: str, fragment: str) -> None:
    with pytest.raises(InvalidTopicExpression) as info:
        parse_topic_expression(text, ONVIF_CONCRETE_SET, NS)
    assert fragment in str(info.value)
    assert "ConcreteSet" in str(info.value)


def test_concrete_dialect_still_refuses_unions() -> None:
    with pytest.raises(InvalidTopicExpression, match="union"):
        parse_topic_expression("tns1:a|tns1:b", CONCRETE, NS)


def test_cli_accepts_the_dialect_by_name() -> None:
    result = CliRunner().invoke(
        topics,
        [
            "translate",
            "tns1:RuleEngine/CellMotionDetector/Motion | tns1:Device//.",
            "--dialect",
            "concreteset",
            "--ns",
            f"tns1={TNS1}",
            "--to",
            "mqtt",
            "--root",
            f"{TNS1}=onvif",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "pattern: onvif/RuleEngine/CellMotionDetector/Motion" in result.output
    assert "exact: yes" in result.output
