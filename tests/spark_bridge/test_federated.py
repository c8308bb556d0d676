"""One streaming query over Kafka, RabbitMQ and MQTT at once (``read_notifications``),
checkpointed together: stopped and restarted from its checkpoint, it neither loses nor
duplicates a notification of any source; admission control cuts the backlog into
micro-batches."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.mosquitto import MqttPublisher
from tests.spark_bridge.conftest import unique_namespace
from tests.spark_bridge.test_sources import notify
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.spark]


@pytest.mark.kafka
@pytest.mark.rabbitmq
@pytest.mark.mqtt
def test_federated_stream_restarts_without_loss_or_duplicates(
    spark: Any,
    kafka_gateway: Any,
    rabbit_gateway: Any,
    rabbitmq_url: str,
    mqtt_url: str,
    mqtt_publisher: MqttPublisher,
    kafka_bootstrap: str,
    tmp_path: Path,
) -> None:
    from wsnmom.spark_bridge import kafka, log_file, rabbitmq, read_notifications
    from wsnmom.spark_bridge.buffer import BufferSettings, MqttBuffer
    from wsnmom.spark_bridge.log import NotificationLog
    from wsnmom.spark_bridge.rabbitmq_tap import ensure_tap
    from wsnmom.spark_bridge.selection import Selection

    ns = unique_namespace()
    expression, namespaces = "p:fed//.", {"p": ns}
    root = "f" + uuid.uuid4().hex[:8]
    log_path = tmp_path / "mqtt.sqlite"
    queue = ensure_tap(
        {"url": rabbitmq_url, "topic": expression, "namespaces": json.dumps(namespaces)}
    )
    buffer = MqttBuffer(
        BufferSettings(
            url=mqtt_url,
            log_path=str(log_path),
            client_id=f"buf-{root}",
            selection=Selection(expression, None, namespaces),
            roots={ns: root},
        )
    )
    buffer.start()
    log = NotificationLog(log_path, create=False)

    def publish(first: int, count: int) -> None:
        items = [
            (f"fed/{'a' if i % 2 else 'b/c'}", f"<n>{i}</n>") for i in range(first, first + count)
        ]
        notify(kafka_gateway, ns, items)
        notify(rabbit_gateway, ns, items)
        for path, payload in items:
            mqtt_publisher.publish(
                f"{root}/{path}", payload.encode(), content_type="application/xml"
            )
        wait_until(lambda: len(log) == first + count, what=f"{first + count} buffered")

    group = f"spark-{root}"
    sources = [
        kafka(kafka_gateway.adapter_url, alias="kafka", maxRecordsPerTrigger=5, groupId=group),
        rabbitmq(rabbitmq_url, alias="rabbit", queue=queue, maxRecordsPerTrigger=5),
        log_file(str(log_path), alias="mqtt", maxRecordsPerTrigger=5),
    ]
    checkpoint, out = str(tmp_path / "checkpoint"), str(tmp_path / "out")

    def run() -> Any:
        frame = read_notifications(
            spark, sources, expression, namespaces=namespaces, streaming=True, checkpoint=checkpoint
        )
        query = (
            frame.writeStream.format("parquet")
            .option("path", out)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(180)
        assert query.exception() is None
        return query

    try:
        publish(0, 8)
        first = run()
        publish(8, 4)  # while the query is stopped
        second = run()
    finally:
        buffer.stop()

    rows = spark.read.parquet(out).select("source", "payload", "offset", "middleware").collect()
    expected = sorted(f"<n>{i}</n>" for i in range(12))
    for source in ("kafka", "rabbit", "mqtt"):
        payloads = sorted(r.payload for r in rows if r.source == source)
        assert payloads == expected, source
    assert {r.middleware for r in rows} == {"kafka", "rabbitmq", "mqtt"}
    # 8 records per source at most 5 at a time: the first run took two micro-batches
    batches = [p for p in first.recentProgress if p["numInputRows"] > 0]
    assert len(batches) >= 2 and max(p["numInputRows"] for p in batches) <= 15
    # the Kafka source mirrored what Spark committed into its monitoring group: Spark tells
    # a source at the start of a micro-batch that the one before is done, so the group is
    # at the end of the first run (the second run's last batch is told at the next start)
    first_end = json.loads(first.recentProgress[-1]["sources"][0]["endOffset"])["streams"]
    assert _group_offsets(kafka_bootstrap, group) == first_end
    progress = second.recentProgress[-1]["sources"]
    assert len(progress) == 3
    assert {json.loads(s["endOffset"])["source"] for s in progress} == {"kafka", "rabbit", "mqtt"}


def _group_offsets(bootstrap: str, group: str) -> dict[str, int]:
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    future = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group]
    return {f"{tp.topic}/{tp.partition}": tp.offset for tp in future.result().topic_partitions}
