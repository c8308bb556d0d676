"""The bridge's Python API: federated reads across brokers and middlewares, and writing rows
back as notifications.

``read_notifications(spark, sources=[...], topic=..., streaming=...)`` returns one
DataFrame in the bridge's schema (``schema``), the union of one source per broker:

>>> df = read_notifications(
...     spark,
...     [kafka("kafka://k1:9092", alias="plant-kafka"),
...      rabbitmq("amqp://guest:guest@r1:5672/%2F", alias="plant-rabbit"),
...      log("/var/lib/wsnmom/mqtt.log", alias="plant-mqtt")],
...     topic="p:valves//state", namespaces={"p": "urn:example:plant"},
...     streaming=True, checkpoint="/data/checkpoints/valves")

A streaming query over it checkpoints every source's offsets together.  A batch read
(``streaming=False``) reads a snapshot: the ranges are fixed, and logged, when
``read_notifications`` is called.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .options import BridgeError, SourceError, lower_keys
from .reader import log
from .selection import Selection

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.readwriter import DataStreamWriter

__all__ = [
    "Source",
    "kafka",
    "log_file",
    "plan_batch",
    "rabbitmq",
    "read_notifications",
    "write_notifications",
]

_FORMATS = {"kafka": "wsn_kafka", "rabbitmq": "wsn_rabbitmq", "log": "wsn_log"}


@dataclass(frozen=True)
class Source:
    """One broker (or buffer log) of a read: its kind, alias and options (as for its
    data source; the selection options come from ``read_notifications``)."""

    kind: str
    alias: str
    options: Mapping[str, str] = field(default_factory=dict)

    @property
    def format(self) -> str:
        return _FORMATS[self.kind]

    def all_options(self, selection: Selection) -> dict[str, str]:
        """The data source options: the selection's, then this source's, its alias."""
        return {
            **selection.to_options(),
            **{k: str(v) for k, v in self.options.items()},
            "alias": self.alias,
        }


def _options(options: Mapping[str, Any]) -> dict[str, str]:
    return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in options.items()}


def kafka(url: str, alias: str | None = None, **options: Any) -> Source:
    """A Kafka cluster behind a gateway (``url``: the adapter's ``kafka://`` URL)."""
    return Source("kafka", alias or url.removeprefix("kafka://"), {"url": url, **_options(options)})


def rabbitmq(url: str, alias: str | None = None, **options: Any) -> Source:
    """A RabbitMQ broker behind a gateway, read through a tap stream queue."""
    from urllib.parse import urlsplit

    return Source(
        "rabbitmq", alias or urlsplit(url).hostname or "rabbitmq", {"url": url, **_options(options)}
    )


def log_file(path: str, alias: str | None = None, **options: Any) -> Source:
    """A notification log written by a buffer (``wsnmom spark-buffer`` for MQTT)."""
    from pathlib import Path

    return Source("log", alias or Path(path).stem, {"path": path, **_options(options)})


def _backend(source: Source, selection: Selection) -> Any:
    from .kafka_source import KafkaBackend
    from .log_source import LogBackend
    from .rabbitmq_tap import RabbitMQBackend

    options = lower_keys(source.all_options(selection))
    if source.kind == "kafka":
        return KafkaBackend(options)
    if source.kind == "rabbitmq":
        return RabbitMQBackend(options)
    return LogBackend(options)


def plan_batch(
    sources: Sequence[Source], selection: Selection
) -> dict[str, dict[str, tuple[int, int]]]:
    """``{alias: {stream: (start, end)}}``: what a batch read of ``sources`` reads now
    (``startingOffsets``/``endingOffsets`` of a source narrow its ranges)."""
    from .reader import BatchReader

    plan: dict[str, dict[str, tuple[int, int]]] = {}
    for source in sources:
        backend = _backend(source, selection)
        reader = BatchReader(backend)
        try:
            start, end = reader.snapshot()
            plan[source.alias] = {s: (start.get(s, e), e) for s, e in end.items()}
        finally:
            backend.close()
    return plan


def _check(sources: Sequence[Source]) -> None:
    if not sources:
        raise BridgeError("read_notifications needs at least one source")
    seen: set[str] = set()
    for source in sources:
        if source.kind not in _FORMATS:
            raise BridgeError(f"unknown source kind {source.kind!r}")
        if source.alias in seen:
            raise BridgeError(f"two sources are called {source.alias!r}: aliases must differ")
        seen.add(source.alias)


def read_notifications(
    spark: SparkSession,
    sources: Sequence[Source],
    topic: str | None = None,
    *,
    namespaces: Mapping[str, str] | None = None,
    dialect: str | None = None,
    message_content: str | None = None,
    message_content_namespaces: Mapping[str, str] | None = None,
    topic_namespaces: Sequence[str] = (),
    streaming: bool = True,
    checkpoint: str | None = None,
    connector: str = "auto",
) -> DataFrame:
    """One DataFrame of the notifications selected by ``topic`` (a WS-Topics expression in
    ``dialect``, prefixes from ``namespaces``; None: every topic) and ``message_content``
    (an XPath 1.0 filter over the payload) on every source.

    ``streaming``: a streaming DataFrame (offsets checkpointed by the query), else a batch
    read of a snapshot.  ``checkpoint``: the query's checkpoint location, to record and
    check the implementation of each source (see ``native_kafka``).  ``connector``:
    ``auto`` (Spark's Kafka connector when its jar is on the classpath, else the Python
    source), ``python`` or ``native``.
    """
    from .session import register

    _check(sources)
    if connector not in ("auto", "python", "native"):
        raise BridgeError(f"connector must be auto, python or native, not {connector!r}")
    selection = Selection(
        topic=topic,
        dialect=dialect,
        namespaces=dict(namespaces or {}),
        topic_namespaces=tuple(topic_namespaces),
        message_content=message_content,
        message_content_namespaces=dict(message_content_namespaces or {}),
    )
    selection.compile()  # fails here, naming the expression, rather than in a task
    register(spark)
    native = _use_native_kafka(spark, sources, connector)
    chosen = {
        s.alias: ("spark-sql-kafka" if native and s.kind == "kafka" else s.format) for s in sources
    }
    if checkpoint is not None and streaming:
        from .native_kafka import pin_implementations

        pin_implementations(checkpoint, chosen)
    plan = plan_batch(sources, selection) if not streaming else {}
    cores = _parallelism(spark)
    frames = [
        _frame(spark, source, selection, plan, cores=cores, native=native, streaming=streaming)
        for source in sources
    ]
    result = frames[0]
    for frame in frames[1:]:
        result = result.unionByName(frame)
    return result


def _use_native_kafka(spark: SparkSession, sources: Sequence[Source], connector: str) -> bool:
    """Whether the Kafka sources are read by Spark's own Kafka connector."""
    from .native_kafka import native_kafka_available, package_hint

    if not any(s.kind == "kafka" for s in sources) or connector == "python":
        return False
    native = native_kafka_available(spark)
    if connector == "native" and not native:
        raise BridgeError(
            "Spark's Kafka connector is not on the classpath: start Spark with "
            f"--packages {package_hint(spark)} (or --jars), or use connector='python'"
        )
    log.info(
        "Kafka sources read with %s",
        "Spark's Kafka connector" if native else "the bridge's Python source (wsn_kafka)",
    )
    return native


def _frame(
    spark: SparkSession,
    source: Source,
    selection: Selection,
    plan: Mapping[str, Any],
    *,
    cores: int,
    native: bool,
    streaming: bool,
) -> DataFrame:
    """The DataFrame of one source: a batch over its planned ranges, or a stream."""
    from .native_kafka import native_kafka_frame

    options = source.all_options(selection)
    if cores > 1 and not any(k.lower() == "minpartitions" for k in options):
        # enough tasks for every core (ranges of 10,000 offsets and more only)
        options["minPartitions"] = str(cores)
    if not streaming:
        ranges = plan[source.alias]
        options["startingOffsets"] = _json({s: a for s, (a, _) in ranges.items()})
        options["endingOffsets"] = _json({s: b for s, (_, b) in ranges.items()})
        log.info(
            "%s source %r: reading %s",
            source.kind,
            source.alias,
            ", ".join(f"{s} {a}..{b}" for s, (a, b) in sorted(ranges.items())) or "nothing",
        )
    else:
        log.info("%s source %r: streaming %s", source.kind, source.alias, selection.describe())
    if native and source.kind == "kafka":
        return native_kafka_frame(spark, options, streaming)
    reader: Any = spark.readStream if streaming else spark.read
    frame: DataFrame = reader.format(source.format).options(**options).load()
    return frame


def _parallelism(spark: SparkSession) -> int:
    """Spark's default parallelism (the cores of a local session), 1 when unknown (Spark
    Connect)."""
    try:
        return int(spark.sparkContext.defaultParallelism)
    except Exception:
        return 1


def _json(value: Mapping[str, int]) -> str:
    import json

    return json.dumps(dict(value), sort_keys=True)


def write_notifications(
    frame: DataFrame,
    target: str,
    *,
    topic: str | None = None,
    namespaces: Mapping[str, str] | None = None,
    checkpoint: str | None = None,
    ledger: str | None = None,
    sink_id: str = "wsn_notify",
    write_id: str | None = None,
    output_mode: str = "append",
    **options: Any,
) -> DataStreamWriter | None:
    """Publish ``frame``'s rows (columns ``payload`` and optionally ``topic``) as
    notifications to ``target`` (a middleware URL or a gateway's broker URL).

    A batch frame is written at once (``write_id`` makes a rerun publish nothing twice;
    the ledger defaults to none).  A streaming frame returns the configured
    ``DataStreamWriter`` (call ``.start()``); its ledger defaults to a file in a local
    ``checkpoint`` directory.  ``output_mode`` ``append`` uses the ``wsn_notify``
    streaming sink; ``update`` and ``complete`` (aggregations) write each micro-batch
    with the batch writer from ``foreachBatch``, its batch id as the write id, so a
    replayed micro-batch publishes nothing twice either way.
    """
    from .session import register

    register(frame.sparkSession)
    opts: dict[str, str] = {"target": target, "sinkId": sink_id, **_options(options)}
    if topic is not None:
        opts["topic"] = topic
    if namespaces:
        import json

        opts["namespaces"] = json.dumps(dict(namespaces))
    if write_id is not None:
        opts["writeId"] = write_id
    if not frame.isStreaming:
        if ledger is not None:
            opts["ledger"] = ledger
        frame.write.format("wsn_notify").options(**opts).mode("append").save()
        return None
    if output_mode not in ("append", "update", "complete"):
        raise BridgeError(f"output_mode must be append, update or complete, not {output_mode!r}")
    if ledger is None and checkpoint is not None and "://" not in checkpoint:
        from pathlib import Path

        ledger = str(Path(checkpoint.removeprefix("file:")) / "wsnmom-sink-ledger.sqlite")
    if ledger is None:
        raise SourceError(
            f"wsn_notify sink {sink_id!r}",
            "a streaming write needs a ledger (or a local checkpoint to keep it in)",
        )
    opts["ledger"] = ledger
    if output_mode == "append":
        writer = frame.writeStream.format("wsn_notify").options(**opts)
    else:

        def publish(batch: DataFrame, batch_id: int) -> None:
            batch.write.format("wsn_notify").options(**{**opts, "writeId": str(batch_id)}).mode(
                "append"
            ).save()

        writer = frame.writeStream.foreachBatch(publish)
    writer = writer.outputMode(output_mode)
    if checkpoint is not None:
        writer = writer.option("checkpointLocation", checkpoint)
    return writer
