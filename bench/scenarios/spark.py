"""Scenario 7, Spark bridge: notifications per second that Spark reads from Kafka through the
bridge's Python data source (``wsn_kafka``), in a batch query and in a streaming query,
against a plain confluent-kafka consumer reading the same records in the same run.

Everything measured runs on all CPUs the bench may use (``cpus.on_all_cpus``), the
plain consumer as well as Spark: ``local[2]`` means two cores; the broker stays on the
load side's CPU.  The load averages at start and end are in the details (the machine is
shared).

Setup (not timed): ``count`` notifications published the way the gateway publishes them
(``core.codec`` headers, XML payloads, the Kafka adapter's ``publish_many``) on four WS
topics, i.e. four Kafka topics; a ``local[2]`` SparkSession; a warm-up query (the first
query of a session starts the Python workers).

Measured:
* ``plain_consumer``: one confluent-kafka consumer assigned to every partition from offset
  0, ``consume(1000)`` until it has every record (the baseline: it decodes nothing);
* ``spark_batch``: ``read_notifications(..., streaming=False)`` and an aggregate over the
  payloads (every row decoded, filtered and handed to the JVM), from planning to result;
* ``spark_stream``: the same as a streaming query into Spark's ``noop`` sink with
  ``Trigger.AvailableNow``: the time of its micro-batches (the sum of their
  ``triggerExecution``; the query's start-up, a few seconds, is reported apart).

Target: each Spark figure >= 0.5 of the plain consumer.  Reported beside it without a
target, the *equal work* baseline ``decoding_consumer``: the same plain consumer that also
turns every record into the bridge's row in one process, with the conversion a task of the
source runs (``spark_bridge.kafka_rows``: mapping, decoding, residual filter, Arrow
batches), i.e. what the Spark query does per record, without Spark.  Spark's native
Kafka connector is not measured: its jar cannot be installed from PyPI (the bridge
detects and uses it when it is on the classpath, see docs/spark.md).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import time
import uuid
from typing import Any

from bench import cpus
from bench.middleware import Middleware
from bench.model import Metric, ScenarioResult, Target
from bench.scenarios.base import Context, Scenario

NAMESPACE = "urn:wsnmom:bench:spark"
TOPICS = 4


def _load() -> list[float]:
    """The machine's load averages (1, 5, 15 minutes): the machine is shared."""
    return [round(x, 2) for x in os.getloadavg()]


def _missing() -> str | None:
    for module in ("pyspark", "pyarrow", "confluent_kafka"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install 'wsnmom[spark]')"
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "no Java runtime (Java 17 or 21)"
    return None


def _publish(url: str, count: int) -> None:
    from datetime import UTC, datetime

    from wsnmom.adapters.kafka.adapter import KafkaAdapter
    from wsnmom.core.codec import encode
    from wsnmom.core.model import NotificationMessage
    from wsnmom.topic_mapping.model import Topic

    adapter = KafkaAdapter(url, {})
    adapter.open()
    try:
        now = datetime.now(UTC)
        topics = [Topic(NAMESPACE, ("valves", f"v{i}", "state")) for i in range(TOPICS)]
        batch = []
        for i in range(count):
            payload = (
                f'<p:state xmlns:p="urn:example:plant"><p:valve>v{i % TOPICS}</p:valve>'
                f"<p:open>{'true' if i % 2 else 'false'}</p:open><p:seq>{i}</p:seq></p:state>"
            )
            message = NotificationMessage(
                message_id=uuid.uuid4().hex,
                payload=payload.encode(),
                topic=topics[i % TOPICS],
                published_at=now,
            )
            batch.append(encode(message))
            if len(batch) == 1000:
                adapter.publish_many(batch, timeout=60)
                batch.clear()
        if batch:
            adapter.publish_many(batch, timeout=60)
    finally:
        adapter.close()


def _plain_consumer(
    bootstrap: str, logs: list[str], count: int, decode_with: str | None = None
) -> float:
    """Seconds a plain consumer takes to read ``count`` records of ``logs``; with
    ``decode_with`` (the adapter URL) it also makes the bridge's rows of them, as a task of
    the Kafka source does (``KafkaRows``, batches of 4,096 records per partition)."""
    from confluent_kafka import Consumer, TopicPartition

    rows: Any = None
    pending: dict[tuple[str, int], list[Any]] = {}
    if decode_with is not None:
        from wsnmom.adapters.kafka.config import parse_settings
        from wsnmom.adapters.kafka.mapping import KafkaMapping
        from wsnmom.spark_bridge.kafka_rows import KafkaRows
        from wsnmom.spark_bridge.selection import Selection

        mapping = KafkaMapping(parse_settings(decode_with))
        selection = Selection("p:valves//.", None, {"p": NAMESPACE}).compile()
        mapping.register(NAMESPACE)
        rows = KafkaRows("bench", mapping, selection)

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-plain-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
        }
    )
    metadata = consumer.list_topics(timeout=10)
    parts = [TopicPartition(log, p, 0) for log in logs for p in metadata.topics[log].partitions]
    paused = _collector_paused() if rows is not None else contextlib.nullcontext()
    started = time.perf_counter()
    consumer.assign(parts)
    seen = 0
    deadline = time.monotonic() + 300
    with paused:
        while seen < count and time.monotonic() < deadline:
            for message in consumer.consume(1000, 0.5):
                if message.error() is None:
                    seen += 1
                    if rows is None:
                        message.value()
                        continue
                    key = (message.topic(), message.partition())
                    chunk = pending.setdefault(key, [])
                    chunk.append(message)
                    if len(chunk) >= 4096:
                        rows.from_messages(key[0], key[1], chunk)
                        pending[key] = []
        for (log, partition), chunk in pending.items():
            if chunk:
                rows.from_messages(log, partition, chunk)
    elapsed = time.perf_counter() - started
    consumer.close()
    if seen < count:
        raise RuntimeError(f"the plain consumer read {seen} of {count} records")
    if rows is not None and rows.accepted != count:
        raise RuntimeError(f"the equal-work consumer made {rows.accepted} of {count} rows")
    return elapsed


def _collector_paused() -> Any:
    from wsnmom.spark_bridge.kafka_rows import collector_paused

    return collector_paused()


class SparkBridge(Scenario):
    """Spark reads from Kafka through the bridge vs a plain consumer."""

    name = "spark"
    title = "Spark bridge: notifications/s read from Kafka vs a plain consumer"
    middlewares = ("kafka",)
    needs_server = False

    def run(self, ctx: Context, mw: Middleware | None, result: ScenarioResult) -> None:
        missing = _missing()
        if missing is not None:
            result.status = "not_available"
            result.reason = missing
            return
        assert mw is not None
        bootstrap = getattr(mw, "bootstrap", None)
        if not bootstrap:
            raise RuntimeError("the Kafka middleware has no bootstrap address")
        count = ctx.pick(200_000, 20_000)
        url = mw.adapter_url(ctx.workdir / "spark")
        result.details.update({"notifications": count, "kafka_topics": TOPICS, "cores": 2})

        from wsnmom.adapters.kafka.config import parse_settings
        from wsnmom.adapters.kafka.mapping import KafkaMapping
        from wsnmom.topic_mapping.model import Topic

        started = time.perf_counter()
        _publish(url, count)
        result.setup["publish_s"] = time.perf_counter() - started
        mapping = KafkaMapping(parse_settings(url))
        logs = [
            mapping.destination(Topic(NAMESPACE, ("valves", f"v{i}", "state"))).log
            for i in range(TOPICS)
        ]

        result.details["load_avg_start"] = _load()
        with cpus.on_all_cpus():
            plain = count / _plain_consumer(bootstrap, logs, count)
            ctx.log(f"  plain consumer: {plain:,.0f} msg/s")
            decoding = count / _plain_consumer(bootstrap, logs, count, decode_with=url)
            ctx.log(f"  plain consumer making the bridge's rows: {decoding:,.0f} msg/s")

            started = time.perf_counter()
            from wsnmom.spark_bridge import kafka, local_session, read_notifications

            spark = local_session("wsnmom-bench", cores=2)
            spark.sparkContext.setLogLevel("ERROR")
            result.setup["session_s"] = time.perf_counter() - started
            try:
                source = kafka(url, alias="bench")
                namespaces = {"p": NAMESPACE}
                started = time.perf_counter()
                _batch(spark, read_notifications, source, "p:valves/v0/state", namespaces)
                result.setup["warm_up_s"] = time.perf_counter() - started

                started = time.perf_counter()
                rows = _batch(spark, read_notifications, source, "p:valves//.", namespaces)
                batch_s = time.perf_counter() - started
                if rows != count:
                    raise RuntimeError(f"the batch query read {rows} of {count} notifications")
                stream_s, stream_wall = _stream(
                    spark, read_notifications, source, namespaces, count, ctx
                )
                result.details["stream_wall_s"] = round(stream_wall, 2)
                result.details["batch_s"] = round(batch_s, 2)
            finally:
                spark.stop()
        result.details["load_avg_end"] = _load()
        batch_rate, stream_rate = count / batch_s, count / stream_s
        ctx.log(f"  Spark batch: {batch_rate:,.0f} msg/s, streaming: {stream_rate:,.0f} msg/s")
        for name, value in (("spark_batch", batch_rate), ("spark_stream", stream_rate)):
            result.add(
                Metric(
                    name=f"{name}_msgs_per_s",
                    value=value,
                    unit="msg/s",
                    baseline=plain,
                    baseline_name="plain confluent-kafka consumer",
                    target=Target(">=", 0.5),
                )
            )
            result.add(
                Metric(
                    name=f"{name}_vs_equal_work",
                    value=value,
                    unit="msg/s",
                    baseline=decoding,
                    baseline_name="plain consumer making the same rows, one process",
                )
            )


def _batch(spark: Any, read: Any, source: Any, topic: str, namespaces: dict[str, str]) -> int:
    from pyspark.sql import functions as F

    frame = read(spark, [source], topic, namespaces=namespaces, streaming=False)
    row = frame.agg(F.count("*").alias("n"), F.sum(F.length("payload")).alias("chars")).first()
    return int(row["n"])


def _stream(
    spark: Any, read: Any, source: Any, namespaces: dict[str, str], count: int, ctx: Context
) -> tuple[float, float]:
    """(seconds of the micro-batches, seconds from start to termination)."""
    checkpoint = str(ctx.workdir / f"spark-checkpoint-{uuid.uuid4().hex[:8]}")
    frame = read(spark, [source], "p:valves//.", namespaces=namespaces, streaming=True)
    started = time.perf_counter()
    query = (
        frame.writeStream.format("noop")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(600)
    elapsed = time.perf_counter() - started
    progress = query.recentProgress
    rows = sum(p["numInputRows"] for p in progress)
    if rows != count:
        raise RuntimeError(f"the streaming query read {rows} of {count} notifications")
    batches = sum(p["durationMs"].get("triggerExecution", 0) for p in progress) / 1000
    return batches, elapsed
