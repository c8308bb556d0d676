"""The Kafka adapter's settings and topic mapping (pure: no broker)."""

from __future__ import annotations

import pytest
from wsnmom.adapters.kafka.config import parse_settings, redact_config, redact_url
from wsnmom.adapters.kafka.mapping import KafkaMapping
from wsnmom.core.adapter import HEADER_TOPIC_NAMESPACE, HEADER_TOPIC_PATH
from wsnmom.topic_mapping.errors import NameNotRepresentable
from wsnmom.topic_mapping.model import ANY, DEEP, PathPattern, Topic
from wsnmom.topic_mapping.translate import FALLBACK_NAMESPACE, derived_root

NS = "http://example.org/orders"
INBOX = "urn:wsnmom:internal:pull-point"


def mapping(**options: object) -> KafkaMapping:
    return KafkaMapping(parse_settings("kafka://127.0.0.1:9092", options))


def test_url_query_user_part_and_options() -> None:
    s = parse_settings(
        "kafka://alice:s%3Acret@h1:9092,h2:9092?topic_prefix=wsn&partitions=3"
        "&security.protocol=SASL_SSL&ssl.ca.location=/ca.pem",
        {"partitions": 4, "config": {"sasl.mechanism": "SCRAM-SHA-512"}},
    )
    assert s.bootstrap == "h1:9092,h2:9092"
    assert s.topic_prefix == "wsn" and s.partitions == 4
    assert s.client_config == {
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": "/ca.pem",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "alice",
        "sasl.password": "s:cret",
    }
    # passed through to every client
    for config in (s.producer(), s.consumer("g"), s.admin()):
        assert config["security.protocol"] == "SASL_SSL"
        assert config["sasl.password"] == "s:cret"
    assert s.producer()["enable.idempotence"] is True and s.producer()["acks"] == "all"
    assert s.consumer("g")["enable.auto.commit"] is False


def test_secrets_are_redacted() -> None:
    s = parse_settings(
        "kafka://alice:topsecret@h:9092",
        {"config": {"ssl.key.password": "k3y", "sasl.oauthbearer.config": "tok"}},
    )
    text = repr(s.redacted()) + redact_url("kafka://alice:topsecret@h:9092")
    assert "topsecret" not in text and "k3y" not in text and "tok'" not in text
    assert "alice" in text
    assert redact_config({"ssl.keystore.password": "x", "client.id": "c"}) == {
        "ssl.keystore.password": "***",
        "client.id": "c",
    }


@pytest.mark.parametrize(
    "url, options",
    [
        ("amqp://h:1", {}),
        ("kafka://", {}),
        ("kafka://h:1/path", {}),
        ("kafka://h:1", {"mode": "topic"}),
        ("kafka://h:1", {"no_such_option": 1}),
        ("kafka://h:1", {"topic_prefix": "bad name"}),
        ("kafka://h:1", {"namespaces": {NS: {"mode": "path", "topic": "x"}}}),
        ("kafka://h:1", {"topic_prefix": "wsn", "internal_topic": "wsn.inbox"}),
    ],
)
def test_bad_settings_are_refused(url: str, options: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        parse_settings(url, options)


def test_topic_per_path_names_and_back() -> None:
    m = mapping(topic_prefix="wsn", namespaces={NS: "orders"})
    dest = m.destination(Topic(NS, ("eu", "stock.IBM")))
    assert dest.log == "wsn.orders.eu.stock_x002E_IBM" and dest.per_path
    assert dest.key == b"eu/stock.IBM"
    assert m.record_topic(dest.log, None, {}) == Topic(NS, ("eu", "stock.IBM"))
    other = "urn:other"
    assert m.destination(Topic(other, ("a",))).log == f"wsn.{derived_root(other)}.a"
    # a native topic under the prefix but under no root: the fallback namespace
    assert m.record_topic("wsn.legacy.x", None, {}) == Topic(FALLBACK_NAMESPACE, ("legacy", "x"))
    assert m.follows("wsn.anything") and not m.follows("other.topic")
    assert not m.follows("wsnx.a")


def test_unknown_derived_root_is_settled_by_the_records_headers() -> None:
    writer, reader = mapping(), mapping()
    topic = Topic("urn:seen:elsewhere", ("a", "b"))
    log = writer.destination(topic).log
    headers = {HEADER_TOPIC_NAMESPACE: topic.namespace, HEADER_TOPIC_PATH: "a/b"}
    assert reader.record_topic(log, None, headers) == topic
    # headers that do not map to this log are not believed
    lying = {HEADER_TOPIC_NAMESPACE: "urn:liar", HEADER_TOPIC_PATH: "a/b"}
    assert mapping().record_topic(log, None, lying).namespace == FALLBACK_NAMESPACE


def test_no_prefix_follows_everything_but_underscored_topics() -> None:
    m = mapping()
    assert m.follows("orders") and m.follows("wsnmom-internal")
    assert not m.follows("__consumer_offsets") and not m.follows("_schemas")
    assert m.record_topic("orders.created", None, {}) == Topic(
        FALLBACK_NAMESPACE, ("orders", "created")
    )


def test_topic_per_namespace_key_then_header_then_default() -> None:
    m = mapping(namespaces={NS: {"mode": "namespace", "topic": "orders-all"}})
    dest = m.destination(Topic(NS, ("eu", "new")))
    assert (dest.log, dest.key, dest.per_path) == ("orders-all", b"eu/new", False)
    assert m.record_topic("orders-all", b"eu/new", {}) == Topic(NS, ("eu", "new"))
    assert m.record_topic("orders-all", b"42", {HEADER_TOPIC_PATH: "x/y"}) == Topic(NS, ("x", "y"))
    assert m.record_topic("orders-all", None, {}) == Topic(NS, ("native",))
    assert m.may_carry("orders-all", None)
    assert m.may_carry("orders-all", (PathPattern(NS, ("eu", ANY)),))
    assert not m.may_carry("orders-all", (PathPattern("urn:x", ("eu",)),))


def test_internal_topic_keyed_by_inbox_and_never_everything() -> None:
    m = mapping(internal_topic="inbox")
    inbox = Topic(INBOX, ("p12",))
    dest = m.destination(inbox)
    assert (dest.log, dest.key) == ("inbox", b"{urn:wsnmom:internal:pull-point}p12")
    assert m.record_topic("inbox", dest.key, {}) == inbox
    assert not m.may_carry("inbox", None)
    assert m.may_carry("inbox", (PathPattern(INBOX, ("p12",)),))


def test_may_carry_per_path_is_exact() -> None:
    m = mapping(topic_prefix="wsn", namespaces={NS: "orders"})
    log = m.destination(Topic(NS, ("eu", "x"))).log
    assert m.may_carry(log, (PathPattern(NS, ("eu", ANY)),))
    assert m.may_carry(log, (PathPattern(NS, (DEEP, "x")),))
    assert not m.may_carry(log, (PathPattern(NS, ("us", ANY)),))
    assert m.may_carry(log, None)
    assert not m.may_carry("unrelated", None)


def test_too_long_a_name_is_not_representable() -> None:
    with pytest.raises(NameNotRepresentable):
        mapping(topic_prefix="p").destination(Topic(NS, ("a" * 250,)))
