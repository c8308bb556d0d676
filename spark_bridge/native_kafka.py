"""Spark's own Kafka connector (``spark-sql-kafka``), preferred when its jar is on the
classpath.

The JVM connector reads Kafka at JVM speed, with consumer pooling, SASL/Kerberos delegation
tokens and ``minPartitions`` splitting; pip's pyspark does not ship it (add it with
``--packages org.apache.spark:spark-sql-kafka-0-10_2.13:<spark version>``).  The bridge
detects it by looking its provider class up on the JVM.  With it, ``format("kafka")``
reads the Kafka topics that may carry the selected WS topics (``subscribePattern``) and the
records are turned into the bridge's schema in Python by the same column-wise conversion
as ``wsn_kafka`` (``kafka_rows``, in a scalar Arrow UDF), so both give the same rows.

The two write different offsets into a checkpoint.  ``read_notifications`` therefore
records the implementation of each source next to the checkpoint and refuses to switch
(see :func:`pin_implementations`), and ``wsn_kafka`` refuses offsets it did not write.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .options import BridgeError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from wsnmom.adapters.kafka.public import KafkaMapping
    from wsnmom.topic_mapping.model import PathPattern

__all__ = [
    "KAFKA_PACKAGE",
    "KAFKA_PROVIDER",
    "convert_records",
    "jvm_class_available",
    "native_kafka_available",
    "native_kafka_frame",
    "native_rows",
    "pin_implementations",
    "topic_regex",
]

#: the provider class of Spark's Kafka connector
KAFKA_PROVIDER = "org.apache.spark.sql.kafka010.KafkaSourceProvider"
#: the Maven coordinates to add it (Spark 4 is built for Scala 2.13 only)
KAFKA_PACKAGE = "org.apache.spark:spark-sql-kafka-0-10_2.13:{version}"
#: the file next to a checkpoint that records each source's implementation
PIN_FILE = "wsnmom-sources.json"


def jvm_class_available(spark: SparkSession, name: str) -> bool:
    """Whether the driver JVM can load class ``name`` (False without a JVM, e.g. Spark
    Connect)."""
    jvm = getattr(spark, "_jvm", None) or getattr(spark.sparkContext, "_jvm", None)
    if jvm is None:
        return False
    try:
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName(name, False, loader)
    except Exception:
        return False
    return True


def native_kafka_available(spark: SparkSession) -> bool:
    """Whether Spark's Kafka connector is on the classpath."""
    return jvm_class_available(spark, KAFKA_PROVIDER)


def package_hint(spark: SparkSession) -> str:
    """The ``--packages`` argument that adds the connector for this Spark version."""
    return KAFKA_PACKAGE.format(version=spark.version)


def topic_regex(mapping: KafkaMapping, patterns: tuple[PathPattern, ...] | None) -> str:
    """A Java regular expression over Kafka topic names that matches every topic that may
    carry a notification selected by ``patterns`` (None: every followed topic).  Wider is
    harmless (records are filtered again); it must never be narrower."""
    from wsnmom.topic_mapping.syntax import KAFKA
    from wsnmom.topic_mapping.translate import translate

    prefix = re.escape(mapping.prefix + ".") if mapping.prefix else ""
    if patterns is None:
        followed = f"{prefix}.*" if prefix else "[^_].*"
        internal = mapping.internal_topic
        shared = [re.escape(name) for name in mapping.shared_logs() if name != internal]
        return "^(" + "|".join([followed, *shared]) + ")$"
    parts: list[str] = []
    for pattern in patterns:
        shared_log = mapping.shared_log(pattern.namespace)
        if shared_log is not None:
            parts.append(re.escape(shared_log))
            continue
        mapping.register(pattern.namespace)
        for native in translate([pattern], KAFKA, mapping.roots).patterns:
            inner = native.pattern.removeprefix("^").removesuffix("$")
            parts.append(prefix + inner)
    return "^(" + "|".join(dict.fromkeys(parts)) + ")$"


_converters: dict[str, Any] = {}


def _converter(options: Mapping[str, str]) -> Any:
    """The per-process (backend, row converter) of a source's options."""
    key = json.dumps(dict(options), sort_keys=True)
    found = _converters.get(key)
    if found is None:
        from .kafka_rows import KafkaRows
        from .kafka_source import KafkaBackend
        from .selection import Compiled, Selection

        backend = KafkaBackend(options)
        selection = Compiled(Selection.from_options(options)).filter
        rows = KafkaRows(
            backend.alias,
            backend.mapping,
            selection,
            verify_payloads=backend.verify_payloads,
            include_headers=backend.include_headers,
        )
        found = (backend, rows)
        _converters[key] = found
    return found


def convert_records(options: Mapping[str, str], records: pa.StructArray) -> pa.StructArray:
    """The bridge's rows of records of Spark's Kafka source (a struct array of its columns
    ``key``, ``value``, ``topic``, ``partition``, ``offset``, ``timestamp``, ``headers``):
    one row per record, null where the selection refuses it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    backend, rows = _converter(options)
    batch = pa.RecordBatch.from_struct_array(records)
    streams = pc.binary_join_element_wise(
        batch.column("topic"), batch.column("partition").cast(pa.string()), "/"
    )
    kinds = streams.unique()
    converted: list[pa.RecordBatch] = []
    index: Any = None
    base = 0
    for stream in kinds.to_pylist():
        log_name, _, number = stream.rpartition("/")
        if not backend.mapping.may_carry(log_name, backend.patterns):
            continue
        positions = None
        part = batch
        if len(kinds) > 1:
            positions = pc.indices_nonzero(pc.equal(streams, stream))
            part = batch.take(positions)
        millis = pc.divide(part.column("timestamp").cast(pa.int64()), 1000)
        headers = [
            [(h["key"], h["value"]) for h in listed] if listed else None
            for listed in part.column("headers").to_pylist()
        ]
        rows_of = rows.convert(
            log_name,
            int(number),
            part.column("offset").to_pylist(),
            part.column("key").to_pylist(),
            part.column("value").to_pylist(),
            millis,
            headers,
        )
        # where each record's row is: offsets are unique within a Kafka partition
        found = pc.index_in(part.column("offset"), value_set=rows_of.column("offset"))
        if positions is None:
            index = found
        else:
            if index is None:
                index = [None] * len(batch)
            for position, row in zip(positions.to_pylist(), found.to_pylist(), strict=True):
                if row is not None:
                    index[position] = base + row
        converted.append(rows_of)
        base += rows_of.num_rows
    kind = pa.struct(list(rows.schema))
    if index is None or base == 0:
        return pa.nulls(len(batch), kind)
    everything = pa.Table.from_batches(converted).to_struct_array().combine_chunks()
    chosen = index if isinstance(index, pa.Array) else pa.array(index, pa.int64())
    return everything.take(chosen)


def native_rows(frame: DataFrame, options: Mapping[str, str]) -> DataFrame:
    """``frame`` (rows of Spark's Kafka source, with ``includeHeaders``) in the bridge's
    schema: the same mapping, decoding and filter as ``wsn_kafka`` with ``options``, by the
    same column-wise conversion (``kafka_rows``, in a scalar Arrow UDF: no pandas)."""
    import pyarrow as pa
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.functions import arrow_udf

    from .kafka_rows import collector_paused
    from .options import lower_keys
    from .schema import spark_schema

    opts = lower_keys(options)
    columns = ["key", "value", "topic", "partition", "offset", "timestamp", "headers"]

    def convert(records: Any) -> Any:
        with collector_paused():
            return convert_records(opts, records)

    # the hints tell Spark the kind of Arrow UDF: array in, array out (scalar)
    convert.__annotations__ = {"records": pa.Array, "return": pa.Array}
    # nondeterministic: evaluated once per record, not again for the filter below
    make_udf: Any = arrow_udf  # its overloads want the hints statically
    udf = make_udf(convert, spark_schema()).asNondeterministic()
    converted = frame.select(udf(F.struct(*columns)).alias("row"))
    return converted.where(F.col("row").isNotNull()).select("row.*")


def native_kafka_frame(
    spark: SparkSession, options: Mapping[str, str], streaming: bool
) -> DataFrame:
    """Read a ``wsn_kafka`` source's selection with Spark's Kafka connector."""
    from .kafka_source import KafkaBackend
    from .options import lower_keys

    opts = lower_keys(options)
    backend = KafkaBackend(opts)
    reader: Any = spark.readStream if streaming else spark.read
    reader = (
        reader.format("kafka")
        .option("kafka.bootstrap.servers", backend.settings.bootstrap)
        .option("subscribePattern", topic_regex(backend.mapping, backend.patterns))
        .option("includeHeaders", "true")
        .option("failOnDataLoss", opts.get("failondataloss", "true"))
    )
    for key, value in backend.settings.client_config.items():
        reader = reader.option(f"kafka.{key}", value)
    starting = opts.get("startingoffsets")
    if starting in ("earliest", "latest"):
        reader = reader.option("startingOffsets", starting)
    elif starting is None:
        reader = reader.option("startingOffsets", "earliest")
    if streaming and opts.get("maxrecordspertrigger"):
        reader = reader.option("maxOffsetsPerTrigger", opts["maxrecordspertrigger"])
    return native_rows(reader.load(), opts)


def pin_implementations(checkpoint: str, chosen: Mapping[str, str]) -> None:
    """Record ``{source alias: implementation}`` next to a checkpoint, or refuse when the
    checkpoint was written with other implementations (their offsets differ).  Only local
    checkpoint paths (no URL scheme, or ``file:``) can be checked."""
    if "://" in checkpoint and not checkpoint.startswith("file:"):
        return
    path = Path(checkpoint.removeprefix("file://").removeprefix("file:")) / PIN_FILE
    if path.exists():
        recorded = json.loads(path.read_text())
        changed = {
            alias: (recorded[alias], impl)
            for alias, impl in chosen.items()
            if alias in recorded and recorded[alias] != impl
        }
        if changed:
            details = ", ".join(f"{a}: {old} -> {new}" for a, (old, new) in changed.items())
            raise BridgeError(
                f"the checkpoint {checkpoint} was written by other source implementations "
                f"({details}); their offsets are not compatible: keep the implementation "
                "(connector=...) or start with a new checkpoint location"
            )
        recorded.update(chosen)
    else:
        recorded = dict(chosen)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(recorded, indent=1, sort_keys=True))
