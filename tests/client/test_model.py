"""``wsnmom.client.model``: topic expressions, termination times, payloads."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from lxml import etree
from wsnmom.core.model import ExpressionSource

from wsnmom.client import (
    CONCRETE,
    FULL,
    SIMPLE,
    Notification,
    TopicExpression,
    text_payload,
)
from wsnmom.client.model import payload_element, termination_text, tidy_xml


@pytest.mark.parametrize(
    ("text", "dialect"),
    [
        ("tns:a", SIMPLE),
        ("tns:a/b/c", CONCRETE),
        ("tns:a/*", FULL),
        ("tns:a//.", FULL),
        ("tns:a | tns:b", FULL),
    ],
)
def test_dialect_by_shape(text: str, dialect: str) -> None:
    assert TopicExpression(text, {"tns": "urn:x"}).effective_dialect == dialect


def test_explicit_dialect_wins() -> None:
    assert TopicExpression("tns:a", {}, FULL).effective_dialect == FULL


def test_clark_notation_gets_prefixes() -> None:
    expr = TopicExpression.parse("{urn:a}x/y | {urn:b}z | {urn:a}w")
    assert expr.text == "tns:x/y | ns1:z | tns:w"
    assert expr.namespaces == {"tns": "urn:a", "ns1": "urn:b"}
    assert str(expr) == "{urn:a}x/y | {urn:b}z | {urn:a}w"


def test_clark_notation_reuses_a_given_prefix_and_avoids_clashes() -> None:
    expr = TopicExpression.parse("{urn:b}z", {"tns": "urn:a", "b": "urn:b"})
    assert expr.text == "b:z" and expr.namespaces == {"b": "urn:b"}
    expr = TopicExpression.parse("{urn:c}z", {"tns": "urn:a"})
    assert expr.text == "ns1:z" and expr.namespaces == {"ns1": "urn:c"}


def test_prefixed_text_keeps_only_the_prefixes_it_uses() -> None:
    expr = TopicExpression.parse("p:a/b", {"p": "urn:p", "q": "urn:q", "pp": "urn:pp"})
    assert expr.namespaces == {"p": "urn:p"}


def test_parse_fills_missing_prefixes_of_an_expression() -> None:
    bare = TopicExpression("p:a", dialect=SIMPLE)
    filled = TopicExpression.parse(bare, {"p": "urn:p"})
    assert filled == TopicExpression("p:a", {"p": "urn:p"}, SIMPLE)
    assert TopicExpression.parse(filled, {"p": "urn:other"}) is filled


def test_from_source_drops_unused_in_scope_namespaces() -> None:
    source = ExpressionSource(
        CONCRETE, "t:a/b", {"t": "urn:t", "wsnt": "urn:wsnt", None: "urn:default"}
    )
    assert TopicExpression.from_source(source) == TopicExpression("t:a/b", {"t": "urn:t"}, CONCRETE)


def test_termination_text() -> None:
    assert termination_text(timedelta(minutes=5)) == "PT5M"
    assert termination_text(datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)) == "2030-01-02T03:04:05Z"
    assert termination_text(" PT1H ") == "PT1H"


def test_payload_element() -> None:
    el = etree.fromstring("<a/>")
    assert payload_element(el) is el
    assert payload_element("<b x='1'/>").get("x") == "1"
    assert payload_element(b"<c/>").tag == "c"
    for bad in ("plain text", "<a/><b/>", "", '<!DOCTYPE a [<!ENTITY x "y">]><a>&x;</a>'):
        with pytest.raises(ValueError, match="text_payload"):
            payload_element(bad)


def test_text_payload_round_trip() -> None:
    text = Notification(text_payload("hello"))
    assert text.is_native and text.content_type == "text/plain" and text.data == b"hello"
    binary = Notification(text_payload(b"\x00\x01\xfe", "application/octet-stream"))
    assert binary.payload.get("encoding") == "base64"
    assert binary.data == b"\x00\x01\xfe"
    xml = Notification(etree.fromstring("<x>1</x>"))
    assert not xml.is_native and xml.content_type == "application/xml"
    assert xml.data == b"<x>1</x>"


def test_tidy_xml_keeps_what_is_used() -> None:
    doc = etree.fromstring(
        '<env xmlns:unused="urn:u" xmlns:q="urn:q" xmlns:a="urn:a" xmlns:v="urn:v">'
        '<a:p type="q:Thing"><v:x/></a:p></env>'
    )
    out = tidy_xml(doc[0])
    assert b"urn:u" not in out
    for uri in (b"urn:q", b"urn:a", b"urn:v"):
        assert uri in out
    assert etree.fromstring(out).get("type") == "q:Thing"


def test_tidy_xml_keeps_an_undeclared_default_namespace() -> None:
    """What the shell prints of ``<x xmlns="urn:n"><a xmlns=""/></x>`` reads back with
    ``a`` in no namespace (``cleanup_namespaces`` alone dropped the ``xmlns=""``)."""
    doc = etree.fromstring('<env xmlns:unused="urn:u"><x xmlns="urn:n"><a xmlns=""/></x></env>')
    out = tidy_xml(doc[0])
    assert b"urn:u" not in out
    assert [e.tag for e in etree.fromstring(out).iter()] == ["{urn:n}x", "a"]
