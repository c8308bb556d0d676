"""The measurements of scenario 7 (``bench.scenarios.spark``): publishing the notifications,
the plain and the equal-work consumers, and the Spark queries (batch, streaming, and a
Python source handing over prepared batches).

Each function returns seconds; the scenario turns them into rates."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from pathlib import Path
from typing import Any

NAMESPACE = "urn:wsnmom:bench:spark"
#: WS topics, i.e. Kafka topics (one partition each, the adapter's default)
TOPICS = 4
#: messages per Notify: the messages of one Notify share their publication time
NOTIFY_SIZE = 10
SELECT_ALL = "p:valves//."
NAMESPACES = {"p": NAMESPACE}


def publish(url: str, count: int) -> list[str]:
    """Publish ``count`` notifications as the gateway does (``core.codec`` headers, XML
    payloads, the Kafka adapter's ``publish_many``), round robin over the WS topics;
    returns the Kafka topics."""
    from datetime import UTC, datetime

    from wsnmom.adapters.kafka.adapter import KafkaAdapter
    from wsnmom.core.codec import encode
    from wsnmom.core.model import NotificationMessage
    from wsnmom.topic_mapping.model import Topic

    adapter = KafkaAdapter(url, {})
    adapter.open()
    topics = [Topic(NAMESPACE, ("valves", f"v{i}", "state")) for i in range(TOPICS)]
    try:
        batch = []
        now = datetime.now(UTC)
        for i in range(count):
            if i % NOTIFY_SIZE == 0:
                now = datetime.now(UTC)
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
        return [adapter.mapping.destination(t).log for t in topics]
    finally:
        adapter.close()


def _rows(url: str) -> Any:
    from wsnmom.adapters.kafka.config import parse_settings
    from wsnmom.adapters.kafka.mapping import KafkaMapping
    from wsnmom.spark_bridge.kafka_rows import KafkaRows
    from wsnmom.spark_bridge.selection import Selection

    mapping = KafkaMapping(parse_settings(url))
    mapping.register(NAMESPACE)
    return KafkaRows("bench", mapping, Selection(SELECT_ALL, None, NAMESPACES).compile())


def consume(
    bootstrap: str, logs: list[str], count: int, rows_of: str | None = None
) -> tuple[float, Any]:
    """Seconds a plain consumer takes to read ``count`` records of ``logs`` (assigned to
    every partition from offset 0, ``consume(1000)``, touching every value).  With
    ``rows_of`` (the adapter URL) it also makes the bridge's rows of them, as a task of the
    Kafka source does (``KafkaRows``, batches of 4,096 records of one partition); then the
    first batch is returned too."""
    from confluent_kafka import Consumer, TopicPartition

    rows: Any = _rows(rows_of) if rows_of is not None else None
    pending: dict[Any, list[Any]] = {}
    first: Any = None
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
    paused: Any = contextlib.nullcontext()
    if rows is not None:
        from wsnmom.spark_bridge.kafka_rows import collector_paused

        paused = collector_paused()
    started = time.perf_counter()
    consumer.assign(parts)
    seen = 0
    deadline = time.monotonic() + 300
    with paused:
        while seen < count and time.monotonic() < deadline:
            for message in consumer.consume(1000, 0.5):
                if message.error() is not None:
                    continue
                seen += 1
                if rows is None:
                    message.value()
                    continue
                key = (message.topic(), message.partition())
                chunk = pending.setdefault(key, [])
                chunk.append(message)
                if len(chunk) >= 4096:
                    batch = rows.from_messages(key[0], key[1], chunk)
                    first = batch if first is None else first
                    pending[key] = []
        for (log, partition), chunk in pending.items():
            if chunk:
                batch = rows.from_messages(log, partition, chunk)
                first = batch if first is None else first
    elapsed = time.perf_counter() - started
    consumer.close()
    if seen < count:
        raise RuntimeError(f"the plain consumer read {seen} of {count} records")
    if rows is not None and rows.accepted != seen:
        raise RuntimeError(f"the equal-work consumer made {rows.accepted} rows of {seen}")
    return elapsed, first


def batch_query(spark: Any, source: Any, topic: str = SELECT_ALL) -> tuple[float, int]:
    """Seconds of a batch read of ``topic`` and an aggregate over the payloads (every row
    decoded, filtered and handed to the JVM), from planning to result; and the rows."""
    from pyspark.sql import functions as F
    from wsnmom.spark_bridge import read_notifications

    started = time.perf_counter()
    frame = read_notifications(spark, [source], topic, namespaces=NAMESPACES, streaming=False)
    row = frame.agg(F.count("*").alias("n"), F.sum(F.length("payload")).alias("chars")).first()
    return time.perf_counter() - started, int(row["n"])


def stream_query(spark: Any, source: Any, workdir: Path) -> tuple[float, float, int]:
    """A streaming read of everything into Spark's ``noop`` sink with
    ``Trigger.AvailableNow``: (seconds of its micro-batches, the sum of their
    ``triggerExecution``; seconds from start to termination; rows)."""
    from wsnmom.spark_bridge import read_notifications

    checkpoint = str(workdir / f"spark-checkpoint-{uuid.uuid4().hex[:8]}")
    frame = read_notifications(spark, [source], SELECT_ALL, namespaces=NAMESPACES, streaming=True)
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
    batches = sum(p["durationMs"].get("triggerExecution", 0) for p in progress) / 1000
    return batches, elapsed, rows


def prepared_query(spark: Any, batch: Any, count: int, tasks: int = TOPICS) -> float:
    """Seconds Spark takes to read ``count`` rows of the bridge's schema that a Python
    data source hands over ready-made (``batch``, one real batch of the Kafka source,
    repeated), in ``tasks`` tasks, with the batch query's aggregate: what Spark itself
    costs per row, without Kafka and without the conversion."""
    import pyarrow as pa
    from pyspark.sql import functions as F
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
    from wsnmom.spark_bridge.schema import DDL

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    ipc = sink.getvalue().to_pybytes()

    # defined here, so that Spark ships them by value to its Python workers
    class Part(InputPartition):
        def __init__(self, rows: int) -> None:
            self.rows = rows

    class Reader(DataSourceReader):
        def partitions(self) -> list[Part]:
            share, extra = divmod(count, tasks)
            return [Part(share + (1 if i < extra else 0)) for i in range(tasks)]

        def read(self, partition: InputPartition) -> Any:
            import pyarrow as pa

            assert isinstance(partition, Part)
            ready = pa.ipc.open_stream(ipc).read_next_batch()
            left = partition.rows
            while left > 0:
                size = min(left, ready.num_rows)
                yield ready if size == ready.num_rows else ready.slice(0, size)
                left -= size

    class Prepared(DataSource):
        @classmethod
        def name(cls) -> str:
            return "wsnmom_bench_prepared"

        def schema(self) -> str:
            return str(DDL)

        def reader(self, schema: Any) -> Reader:
            return Reader()

    spark.dataSource.register(Prepared)
    started = time.perf_counter()
    frame = spark.read.format("wsnmom_bench_prepared").load()
    row = frame.agg(F.count("*").alias("n"), F.sum(F.length("payload")).alias("chars")).first()
    elapsed = time.perf_counter() - started
    if int(row["n"]) != count:
        raise RuntimeError(f"the prepared source gave {row['n']} of {count} rows")
    return elapsed


_TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state is [0], ppid [1])."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def tree_cpu(root: int, exclude: frozenset[int] = frozenset()) -> float | None:
    """CPU seconds of process ``root`` and its live descendants (with the children they
    reaped), without the trees of ``exclude``; None where /proc cannot tell.  Parents come
    from every process's stat (``/proc/<pid>/task/*/children`` is missing on kernels built
    without CONFIG_PROC_CHILDREN)."""
    if _stat(root) is None:
        return None
    kids: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat(int(entry))) is not None:
            stats[int(entry)] = fields
            kids.setdefault(int(fields[1]), []).append(int(entry))
    total = 0.0
    todo = [root]
    while todo:
        pid = todo.pop()
        fields = stats.get(pid)
        if pid in exclude or fields is None:
            continue
        # utime, stime, cutime, cstime
        total += sum(int(x) for x in fields[11:15]) / _TICK
        todo.extend(kids.get(pid, ()))
    return total
