"""Spark's native Kafka connector path (as far as it can be tested without its jar), XPath
columns, and errors that name the source and the broker."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.brokers import free_port
from tests.spark_bridge.conftest import unique_namespace
from tests.spark_bridge.test_sources import notify, produce_native

pytestmark = [pytest.mark.spark]

NATIVE_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
    "timestampType int, headers array<struct<key: string, value: binary>>"
)


def test_native_connector_is_detected_on_the_jvm(spark: Any) -> None:
    from wsnmom.spark_bridge.native_kafka import (
        KAFKA_PROVIDER,
        jvm_class_available,
        native_kafka_available,
    )

    assert jvm_class_available(spark, "org.apache.spark.sql.SparkSession")
    assert not jvm_class_available(spark, "org.example.NoSuchClass")
    assert native_kafka_available(spark) == jvm_class_available(spark, KAFKA_PROVIDER)
    if native_kafka_available(spark):
        pytest.skip("spark-sql-kafka is on this classpath: the checks below need it absent")
    with pytest.raises(Exception, match="KAFKA_DATA_SOURCE_NOT_ENABLED"):
        spark.read.format("kafka").option("kafka.bootstrap.servers", "x:1").load()


@pytest.mark.kafka
def test_connector_choice_without_the_jar(spark: Any, kafka_gateway: Any, tmp_path: Path) -> None:
    from wsnmom.spark_bridge import BridgeError, kafka, read_notifications
    from wsnmom.spark_bridge.native_kafka import native_kafka_available

    if native_kafka_available(spark):
        pytest.skip("spark-sql-kafka is on this classpath")
    ns = unique_namespace()
    notify(kafka_gateway, ns, [("a", "<a/>")])
    source = kafka(kafka_gateway.adapter_url, alias="k")
    with pytest.raises(
        BridgeError, match=r"--packages org\.apache\.spark:spark-sql-kafka-0-10_2\.13:4\."
    ):
        read_notifications(spark, [source], "p:a", namespaces={"p": ns}, connector="native")
    frame = read_notifications(spark, [source], "p:a", namespaces={"p": ns}, streaming=False)
    assert frame.count() == 1  # auto: the Python source
    checkpoint = str(tmp_path / "cp")
    read_notifications(spark, [source], "p:a", namespaces={"p": ns}, checkpoint=checkpoint)
    pinned = (tmp_path / "cp" / "wsnmom-sources.json").read_text()
    assert '"k": "wsn_kafka"' in pinned


@pytest.mark.kafka
def test_native_rows_equal_the_python_source_rows(
    spark: Any, kafka_gateway: Any, kafka_bootstrap: str
) -> None:
    """Records as Spark's Kafka connector delivers them, converted by ``native_rows``,
    give the rows ``wsn_kafka`` gives."""
    from confluent_kafka import Consumer, TopicPartition
    from wsnmom.adapters.kafka.config import parse_settings
    from wsnmom.adapters.kafka.mapping import KafkaMapping
    from wsnmom.spark_bridge import kafka, read_notifications
    from wsnmom.spark_bridge.native_kafka import native_rows
    from wsnmom.spark_bridge.selection import Selection
    from wsnmom.topic_mapping.model import Topic

    ns = unique_namespace()
    notify(kafka_gateway, ns, [(f"n/x{i}", f"<v>{i}</v>") for i in range(4)])
    mapping = KafkaMapping(parse_settings(kafka_gateway.adapter_url))
    native_log = mapping.destination(Topic(ns, ("n", "raw"))).log
    produce_native(kafka_bootstrap, native_log, [b"plain text"])
    logs = [mapping.destination(Topic(ns, ("n", f"x{i}"))).log for i in range(4)] + [native_log]
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": "native-rows"})
    consumer.assign([TopicPartition(log, 0, 0) for log in logs])
    records = []
    while len(records) < 5:
        for m in consumer.consume(10, 5):
            if m.error() is None:
                records.append(m)
    consumer.close()
    rows = [
        (
            m.key(),
            m.value(),
            m.topic(),
            m.partition(),
            m.offset(),
            datetime.fromtimestamp(m.timestamp()[1] / 1000, UTC),
            0,
            [(k, v) for k, v in (m.headers() or [])],
        )
        for m in records
    ]
    native_frame = spark.createDataFrame(rows, NATIVE_SCHEMA)
    options = {
        "url": kafka_gateway.adapter_url,
        "alias": "k",
        **Selection("p:n/*", None, {"p": ns}).to_options(),
    }
    converted = native_rows(native_frame, options).drop("timestamp").collect()
    python = read_notifications(
        spark,
        [kafka(kafka_gateway.adapter_url, alias="k")],
        "p:n/*",
        namespaces={"p": ns},
        streaming=False,
    ).drop("timestamp")
    assert sorted(converted) == sorted(python.collect())
    assert len(converted) == 5


def test_xpath_columns(spark: Any) -> None:
    from wsnmom.spark_bridge import with_xpath

    frame = spark.createDataFrame(
        [('<p:v xmlns:p="urn:p" id="7"><p:s>open</p:s></p:v>',), ("not xml",)], "payload string"
    )
    out = with_xpath(frame, {"id": "string(@id)", "state": "p:s", "n": "count(*)"}, {"p": "urn:p"})
    rows = out.collect()
    assert (rows[0].id, rows[0].state, rows[0].n) == ("7", "open", "1")
    assert (rows[1].id, rows[1].state) == (None, None)
    with pytest.raises(ValueError, match="invalid XPath"):
        with_xpath(frame, {"x": "/a["})


def test_errors_name_the_source_and_the_broker(tmp_path: Path) -> None:
    from wsnmom.spark_bridge import SourceError, kafka, log_file, plan_batch, rabbitmq
    from wsnmom.spark_bridge.selection import Selection

    port = free_port()
    with pytest.raises(
        SourceError, match=rf"kafka source 'dead-kafka' \(kafka://127.0.0.1:{port}\)"
    ):
        plan_batch(
            [kafka(f"kafka://127.0.0.1:{port}?connect_timeout=1", alias="dead-kafka")], Selection()
        )
    with pytest.raises(
        SourceError, match=rf"rabbitmq source 'dead-rabbit' \(amqp://u:\*\*\*@127.0.0.1:{port}"
    ):
        plan_batch(
            [rabbitmq(f"amqp://u:secret@127.0.0.1:{port}/%2F", alias="dead-rabbit")], Selection()
        )
    with pytest.raises(SourceError, match=r"log source 'm' .*no notification log at"):
        plan_batch([log_file(str(tmp_path / "missing.sqlite"), alias="m")], Selection())


def test_records_removed_before_they_were_read(spark: Any, tmp_path: Path) -> None:
    """A range whose start retention removed (what a checkpoint behind a trimmed log
    asks for): the read fails naming the source and the lost offsets, or skips them."""
    from wsnmom.spark_bridge import log_file, read_notifications
    from wsnmom.spark_bridge.log import Entry, NotificationLog
    from wsnmom.topic_mapping.model import Topic

    path = tmp_path / "l.sqlite"
    log = NotificationLog(path, name="l")
    log.append([Entry("x", Topic("urn:x", ("a",)), b"<a/>") for _ in range(10)])
    log.trim(8)  # records 6 and 7 go before they are read

    def read(**options: str) -> list[int]:
        source = log_file(str(path), alias="lost", startingOffsets='{"l": 6}', **options)
        frame = read_notifications(spark, [source], streaming=False)
        return sorted(r.offset for r in frame.collect())

    with pytest.raises(Exception, match=r"log source 'lost' .*records 6\.\.7 of l were removed"):
        read()
    assert read(failOnDataLoss="false") == [8, 9, 10]
