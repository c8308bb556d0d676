"""The example job of docs/spark.md (examples/spark_topic_counts.py) against the fixture
brokers: counts per topic per minute across Kafka, RabbitMQ and an MQTT buffer log reach a
WS-N subscriber of the gateway as notifications on the summary topic."""

from __future__ import annotations

import importlib.util
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.spark_bridge.conftest import unique_namespace
from tests.spark_bridge.test_sources import notify

pytestmark = [pytest.mark.spark]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "spark_topic_counts.py"


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("spark_topic_counts", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.kafka
@pytest.mark.rabbitmq
def test_example_job_publishes_topic_counts(
    spark: Any,
    kafka_gateway: Any,
    rabbit_gateway: Any,
    rabbitmq_url: str,
    consumer: Any,
    tmp_path: Path,
) -> None:
    from wsnmom.spark_bridge.log import Entry, NotificationLog
    from wsnmom.spark_bridge.rabbitmq_tap import ensure_tap
    from wsnmom.topic_mapping.model import Topic

    from wsnmom.client.broker import WsnClient

    example = _example()
    ns = unique_namespace()
    summary = f"s:counts-{uuid.uuid4().hex[:8]}"
    topic, namespaces = "p:plant//.", {"p": ns}
    tap = ensure_tap({"url": rabbitmq_url, "topic": topic, "namespaces": json.dumps(namespaces)})
    with WsnClient(rabbit_gateway.broker_url, namespaces={"s": example.SUMMARY_NS}) as client:
        subscription = client.subscribe(consumer.address(), summary)
    notify(kafka_gateway, ns, [("plant/a", "<v/>")] * 3 + [("plant/b", "<v/>")] * 2)
    notify(rabbit_gateway, ns, [("plant/a", "<v/>")] * 4)
    mqtt_log = tmp_path / "mqtt.sqlite"
    NotificationLog(mqtt_log, name="mqtt", middleware="mqtt").append(
        [Entry("plant/c", Topic(ns, ("plant", "c")), b"<v/>", content_type="application/xml")] * 1
    )
    writer = example.build_query(
        spark,
        kafka=kafka_gateway.adapter_url,
        rabbitmq=rabbitmq_url,
        mqtt_log=str(mqtt_log),
        topic=topic,
        namespaces=namespaces,
        target=rabbitmq_url,
        summary_topic=summary,
        checkpoint=str(tmp_path / "checkpoint"),
        tap_queue=tap,
    )
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination(180)
    assert query.exception() is None
    expected = {("kafka", "plant/a"): 3, ("kafka", "plant/b"): 2, ("rabbitmq", "plant/a"): 4}
    expected[("mqtt", "plant/c")] = 1
    # the barrier: a sentinel after what the query published (it has terminated)
    with WsnClient(rabbit_gateway.broker_url, namespaces={"s": example.SUMMARY_NS}) as client:
        client.notify("<sentinel/>", summary)
    *messages, _sentinel = consumer.wait_for_sentinel(subscription.address, 30)
    counts = {}
    for message in messages:
        element = message.find(".//{urn:wsnmom:example:summary}TopicCount")
        assert element is not None
        fields = {child.tag.rpartition("}")[2]: child.text for child in element}
        key = (fields["source"], fields["topic"].rpartition("}")[2])
        counts[key] = counts.get(key, 0) + int(fields["count"])  # update mode: one window each
        assert fields["windowStart"] < fields["windowEnd"]
    assert counts == expected
    assert len(messages) >= len(expected)
