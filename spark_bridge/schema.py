"""The one output schema of every source of the bridge, and turning middleware records into
rows of it (as Arrow record batches, the fast way from Python into Spark).

Columns (documented in ``docs/spark.md``):

==================  ==========================  ===============================================
column              type                        meaning
==================  ==========================  ===============================================
source              string, not null            the alias the job gave the broker / buffer
middleware          string, not null            ``kafka``, ``rabbitmq``, ``log`` (buffer logs)
stream              string, not null            where ``offset`` counts: Kafka ``topic/partition``,
                                                the RabbitMQ stream queue, the log's name
offset              long, not null              position in ``stream`` (Kafka offset, stream
                                                offset, log sequence number)
topic_namespace     string                      the notification's topic namespace (null:
                                                published without a topic)
topic_path          string                      its topic path, ``a/b/c``
topic               string                      both in Clark notation, ``{urn:x}a/b/c``
message_id          string, not null            ``wsnmom-message-id``; natively published
                                                messages get ``source/stream/offset``
producer            string                      the producer reference's address
payload             string, not null            the notification's XML payload (a
                                                ``wsnmom:NativeMessage`` wrapper for non-XML)
body                binary, not null            the bytes as they are on the middleware
content_type        string, not null            the body's media type
headers             map<string,string>          every header / user property / record header
timestamp           timestamp                   ``wsnmom-published-at``, else the middleware's
==================  ==========================  ===============================================

The decoding is core's (``wsnmom.core.codec.decode``) and the filter is the subscription
filter the gateway applies, so a row exists exactly when a WS-N subscriber with the same
filter would have received the notification.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

from wsnmom.adapters.logbase.public import LogRecord
from wsnmom.core.adapter import HEADER_MESSAGE_ID
from wsnmom.core.codec import decode, is_internal_routing
from wsnmom.core.filters import CompiledFilter
from wsnmom.topic_mapping.model import Topic

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

__all__ = ["COLUMNS", "DDL", "RowBuilder", "TopicVerdicts", "arrow_schema", "spark_schema"]

#: (name, Spark SQL type, nullable), in column order
COLUMNS: tuple[tuple[str, str, bool], ...] = (
    ("source", "STRING", False),
    ("middleware", "STRING", False),
    ("stream", "STRING", False),
    ("offset", "BIGINT", False),
    ("topic_namespace", "STRING", True),
    ("topic_path", "STRING", True),
    ("topic", "STRING", True),
    ("message_id", "STRING", False),
    ("producer", "STRING", True),
    ("payload", "STRING", False),
    ("body", "BINARY", False),
    ("content_type", "STRING", False),
    ("headers", "MAP<STRING,STRING>", True),
    ("timestamp", "TIMESTAMP", True),
)

#: the schema as a DDL string (``DataSource.schema()``)
DDL = ", ".join(f"`{name}` {kind}" + ("" if null else " NOT NULL") for name, kind, null in COLUMNS)


def spark_schema() -> StructType:
    """The schema as a Spark ``StructType``."""
    from pyspark.sql.types import StructType

    schema = StructType.fromDDL(DDL)
    assert isinstance(schema, StructType)
    return schema


def arrow_schema() -> pa.Schema:
    """The schema as an Arrow schema (what ``read()`` yields)."""
    import pyarrow as pa

    kinds = {
        "STRING": pa.string(),
        "BIGINT": pa.int64(),
        "BINARY": pa.binary(),
        "MAP<STRING,STRING>": pa.map_(pa.string(), pa.string()),
        "TIMESTAMP": pa.timestamp("us", tz="UTC"),
    }
    return pa.schema([pa.field(n, kinds[k], nullable=null) for n, k, null in COLUMNS])


#: a topic's columns (namespace, path, Clark notation) and whether the topic filter accepts it
Verdict = tuple[str, str, str, bool]


class TopicVerdicts:
    """The topic filter's verdict and the names of each topic, worked out once per topic."""

    def __init__(self, selection: CompiledFilter) -> None:
        self.expression = selection.topic
        self._known: dict[Topic, Verdict] = {}

    def of(self, topic: Topic) -> Verdict:
        """``(namespace, path, Clark notation, accepted)`` of ``topic``."""
        found = self._known.get(topic)
        if found is None:
            expression = self.expression
            accepted = expression is None or expression.matches(topic)
            found = (topic.namespace, "/".join(topic.path), str(topic), accepted)
            if len(self._known) > 10_000:
                self._known.clear()
            self._known[topic] = found
        return found


class RowBuilder:
    """Collects the rows of accepted records and hands them out as Arrow record batches of
    at most ``batch_rows`` rows."""

    def __init__(
        self,
        source: str,
        middleware: str,
        selection: CompiledFilter,
        batch_rows: int = 8192,
        *,
        include_headers: bool = True,
    ) -> None:
        import pyarrow as pa

        self._pa = pa
        self.source = source
        self.middleware = middleware
        self.filter = selection
        self.batch_rows = batch_rows
        self.include_headers = include_headers
        self.schema = arrow_schema()
        self.accepted = 0
        self.dropped = 0
        self._rows: list[tuple[Any, ...]] = []
        self._topics = TopicVerdicts(selection)

    def values(self, record: LogRecord, stream: str) -> tuple[Any, ...] | None:
        """The row of ``record`` (on ``stream``) in column order (headers as a list of
        pairs), or None when the filter refuses it: the gateway's decision for a
        subscription with this filter (internal traffic never, then the topic filter,
        then MessageContent)."""
        if is_internal_routing(record):
            return None
        message = decode(record)
        topic = message.topic
        if topic is None:
            if self.filter.topic is not None:
                return None
            names: tuple[str | None, str | None, str | None] = (None, None, None)
        else:
            namespace, path, clark, accepted = self._topics.of(topic)
            if not accepted:
                return None
            names = (namespace, path, clark)
        content = self.filter.content
        if content is not None and not content.matches(message.payload):
            return None
        headers = record.headers
        message_id = headers.get(HEADER_MESSAGE_ID) or f"{self.source}/{stream}/{record.offset}"
        producer = message.producer_reference
        stamp: datetime | None = message.published_at or record.timestamp
        return (
            self.source,
            self.middleware,
            stream,
            record.offset,
            *names,
            message_id,
            producer.address if producer is not None else None,
            message.payload.decode("utf-8", "replace"),
            record.body,
            record.content_type,
            list(headers.items()) if self.include_headers else None,
            stamp,
        )

    def add(self, record: LogRecord, stream: str) -> bool:
        """Decode ``record`` (on ``stream``) and keep it if the filter accepts it."""
        row = self.values(record, stream)
        if row is None:
            self.dropped += 1
            return False
        self._rows.append(row)
        self.accepted += 1
        return True

    @property
    def pending(self) -> int:
        """Rows collected and not yet handed out."""
        return len(self._rows)

    def take(self) -> pa.RecordBatch:
        """The collected rows as one record batch (and forget them)."""
        pa = self._pa
        rows, self._rows = self._rows, []
        columns = list(zip(*rows, strict=True)) if rows else [() for _ in COLUMNS]
        arrays = [
            pa.array(column, type=field.type)
            for column, field in zip(columns, self.schema, strict=True)
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def batches(self, records: Iterator[tuple[LogRecord, str]]) -> Iterator[pa.RecordBatch]:
        """Record batches of the accepted ``(record, stream)`` pairs."""
        for record, stream in records:
            self.add(record, stream)
            if len(self._rows) >= self.batch_rows:
                yield self.take()
        if self._rows:
            yield self.take()
