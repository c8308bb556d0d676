"""The ``wsn_notify`` sink: rows published back reach a WS-N subscriber of the gateway, once
per (batch, partition, row) even when a micro-batch or a whole write runs again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.spark_bridge.conftest import unique_namespace
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.spark]


class QueueCounter:
    """A plain queue bound to the namespace's exchange: every notification published."""

    def __init__(self, url: str, namespace: str) -> None:
        import pika
        from wsnmom.adapters.rabbitmq.names import RabbitMQNames

        self.connection = pika.BlockingConnection(pika.URLParameters(url))
        self.channel = self.connection.channel()
        self.exchange = RabbitMQNames({}).exchange_for(namespace)
        self.channel.exchange_declare(self.exchange, "topic", durable=True)
        self.queue = self.channel.queue_declare("", exclusive=True).method.queue
        self.channel.queue_bind(self.queue, self.exchange, "#")

    def ids(self) -> list[str]:
        out = []
        while True:
            method, properties, _body = self.channel.basic_get(self.queue, auto_ack=True)
            if method is None:
                return out
            out.append(properties.headers["wsnmom-message-id"])

    def ids_until_sentinel(self) -> list[str]:
        """Publish a sentinel into the namespace's exchange and return every id up to it
        (the barrier: whatever was published before has reached the queue)."""
        import pika

        self.channel.basic_publish(
            self.exchange,
            "sentinel",
            b"",
            pika.BasicProperties(headers={"wsnmom-message-id": SENTINEL}),
        )
        ids: list[str] = []

        def arrived() -> bool:
            ids.extend(self.ids())
            return SENTINEL in ids

        wait_until(arrived, what="the sentinel")
        return [i for i in ids if i != SENTINEL]

    def close(self) -> None:
        self.connection.close()


SENTINEL = "sentinel"


@pytest.mark.rabbitmq
def test_commit_resumes_after_a_failure_and_skips_a_published_batch(
    rabbitmq_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from wsnmom.spark_bridge import sink
    from wsnmom.spark_bridge.options import SourceError

    ns = unique_namespace()
    counter = QueueCounter(rabbitmq_url, ns)
    settings = sink.SinkSettings.parse(
        {
            "target": rabbitmq_url,
            "topic": "s:summary",
            "namespaces": json.dumps({"s": ns}),
            "ledger": str(tmp_path / "ledger.sqlite"),
            "sinkid": "t1",
            "chunk": "3",
        }
    )
    staged = [
        sink.StagedRows(1, [(i, None, f"<n>{i}</n>".encode()) for i in range(4)]),
        sink.StagedRows(0, [(i, "s:other", f"<m>{i}</m>".encode()) for i in range(4)]),
    ]
    real = sink.Publisher.publish
    calls = []

    def flaky(self: Any, batch: str, rows: Any) -> None:
        calls.append(len(rows))
        if len(calls) == 2:
            raise ConnectionError("broker went away")
        real(self, batch, rows)

    monkeypatch.setattr(sink.Publisher, "publish", flaky)
    try:
        with pytest.raises(SourceError, match=r"wsn_notify sink 't1' .* after 3 of 8 rows"):
            sink.commit_batch(settings, "7", staged)
        assert sink.commit_batch(settings, "7", staged) == 5  # the rest
        assert sink.commit_batch(settings, "7", staged) == 0  # a replay: nothing
    finally:
        sink.close_publishers()
    ids = counter.ids_until_sentinel()
    counter.close()
    assert sorted(ids) == sorted(
        [f"t1/7/0/{i}" for i in range(4)] + [f"t1/7/1/{i}" for i in range(4)]
    )


@pytest.mark.rabbitmq
def test_stream_results_reach_a_gateway_subscriber_once_even_when_a_batch_is_replayed(
    spark: Any, rabbit_gateway: Any, rabbitmq_url: str, consumer: Any, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F
    from wsnmom.spark_bridge import log_file, read_notifications, write_notifications, xml_element
    from wsnmom.spark_bridge.ledger import Ledger
    from wsnmom.spark_bridge.log import Entry, NotificationLog
    from wsnmom.topic_mapping.model import Topic

    from wsnmom.client.broker import WsnClient

    ns, out_ns = unique_namespace(), unique_namespace()
    log_path = tmp_path / "in.sqlite"
    log = NotificationLog(log_path, name="in")
    log.append(
        [Entry("x", Topic(ns, ("in", f"t{i % 3}")), f"<v>{i}</v>".encode()) for i in range(10)]
    )
    with WsnClient(rabbit_gateway.broker_url, namespaces={"s": out_ns}) as client:
        summary = client.subscribe(consumer.address(), "s:summary")
    checkpoint = tmp_path / "checkpoint"

    def run() -> Any:
        frame = read_notifications(
            spark, [log_file(str(log_path), alias="in", maxRecordsPerTrigger=4)], streaming=True
        )
        results = frame.select(
            xml_element("Seen", out_ns, {"topic": "topic", "offset": F.col("offset")}).alias(
                "payload"
            )
        )
        writer = write_notifications(
            results,
            rabbitmq_url,
            topic="s:summary",
            namespaces={"s": out_ns},
            checkpoint=str(checkpoint),
        )
        assert writer is not None
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination(120)
        assert query.exception() is None
        return query

    first = run()
    assert [p["numInputRows"] for p in first.recentProgress if p["numInputRows"]] == [4, 4, 2]
    messages = consumer.wait_for_messages(10, timeout=30)
    texts = sorted(m.find(".//{*}offset").text for m in messages)
    assert texts == sorted(str(i) for i in range(1, 11))
    # Spark forgets that the last batch was done: the restarted query runs it again
    last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    (checkpoint / "commits" / str(last)).unlink()
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)
    replay = run()
    assert [p["batchId"] for p in replay.recentProgress if p["numInputRows"]] == [last]
    ledger = Ledger(checkpoint / "wsnmom-sink-ledger.sqlite")
    assert [b for b in ledger.batches("wsn_notify")] == [
        ("0", 4, 4, True),
        ("1", 4, 4, True),
        ("2", 2, 2, True),
    ]
    # the barrier: a sentinel published after the replay comes after anything it published
    with WsnClient(rabbit_gateway.broker_url, namespaces={"s": out_ns}) as client:
        client.notify("<sentinel/>", "s:summary")
    got = consumer.wait_for_sentinel(summary.address, 30)
    assert len(got) == 11  # the 10 and the sentinel


@pytest.mark.rabbitmq
def test_batch_write_through_the_gateway_notify_once_per_write_id(
    spark: Any, rabbit_gateway: Any, consumer: Any, tmp_path: Path
) -> None:
    from wsnmom.spark_bridge import write_notifications

    from wsnmom.client.broker import WsnClient

    ns = unique_namespace()
    with WsnClient(rabbit_gateway.broker_url, namespaces={"s": ns}) as client:
        daily = client.subscribe(consumer.address(), "s:daily//.")
    frame = spark.createDataFrame(
        [(f'<r xmlns="urn:r">{i}</r>', f"s:daily/d{i}") for i in range(3)],
        "payload string, topic string",
    )
    ledger = str(tmp_path / "ledger.sqlite")
    for _ in range(2):
        write_notifications(
            frame,
            rabbit_gateway.broker_url,
            namespaces={"s": ns},
            write_id="2024-05-01",
            ledger=ledger,
        )
    with WsnClient(rabbit_gateway.broker_url, namespaces={"s": ns}) as client:
        client.notify("<sentinel/>", "s:daily/sentinel")  # the barrier
    *messages, _sentinel = consumer.wait_for_sentinel(daily.address, 30)
    assert len(messages) == 3
    assert sorted(m.find(".//{urn:r}r").text for m in messages) == ["0", "1", "2"]
    topics = sorted(m.find("{*}Topic").text.rpartition(":")[2] for m in messages)
    assert topics == ["daily/d0", "daily/d1", "daily/d2"]
    bad = spark.createDataFrame([("not xml", "s:daily/x")], "payload string, topic string")
    with pytest.raises(
        Exception,
        match=r"wsn_notify sink 'wsn_notify' .*row 0 of partition \d+: the payload is not an XML",
    ):
        write_notifications(bad, rabbit_gateway.broker_url, namespaces={"s": ns})
