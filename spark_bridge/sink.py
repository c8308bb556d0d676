"""``wsn_notify``: a batch and streaming sink that publishes each row as a WS-N notification,
once per (batch, partition, row).

Where the notifications go (``target``)
    * a middleware URL (``amqp://…``, ``kafka://…``, any scheme an installed adapter
      serves): the rows are published through that adapter, exactly as the gateway
      publishes a Notify (``core.codec`` headers, the adapter's topic mapping), so every
      WS-N subscriber of a gateway on that middleware receives them;
    * a gateway's NotificationBroker URL (``http(s)://host:port/wsn/broker``): one Notify
      request per chunk of rows.

Rows
    ``payload`` (string or binary, required): the notification's XML payload element (with
    ``contentType`` other than XML: any body, published natively).  ``topic`` (string,
    optional): the topic expression of the row (a concrete topic), else the ``topic``
    option; neither: a notification without a topic.

Exactly once per row
    Executors only stage rows: each task returns its rows in its commit message.  The
    driver's ``commit`` publishes the batch's rows in a fixed order, in chunks of
    ``chunk`` rows, and records its progress in the ledger (``spark_bridge.ledger``) after
    every chunk; a replayed batch publishes only what the ledger does not count.  Each
    notification published through an adapter carries the message id
    ``<sinkId>/<batch>/<partition>/<row>``.  A batch (non-streaming) write uses the
    ``writeId`` option as its batch id: running the same write again publishes nothing
    twice.  The rows of one micro-batch pass through the driver's memory: the sink is meant
    for results (aggregates, alerts), not for copying bulk streams.

Options
    ``target``, ``adapterOptions`` (JSON), ``topic``, ``dialect``, ``namespaces`` (JSON or
    ``p=uri,...``), ``ledger`` (path; required for streaming writes), ``sinkId`` (default
    ``wsn_notify``; one per query and ledger), ``writeId`` (batch writes), ``chunk`` (200),
    ``contentType`` (``application/xml``), ``producer`` (a producer reference address),
    ``timeout`` (seconds per publish, 30).
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)

from .ledger import Ledger
from .options import SourceError, check_names, get_float, get_int, get_json, lower_keys, redact
from .selection import SelectionError, parse_mapping

if TYPE_CHECKING:
    from pyspark.sql import Row
    from pyspark.sql.types import StructType
    from wsnmom.core.adapter import Adapter
    from wsnmom.topic_mapping.model import Topic

__all__ = ["NotifySink", "Publisher", "StagedRows"]

log = logging.getLogger("wsnmom.spark_bridge.sink")

#: (row index, the row's topic expression or None for the sink's ``topic``, payload bytes)
Staged = tuple[int, str | None, bytes]


@dataclass
class StagedRows(WriterCommitMessage):
    """What one task hands to the driver: its partition and its rows."""

    partition: int
    rows: list[Staged] = field(default_factory=list)


#: the sink's options (docs/spark.md), and those Spark adds to a streaming write's: a
#: misspelt one (``write_id``) is refused rather than ignored (a rerun publishing again)
SINK_OPTIONS = (
    "target",
    "adapterOptions",
    "topic",
    "dialect",
    "namespaces",
    "ledger",
    "sinkId",
    "writeId",
    "chunk",
    "contentType",
    "producer",
    "timeout",
    "checkpointLocation",
    "queryName",
    "path",
)


@dataclass(frozen=True)
class SinkSettings:
    """A sink's options, parsed (picklable)."""

    target: str
    adapter_options: Mapping[str, Any]
    topic: str | None
    dialect: str | None
    namespaces: Mapping[str, str]
    ledger: str | None
    sink_id: str
    write_id: str | None
    chunk: int
    content_type: str
    producer: str | None
    timeout: float

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkSettings:
        check_names(options, SINK_OPTIONS, "the wsn_notify sink")
        target = options.get("target") or ""
        if not target:
            raise ValueError(
                "the wsn_notify sink needs the option target: a middleware URL "
                "(amqp://..., kafka://...) or a gateway's http(s)://.../wsn/broker"
            )
        adapter_options = get_json(options, "adapteroptions") or {}
        if not isinstance(adapter_options, dict):
            raise ValueError("option adapterOptions must be a JSON object")
        return cls(
            target=target,
            adapter_options=adapter_options,
            topic=options.get("topic") or None,
            dialect=options.get("dialect") or None,
            namespaces=parse_mapping(options.get("namespaces"), "namespaces"),
            ledger=options.get("ledger") or None,
            sink_id=options.get("sinkid") or "wsn_notify",
            write_id=options.get("writeid") or None,
            chunk=get_int(options, "chunk", 200, low=1) or 200,
            content_type=options.get("contenttype") or "application/xml",
            producer=options.get("producer") or None,
            timeout=get_float(options, "timeout", 30.0),
        )

    @property
    def is_gateway(self) -> bool:
        return self.target.startswith(("http://", "https://"))

    def where(self) -> str:
        return f"wsn_notify sink {self.sink_id!r} ({redact(self.target)})"


def _stage(settings: SinkSettings, rows: Iterator[Row]) -> StagedRows:
    """The rows of one task, validated (executor side)."""
    from pyspark import TaskContext
    from wsnmom.core.codec import is_xml_type, safe_parse

    context = TaskContext.get()
    partition = context.partitionId() if context is not None else 0
    xml = is_xml_type(settings.content_type)
    staged: list[Staged] = []
    for index, row in enumerate(rows):
        values = row.asDict()
        if "payload" not in values:
            raise SourceError(settings.where(), "the rows need a column payload")
        payload = values["payload"]
        if payload is None:
            raise SourceError(settings.where(), f"row {index} of partition {partition}: no payload")
        body = payload.encode("utf-8") if isinstance(payload, str) else bytes(payload)
        if xml:
            try:
                safe_parse(body)
            except Exception as exc:
                raise SourceError(
                    settings.where(),
                    f"row {index} of partition {partition}: the payload is not an XML element "
                    f"({exc}); set contentType to publish other bodies natively",
                ) from None
        topic = values.get("topic")
        staged.append((index, str(topic) if topic is not None else None, body))
    return StagedRows(partition, staged)


class Publisher:
    """Publishes staged rows to one target (driver side; cached per target)."""

    def __init__(self, settings: SinkSettings) -> None:
        self.settings = settings
        self._adapter: Adapter | None = None
        self._client: Any = None
        self._topics: dict[str, tuple[Topic, str]] = {}
        if settings.is_gateway:
            from wsnmom.client.broker import WsnClient

            self._client = WsnClient(
                settings.target, namespaces=dict(settings.namespaces), timeout=settings.timeout
            )
        else:
            from wsnmom.core.plugins import create_adapter

            adapter = create_adapter(settings.target, dict(settings.adapter_options))
            adapter.open()
            self._adapter = adapter

    def close(self) -> None:
        if self._adapter is not None:
            self._adapter.close()
            self._adapter = None
        if self._client is not None:
            self._client.close()
            self._client = None

    def _topic(self, text: str) -> tuple[Topic, str]:
        found = self._topics.get(text)
        if found is None:
            from wsnmom.core.errors import WsnError
            from wsnmom.core.filters import concrete_topic
            from wsnmom.core.model import ExpressionSource
            from wsnmom.topic_mapping.topic_set import TopicSet

            namespaces: dict[str | None, str] = {p: u for p, u in self.settings.namespaces.items()}
            dialect = self.settings.dialect
            from .selection import DIALECT_NAMES

            if dialect is not None:
                dialect = DIALECT_NAMES.get(dialect.lower(), dialect)
            try:
                found = concrete_topic(ExpressionSource(dialect, text, namespaces), TopicSet())
            except WsnError as exc:
                raise SelectionError(f"topic {text!r}: {type(exc).__name__}: {exc}") from exc
            self._topics[text] = found
        return found

    def publish(self, batch: str, rows: Sequence[tuple[int, Staged]]) -> None:
        """Publish ``rows`` (``(partition, staged row)``) of ``batch``, all confirmed."""
        if self._client is not None:
            self._notify(rows)
            return
        from wsnmom.core.codec import encode
        from wsnmom.core.model import EndpointReference, NotificationMessage

        assert self._adapter is not None
        settings = self.settings
        producer = EndpointReference(settings.producer) if settings.producer else None
        now = datetime.now(UTC)
        messages = []
        for partition, (index, row_topic, body) in rows:
            text = row_topic if row_topic is not None else settings.topic
            topic, dialect = self._topic(text) if text is not None else (None, None)
            message = NotificationMessage(
                message_id=f"{settings.sink_id}/{batch}/{partition}/{index}",
                payload=body,
                topic=topic,
                topic_dialect=dialect,
                producer_reference=producer,
                content_type=settings.content_type,
                published_at=now,
            )
            messages.append(encode(message))
        self._adapter.publish_many(messages, timeout=settings.timeout)

    def _notify(self, rows: Sequence[tuple[int, Staged]]) -> None:
        from wsnmom.client.model import Message, TopicExpression

        settings = self.settings
        messages = []
        for _partition, (_index, row_topic, body) in rows:
            text = row_topic if row_topic is not None else settings.topic
            topic = (
                TopicExpression(text, dict(settings.namespaces), settings.dialect)
                if text is not None
                else None
            )
            messages.append(Message(body, topic, settings.producer))
        self._client.notify_many(messages)


_publishers: dict[str, Publisher] = {}
_publishers_lock = threading.Lock()


def _publisher(settings: SinkSettings) -> Publisher:
    key = repr(settings)
    with _publishers_lock:
        publisher = _publishers.get(key)
        if publisher is None:
            publisher = Publisher(settings)
            _publishers[key] = publisher
        return publisher


@atexit.register
def close_publishers() -> None:
    """Close the cached publishers of this process (at exit, or in tests)."""
    with _publishers_lock:
        for publisher in _publishers.values():
            try:
                publisher.close()
            except Exception:
                log.debug("closing a publisher failed", exc_info=True)
        _publishers.clear()


def commit_batch(settings: SinkSettings, batch: str | None, messages: Sequence[Any]) -> int:
    """Publish the staged rows of ``batch`` that the ledger does not count yet (all of them
    without a ledger or batch id); returns how many were published now."""
    rows: list[tuple[int, Staged]] = []
    for message in messages:
        if isinstance(message, StagedRows):
            rows.extend((message.partition, row) for row in message.rows)
    rows.sort(key=lambda item: (item[0], item[1][0]))
    ledger = Ledger(settings.ledger) if settings.ledger and batch is not None else None
    try:
        done, complete = (0, False)
        if ledger is not None:
            assert batch is not None
            done, complete = ledger.progress(settings.sink_id, batch)
        if complete:
            log.info("%s: batch %s was published before; skipped", settings.where(), batch)
            return 0
        if done:
            log.info(
                "%s: batch %s was published up to row %d of %d; publishing the rest",
                settings.where(),
                batch,
                done,
                len(rows),
            )
        publisher = _publisher(settings)
        key = batch if batch is not None else "-"
        position = done
        try:
            while position < len(rows):
                chunk = rows[position : position + settings.chunk]
                publisher.publish(key, chunk)
                position += len(chunk)
                if ledger is not None:
                    assert batch is not None
                    ledger.record(settings.sink_id, batch, position, len(rows), False)
        except SelectionError as exc:
            raise SourceError(settings.where(), str(exc)) from exc
        except Exception as exc:
            raise SourceError(
                settings.where(),
                f"publishing batch {key} failed after {position} of {len(rows)} rows: "
                f"{type(exc).__name__}: {exc}",
            ) from exc
        if ledger is not None:
            assert batch is not None
            ledger.record(settings.sink_id, batch, len(rows), len(rows), True)
        return len(rows) - done
    finally:
        if ledger is not None:
            ledger.close()


class _BatchWriter(DataSourceWriter):
    def __init__(self, settings: SinkSettings) -> None:
        self.settings = settings

    def write(self, iterator: Iterator[Row]) -> WriterCommitMessage:
        return _stage(self.settings, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        settings = self.settings
        batch = settings.write_id
        if batch is None and settings.ledger:
            log.warning("%s: a ledger without writeId cannot recognise a rerun", settings.where())
        commit_batch(settings, batch, messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.warning("%s: write aborted; nothing was published", self.settings.where())


class _StreamWriter(DataSourceStreamWriter):
    def __init__(self, settings: SinkSettings) -> None:
        if not settings.ledger:
            raise ValueError(
                "a streaming wsn_notify sink needs the option ledger (a file on the driver's "
                "disk recording what each micro-batch published)"
            )
        self.settings = settings

    def write(self, iterator: Iterator[Row]) -> WriterCommitMessage:
        return _stage(self.settings, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        published = commit_batch(self.settings, str(batchId), messages)
        log.info(
            "%s: batch %d published %d notification(s)", self.settings.where(), batchId, published
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("%s: batch %d aborted; nothing was published", self.settings.where(), batchId)


class NotifySink(DataSource):
    """Spark data source ``wsn_notify`` (see the module docstring)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        super().__init__(lower_keys(options))

    @classmethod
    def name(cls) -> str:
        return "wsn_notify"

    def schema(self) -> str:
        return "payload STRING, topic STRING"

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return _BatchWriter(SinkSettings.parse(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return _StreamWriter(SinkSettings.parse(self.options))
