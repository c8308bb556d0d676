"""Each source of the bridge in a real ``local[2]`` Spark against real brokers: exactly the
published notifications appear (through the gateway and natively), in the bridge's schema,
filtered as a WS-N subscription with the same expression would be."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from lxml import etree
from wsnmom.adapters.kafka.config import parse_settings
from wsnmom.adapters.kafka.mapping import KafkaMapping
from wsnmom.topic_mapping.model import Topic

from tests.fixtures.mosquitto import MqttPublisher
from tests.spark_bridge.conftest import unique_namespace
from tests.support.waiting import wait_until
from wsnmom.client.broker import WsnClient

pytestmark = [pytest.mark.spark]

NATIVE = "{urn:wsnmom:ns:1}NativeMessage"


def notify(gateway: Any, ns: str, items: list[tuple[str, str]]) -> None:
    """Publish ``(topic path, payload)`` pairs through the gateway's Notify."""
    with WsnClient(gateway.broker_url, namespaces={"p": ns}) as client:
        client.notify_many([(payload, f"p:{path}") for path, payload in items])


def produce_native(bootstrap: str, topic: str, bodies: list[bytes]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for body in bodies:
        producer.produce(topic, body, partition=0)
        producer.flush(10)


@pytest.mark.kafka
def test_kafka_batch_read_gateway_and_native_records(
    spark: Any, kafka_gateway: Any, kafka_bootstrap: str
) -> None:
    from wsnmom.spark_bridge import kafka, read_notifications
    from wsnmom.spark_bridge.schema import spark_schema

    ns = unique_namespace()
    notify(
        kafka_gateway,
        ns,
        [(f"valves/v{i % 3}/state", f'<s xmlns="urn:s">{i}</s>') for i in range(6)],
    )
    notify(kafka_gateway, ns, [("pumps/p1", "<s>not selected</s>")])
    mapping = KafkaMapping(parse_settings(kafka_gateway.adapter_url))
    native_log = mapping.destination(Topic(ns, ("valves", "v9", "state"))).log
    produce_native(kafka_bootstrap, native_log, [b'{"n": 1}', b'{"n": 2}', b"<n>3</n>"])

    df = read_notifications(
        spark,
        [kafka(kafka_gateway.adapter_url, alias="plant-kafka")],
        "p:valves/*/state",
        namespaces={"p": ns},
        streaming=False,
    )
    assert df.schema == spark_schema()
    rows = df.orderBy("topic_path", "offset").collect()
    assert len(rows) == 9
    assert {r.source for r in rows} == {"plant-kafka"} and {r.middleware for r in rows} == {"kafka"}
    gateway_rows = [r for r in rows if r.topic_path != "valves/v9/state"]
    assert sorted(etree.fromstring(r.payload.encode()).text for r in gateway_rows) == [
        str(i) for i in range(6)
    ]
    assert len({r.message_id for r in gateway_rows}) == 6
    assert all(r.headers["wsnmom-topic-ns"] == ns and r.timestamp is not None for r in gateway_rows)
    assert all(r.topic == f"{{{ns}}}{r.topic_path}" and r.topic_namespace == ns for r in rows)
    native = [r for r in rows if r.topic_path == "valves/v9/state"]
    assert [r.body for r in native] == [b'{"n": 1}', b'{"n": 2}', b"<n>3</n>"]
    first = etree.fromstring(native[0].payload.encode())
    assert first.tag == NATIVE and first.get("contentType") == "application/json"
    assert native[2].payload == "<n>3</n>" and native[0].content_type == "application/json"
    assert native[0].message_id == f"plant-kafka/{native_log}/0/{native[0].offset}"


@pytest.mark.rabbitmq
def test_rabbitmq_tap_reads_without_taking_from_subscribers(
    spark: Any, rabbit_gateway: Any, rabbitmq_url: str
) -> None:
    import pika
    from wsnmom.adapters.rabbitmq.names import RabbitMQNames
    from wsnmom.spark_bridge import rabbitmq, read_notifications
    from wsnmom.spark_bridge.rabbitmq_tap import ensure_tap

    ns = unique_namespace()
    expression = "p:line//."
    queue = ensure_tap(
        {"url": rabbitmq_url, "topic": expression, "namespaces": json.dumps({"p": ns})}
    )
    client = WsnClient(rabbit_gateway.broker_url, namespaces={"p": ns})
    pull_point = client.create_pull_point()
    client.subscribe(pull_point, expression)
    notify(rabbit_gateway, ns, [(f"line/m{i}", f"<m>{i}</m>") for i in range(5)])
    notify(rabbit_gateway, ns, [("other/x", "<m>no</m>")])
    exchange = RabbitMQNames({}).exchange_for(ns)
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    channel = connection.channel()
    channel.confirm_delivery()
    for i in range(3):
        channel.basic_publish(exchange, f"line.n{i}.deep", f"native {i}".encode())
    connection.close()

    source = rabbitmq(rabbitmq_url, alias="plant-rabbit", queue=queue)
    df = read_notifications(spark, [source], expression, namespaces={"p": ns}, streaming=False)
    rows = df.orderBy("offset").collect()
    assert [r.offset for r in rows] == list(range(8))
    assert [r.topic_path for r in rows] == [f"line/m{i}" for i in range(5)] + [
        f"line/n{i}/deep" for i in range(3)
    ]
    assert {r.stream for r in rows} == {queue}
    assert (
        etree.fromstring(rows[5].payload.encode()).get("contentType") == "application/octet-stream"
    )
    # the subscriber still gets every one of them: the tap took nothing away
    got = wait_until(lambda: (m := client.get_messages(pull_point)) and m, what="pull point")
    assert len(got) == 8
    client.close()


@pytest.mark.mqtt
def test_mid_path_descendants_on_mqtt_buffer_and_log_source(
    spark: Any, mqtt_url: str, mqtt_publisher: MqttPublisher, tmp_path: Path
) -> None:
    """``a//c`` has no MQTT filter: the buffer subscribes ``a/+/#`` and keeps only what the
    expression selects (as a subscription's queue would); a source may then select less,
    again with a mid-path ``//``, and the log source's residual filter decides."""
    from wsnmom.spark_bridge import log_file, read_notifications
    from wsnmom.spark_bridge.buffer import BufferSettings, MqttBuffer
    from wsnmom.spark_bridge.log import NotificationLog
    from wsnmom.spark_bridge.selection import Selection

    ns = unique_namespace()
    root = "t" + uuid.uuid4().hex[:8]
    path = tmp_path / "mqtt.sqlite"
    buffer = MqttBuffer(
        BufferSettings(
            url=mqtt_url,
            log_path=str(path),
            client_id=f"buf-{root}",
            selection=Selection("p:a//c", None, {"p": ns}),
            roots={ns: root},
        )
    )
    buffer.start()
    try:
        assert buffer.filters == [f"{root}/a/+/#"]  # wider than a//c
        published = ["a/x/c", "a/y/z/c", "a/c", "a/x/d", "a/x/c/e", "b/x/c"]
        for name in published:
            mqtt_publisher.publish(
                f"{root}/{name}", f"<v>{name}</v>".encode(), content_type="application/xml"
            )
        mqtt_publisher.publish(
            f"{root}/a/q/c",
            b"<v>gw</v>",
            {"wsnmom-message-id": "gw-1", "wsnmom-topic-ns": ns, "wsnmom-topic-path": "a/q/c"},
            "application/xml",
        )
        log = NotificationLog(path, create=False)
        # in order: once the last one is in, the ones before it were decided
        wait_until(lambda: b"<v>gw</v>" in [body for *_, body in log.entries()], what="gw-1")
    finally:
        buffer.stop()
    assert [native for _, native, _ in log.entries()] == [
        f"{root}/{name}" for name in ("a/x/c", "a/y/z/c", "a/c", "a/q/c")
    ]
    df = read_notifications(
        spark,
        [log_file(str(path), alias="plant-mqtt")],
        "p:a//c",
        namespaces={"p": ns},
        streaming=False,
    )
    rows = df.orderBy("offset").collect()
    assert [r.topic_path for r in rows] == ["a/x/c", "a/y/z/c", "a/c", "a/q/c"]
    assert {r.middleware for r in rows} == {"mqtt"} and rows[3].message_id == "gw-1"
    assert rows[0].payload == "<v>a/x/c</v>"
    # a narrower mid-path expression than the buffer's: the source's residual filter; the
    # driver reads and ships the records (executors without the log's disk)
    narrower = read_notifications(
        spark,
        [log_file(str(path), alias="plant-mqtt", shipFromDriver=True)],
        "p:a//z/c",
        namespaces={"p": ns},
        streaming=False,
    )
    assert [r.topic_path for r in narrower.collect()] == ["a/y/z/c"]
