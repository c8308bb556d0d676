"""``wsnmom topics translate`` and ``wsnmom topics check`` through click's CliRunner."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner
from wsnmom.topic_mapping.translate import derived_root

from wsnmom.cli import cli

from .conftest import TREE_S_XML


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["topics", *args])
    return result.exit_code, result.output


def test_translate_mqtt_inexact() -> None:
    code, out = run(
        "translate", "p:a//c", "--ns", "p=urn:x", "--to", "mqtt", "--root", "urn:x=org/wsn"
    )
    assert code == 0, out
    assert "pattern: org/wsn/a/+/#" in out
    assert "exact: no" in out
    assert "residual: topic in {urn:x}a//c" in out


def test_translate_rabbitmq_exact_with_exchange() -> None:
    code, out = run(
        "translate", "p:a//c", "--ns", "p=urn:x", "--to", "rabbitmq", "--root", "urn:x=amq.topic"
    )
    assert code == 0, out
    assert "pattern: a.#.c  [exchange: amq.topic]" in out
    assert "exact: yes" in out
    assert "residual: none" in out


def test_translate_kafka_union_with_derived_root() -> None:
    code, out = run(
        "translate", "p:a/* | q:b", "--ns", "p=urn:x", "--ns", "q=urn:y", "--to", "kafka"
    )
    assert code == 0, out
    assert f"^{derived_root('urn:x')}\\.a\\.[^.]*$" in out
    assert f"^{derived_root('urn:y')}\\.b$" in out


def test_translate_dialect_names_and_uris() -> None:
    code, out = run("translate", "p:a", "-d", "simple", "--ns", "p=urn:x", "--to", "rabbitmq")
    assert code == 0, out
    code, out = run(
        "translate",
        "p:a/b",
        "--dialect",
        "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Concrete",
        "--ns",
        "p=urn:x",
        "--to",
        "mqtt",
    )
    assert code == 0, out
    assert f"{derived_root('urn:x')}/a/b" in out


def test_translate_errors() -> None:
    code, out = run("translate", "p:a/", "--ns", "p=urn:x", "--to", "mqtt")
    assert code == 1 and "InvalidTopicExpression" in out
    code, out = run("translate", "p:a", "-d", "urn:nope", "--ns", "p=urn:x", "--to", "mqtt")
    assert code == 1 and "TopicExpressionDialectUnknown" in out
    code, out = run("translate", "p:a//b", "-d", "simple", "--ns", "p=urn:x", "--to", "mqtt")
    assert code == 1
    code, out = run("translate", "p:a", "--ns", "p", "--to", "mqtt")
    assert code == 2 and "PREFIX=URI" in out
    code, out = run("translate", "p:a", "--ns", "p=urn:x", "--to", "nats")
    assert code == 2
    code, out = run(
        "translate", "p:a", "--ns", "p=urn:x", "--to", "mqtt", "--root", "urn:x=a", "--root",
        "urn:y=a/b",
    )  # fmt: skip
    assert code == 2 and "overlap" in out


def test_check_valid_document(tmp_path: Path) -> None:
    doc = tmp_path / "ns.xml"
    doc.write_text(TREE_S_XML, encoding="utf-8")
    code, out = run("check", str(doc))
    assert code == 0, out
    assert "valid: http://example.org/topicSpace/example1 (6 topics)" in out


def test_check_invalid_document(tmp_path: Path) -> None:
    doc = tmp_path / "bad.xml"
    doc.write_text("<notATopicNamespace/>", encoding="utf-8")
    code, out = run("check", str(doc))
    assert code == 1
    assert "invalid" in out
    doc.write_text("not xml", encoding="utf-8")
    assert run("check", str(doc))[0] == 1
    assert run("check", str(tmp_path / "missing.xml"))[0] == 2
