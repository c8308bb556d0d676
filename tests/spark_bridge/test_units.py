"""Pieces of the bridge that need neither Spark's JVM nor a broker: topic selection, offsets
and read limits, the native-connector topic regex, the implementation pin, XPath text."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from wsnmom.adapters.kafka.config import parse_settings
from wsnmom.adapters.kafka.mapping import KafkaMapping
from wsnmom.adapters.mqtt.mapping import MqttMapping
from wsnmom.spark_bridge.buffer import LOG_TAPS, parse_log_taps
from wsnmom.spark_bridge.columns import xpath_text
from wsnmom.spark_bridge.native_kafka import pin_implementations, topic_regex
from wsnmom.spark_bridge.options import BridgeError, SourceError
from wsnmom.spark_bridge.reader import EARLIEST, RangePartition, _Common, _limit, _streams_of
from wsnmom.spark_bridge.selection import Selection, SelectionError, parse_mapping
from wsnmom.topic_mapping.model import Topic
from wsnmom.topic_mapping.translate import derived_root

NS = {"p": "urn:plant"}


def test_selection_compiles_like_a_subscription_filter() -> None:
    compiled = Selection("p:valves//state", None, NS).compile()
    assert compiled.topic is not None
    assert compiled.topic.matches(Topic("urn:plant", ("valves", "v1", "x", "state")))
    assert not compiled.topic.matches(Topic("urn:plant", ("valves", "v1", "flow")))
    assert Selection().compile().topic is None  # every topic


@pytest.mark.parametrize(
    ("selection", "fault"),
    [
        (Selection("p:a/b", None, {}), "InvalidTopicExpression"),
        (Selection("p:a//", "full", NS), "InvalidTopicExpression"),
        (Selection("p:a", "urn:unknown-dialect", NS), "TopicExpressionDialectUnknown"),
        (Selection("w:x", None, {"w": "urn:wsnmom:no-topic"}), "TopicNotSupported"),
        (Selection(message_content="/a["), "InvalidMessageContentExpression"),
    ],
)
def test_selection_errors_name_the_wsn_fault(selection: Selection, fault: str) -> None:
    with pytest.raises(SelectionError, match=fault):
        selection.compile()


def test_selection_round_trips_through_spark_options() -> None:
    sel = Selection("p:a/*", "concrete", NS, message_content="//x", message_content_namespaces=NS)
    options = {k.lower(): v for k, v in sel.to_options().items()}
    assert Selection.from_options(options) == sel
    # one boolean rule: "yes" is true, a typo is an error (it used to be False, silently)
    assert Selection.from_options({"fixedtopicset": "yes"}).fixed_topic_set is True
    with pytest.raises(ValueError, match="option fixedtopicset: not a boolean: 'ture'"):
        Selection.from_options({"fixedtopicset": "ture"})
    assert parse_mapping("p=urn:a, q=urn:b", "n") == {"p": "urn:a", "q": "urn:b"}
    assert parse_mapping('{"p": "urn:a"}', "n") == {"p": "urn:a"}
    with pytest.raises(SelectionError):
        parse_mapping("p", "namespaces")


def test_limit_shares_the_budget_fairly() -> None:
    begin = {"a": 0, "b": 10, "c": 5}
    ends = {"a": 100, "b": 12, "c": 5}
    cut = _limit(begin, ends, 10)
    assert cut == {"a": 8, "b": 12, "c": 5}
    assert sum(cut[s] - begin[s] for s in cut) == 10
    assert _limit(begin, ends, 1000) == ends


class _Fake:
    max_per_partition = 4
    min_partitions = 1


def test_ranges_split_and_new_streams_read_from_their_start() -> None:
    parts = _Common.ranges(_Fake(), {"a": 2}, {"a": 11, "new": 3})  # type: ignore[arg-type]
    # equal pieces of at most 4 offsets
    assert parts == [
        RangePartition("a", 2, 5),
        RangePartition("a", 5, 8),
        RangePartition("a", 8, 11),
        RangePartition("new", EARLIEST, 3),
    ]


def test_min_partitions_splits_the_longest_ranges_not_below_min_split() -> None:
    fake = _Fake()
    fake.max_per_partition = 100_000
    fake.min_partitions = 4
    ranges = _Common.ranges
    parts = ranges(fake, {"a": 0, "b": 0}, {"a": 60_000, "b": 20_000})  # type: ignore[arg-type]
    assert parts == [
        RangePartition("a", 0, 20_000),
        RangePartition("a", 20_000, 40_000),
        RangePartition("a", 40_000, 60_000),
        RangePartition("b", 0, 20_000),
    ]
    # small ranges stay whole: a task's consumer costs more than reading them
    assert ranges(fake, {"a": 0}, {"a": 15_000}) == [RangePartition("a", 0, 15_000)]  # type: ignore[arg-type]
    assert len(ranges(fake, {"a": 0}, {"a": 25_000})) == 2  # type: ignore[arg-type]


def test_offsets_of_another_implementation_or_source_are_refused() -> None:
    ok = {"v": 1, "source": "k", "streams": {"t/0": 5}}
    assert _streams_of(ok, "here", "k") == {"t/0": 5}
    native = {"t": {"0": 5}}  # what Spark's Kafka connector writes
    with pytest.raises(SourceError, match="did not write"):
        _streams_of(native, "here", "k")
    with pytest.raises(SourceError, match="belongs to source 'other'"):
        _streams_of({**ok, "source": "other"}, "here", "k")


def test_topic_regex_covers_exactly_the_logs_of_the_patterns() -> None:
    mapping = KafkaMapping(parse_settings("kafka://h:1?topic_prefix=g1"))
    patterns = Selection("p:valves/*/state", None, NS).compile().native_patterns
    regex = re.compile(topic_regex(mapping, patterns))
    root = derived_root("urn:plant")
    assert regex.match(f"g1.{root}.valves.v7.state")
    assert not regex.match(f"g1.{root}.valves.v7.flow")
    assert not regex.match(f"{root}.valves.v7.state")  # outside the prefix
    everything = re.compile(topic_regex(mapping, None))
    assert everything.match(f"g1.{root}.x") and not everything.match("other.x")


def test_pin_refuses_to_switch_the_implementation(tmp_path: Path) -> None:
    checkpoint = str(tmp_path / "cp")
    pin_implementations(checkpoint, {"k": "wsn_kafka", "r": "wsn_rabbitmq"})
    pin_implementations(checkpoint, {"k": "wsn_kafka", "m": "wsn_log"})  # additions are fine
    recorded = json.loads((tmp_path / "cp" / "wsnmom-sources.json").read_text())
    assert recorded == {"k": "wsn_kafka", "m": "wsn_log", "r": "wsn_rabbitmq"}
    with pytest.raises(BridgeError, match="k: wsn_kafka -> spark-sql-kafka"):
        pin_implementations(checkpoint, {"k": "spark-sql-kafka"})


def test_log_taps_of_the_mqtt_adapter_option() -> None:
    (config,) = parse_log_taps(
        {"plant": {"path": "~/p.sqlite", "topic": "p:a//c", "namespaces": {"p": "urn:plant"}}}
    )
    assert config.name == "plant" and not config.path.startswith("~")
    patterns = config.selection.compile().native_patterns
    # the same filters the gateway's session subscribes for a subscription
    mapping = MqttMapping({"urn:plant": "plant"}, "wsn")
    assert mapping.filters(patterns) == frozenset({"wsn/plant/a/+/#"})
    with pytest.raises(ValueError, match="path"):
        parse_log_taps({"x": {"topic": "p:a", "namespaces": "p=urn:plant"}})
    with pytest.raises(ValueError, match="unknown options"):
        parse_log_taps({"x": {"path": "x", "root": "a"}})
    with pytest.raises(SelectionError, match="InvalidTopicExpression"):
        parse_log_taps({"x": {"path": "x", "topic": "q:a"}})


def test_the_mqtt_adapter_finds_the_log_taps_by_the_name_it_keeps(tmp_path: Path) -> None:
    from wsnmom.adapters.mqtt.public import TAP_PROVIDERS
    from wsnmom.adapters.mqtt.taps import tap_provider

    assert set(TAP_PROVIDERS) == {"spark_logs"}
    provider = tap_provider("spark_logs")
    assert provider is LOG_TAPS
    path = tmp_path / "logs" / "p.sqlite"
    options = {"plant": {"path": str(path), "topic": "p:a//c", "namespaces": {"p": "urn:plant"}}}
    provider.check(options)
    assert not path.parent.exists()  # checking opens nothing
    with pytest.raises(ValueError, match="path"):
        provider.check({"x": {"topic": "p:a", "namespaces": "p=urn:plant"}})
    (tap,) = provider.taps(options)
    try:
        assert tap.name == "spark-log:plant"
        assert path.exists()
        assert tap.wants(Topic("urn:plant", ("a", "b", "c")))
        assert not tap.wants(Topic("urn:plant", ("a", "b")))
    finally:
        assert tap.close is not None
        tap.close()


def test_xpath_text() -> None:
    from lxml import etree

    root = etree.fromstring(b'<v id="7"><s>open</s><n>2</n></v>')
    assert xpath_text(root.xpath("s")) == "open"
    assert xpath_text(root.xpath("@id")) == "7"
    assert xpath_text(root.xpath("number(n) * 2")) == "4"
    assert xpath_text(root.xpath("count(x) = 0")) == "true"
    assert xpath_text(root.xpath("missing")) is None
