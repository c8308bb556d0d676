"""``wsn_rabbitmq``: the RabbitMQ source of the bridge, a non-destructive *tap*.

Classic and quorum queues forget a message once it is acknowledged, so Spark cannot replay
them, and reading a WS-N subscription's queue would take messages from its subscriber.
The bridge therefore declares its **own stream queue** (``x-queue-type: stream``) and
binds it to the same exchanges with the same binding keys the gateway's RabbitMQ adapter
uses for a subscription with the same filter (``wsnmom.adapters.rabbitmq.public``).  The
stream keeps every message it was routed (until its retention removes them) and every
message carries its position, so Spark reads exact offset ranges, again and again.

The tap sees what is published after it was declared.  Declare it ahead of time, with
:func:`ensure_tap` (``wsnmom spark-tap``), or let the first query declare it.

Streams: one, the tap queue's name; offsets: stream offsets.

Options (besides the common ones of ``reader``)
    ``url``
        ``amqp://user:password@host:5672/vhost`` (``amqps://`` for TLS; the gateway's URL).
    ``exchanges``
        JSON object namespace URI -> exchange name: the adapter's ``exchanges`` option
        (other namespaces use derived exchange names, as in the gateway).
    ``allExchange``
        the adapter's catch-all exchange (``wsnmom.all``), bound to for "every topic".
    ``queue``
        the tap's stream queue (default ``wsnmom.spark.tap.`` + a hash of its bindings).
    ``maxAge``, ``maxLengthBytes``, ``maxSegmentSizeBytes``
        retention of a tap the source declares (``x-max-age`` such as ``7D``,
        ``x-max-length-bytes``, ``x-stream-max-segment-size-bytes``).
    ``headProbeTimeout``
        seconds without a new delivery after which the probe for the stream's end stops
        (0.3); AMQP 0-9-1 has no call that returns a stream's end.
    ``pollTimeout``
        seconds a task waits for the next message of its range before it fails (60).
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from wsnmom.adapters.rabbitmq.public import (
    DEFAULT_ALL_EXCHANGE,
    Binding,
    LogRecord,
    RabbitMQNames,
    headers_of,
)
from wsnmom.topic_mapping.errors import NameNotRepresentable

from .options import SourceError, get_float, get_int, get_json, redact
from .reader import EARLIEST, Backend, OffsetSource, RecordsMissing, log
from .selection import Compiled, Selection

__all__ = ["RabbitMQBackend", "RabbitMQSource", "ensure_tap", "tap_queue_name"]

#: the header every stream delivery carries its offset in
OFFSET_HEADER = "x-stream-offset"
#: deliveries a reader has unacknowledged at most (acks only move the stream's credit)
_PREFETCH = 1000


def tap_queue_name(bindings: list[Binding]) -> str:
    """The default tap queue of a set of bindings."""
    text = "\n".join(f"{ex} {key}" for ex, key in sorted(bindings))
    return "wsnmom.spark.tap." + hashlib.sha256(text.encode()).hexdigest()[:16]


class RabbitMQBackend(Backend):
    """A tap stream queue as the reader's one stream (see the module docstring)."""

    middleware = "rabbitmq"
    format_name = "wsn_rabbitmq"
    option_names = (
        "url",
        "adapterOptions",
        "exchanges",
        "allExchange",
        "queue",
        "headProbeTimeout",
        "maxAge",
        "maxLengthBytes",
        "maxSegmentSizeBytes",
    )

    def __init__(self, options: Mapping[str, str]) -> None:
        super().__init__(options)
        url = self.options.get("url")
        if not url:
            raise ValueError("the RabbitMQ source needs the option url (amqp://host:5672/%2F)")
        self.url = url
        adapter = get_json(self.options, "adapteroptions") or {}
        exchanges = get_json(self.options, "exchanges") or adapter.get("exchanges") or {}
        if not isinstance(exchanges, dict):
            raise ValueError("option exchanges must be a JSON object namespace -> exchange")
        all_exchange = (
            self.options.get("allexchange") or adapter.get("all_exchange") or DEFAULT_ALL_EXCHANGE
        )
        self.names = RabbitMQNames(exchanges, all_exchange)
        compiled = Compiled(Selection.from_options(self.options))
        self.bindings = self.names.bindings_for(compiled.patterns)
        self.queue = self.options.get("queue") or tap_queue_name(self.bindings)
        self.probe_timeout = get_float(self.options, "headprobetimeout", 0.3)
        self.poll_timeout = get_float(self.options, "polltimeout", 60.0)

    def default_alias(self) -> str:
        from urllib.parse import urlsplit

        parts = urlsplit(self.options.get("url") or "")
        return parts.hostname or "rabbitmq"

    def broker(self) -> str:
        return f"{redact(self.url)} queue {self.options.get('queue') or 'tap'}"

    def where(self) -> str:
        return f"rabbitmq source {self.alias!r} ({redact(self.url)}, queue {self.queue})"

    def _connect(self) -> Any:
        import pika

        params = pika.URLParameters(self.url)
        params.client_properties = {"connection_name": f"wsnmom spark {self.alias}"}
        return pika.BlockingConnection(params)

    # -- the tap --------------------------------------------------------------------------
    def queue_arguments(self) -> dict[str, Any]:
        """Arguments of the tap queue the source declares."""
        args: dict[str, Any] = {"x-queue-type": "stream"}
        if self.options.get("maxage"):
            args["x-max-age"] = self.options["maxage"]
        size = get_int(self.options, "maxlengthbytes", None, low=1)
        if size is not None:
            args["x-max-length-bytes"] = size
        segment = get_int(self.options, "maxsegmentsizebytes", None, low=1)
        if segment is not None:
            args["x-stream-max-segment-size-bytes"] = segment
        return args

    def prepare(self) -> None:
        """Declare the tap (idempotent) and its bindings; exchanges that do not exist yet
        are declared as durable topic exchanges, as the gateway would."""
        import pika

        try:
            connection = self._connect()
        except pika.exceptions.AMQPError as exc:
            raise SourceError(self.where(), f"cannot connect: {exc!r}") from exc
        try:
            channel = connection.channel()
            for exchange in dict.fromkeys(ex for ex, _ in self.bindings):
                try:
                    channel.exchange_declare(exchange, passive=True)
                except pika.exceptions.ChannelClosedByBroker:
                    channel = connection.channel()
                    channel.exchange_declare(exchange, exchange_type="topic", durable=True)
                    log.info("%s: declared topic exchange %r", self.where(), exchange)
            try:
                channel.queue_declare(self.queue, durable=True, arguments=self.queue_arguments())
            except pika.exceptions.ChannelClosedByBroker as exc:
                raise SourceError(
                    self.where(),
                    f"cannot declare the tap queue: {exc} (an existing queue of that name "
                    "must be a stream queue)",
                ) from exc
            for exchange, key in self.bindings:
                channel.queue_bind(self.queue, exchange, key)
        finally:
            with contextlib.suppress(Exception):
                connection.close()

    # -- offsets --------------------------------------------------------------------------
    def _attach(self, connection: Any, where: int | str, prefetch: int) -> tuple[Any, list[Any]]:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=prefetch)
        got: list[Any] = []
        channel.basic_consume(
            self.queue,
            lambda _ch, method, properties, body: got.append((method, properties, body)),
            arguments={OFFSET_HEADER: where},
        )
        return channel, got

    def _probe(self, connection: Any, where: str, prefetch: int) -> int | None:
        """The first offset delivered from attaching at ``first``, or the last one from
        attaching at ``last`` until the deliveries stop for ``probe_timeout`` seconds
        (None: nothing).  A stream delivers whole chunks, whatever the prefetch."""
        channel, got = self._attach(connection, where, prefetch)
        last = time.monotonic()
        seen = 0
        offsets: list[int] = []
        while time.monotonic() - last < self.probe_timeout:
            connection.process_data_events(time_limit=0.02)
            if len(got) > seen:
                offsets += [int((p.headers or {})[OFFSET_HEADER]) for _m, p, _b in got[seen:]]
                if where == "first":
                    break
                channel.basic_ack(got[-1][0].delivery_tag, multiple=True)
                seen = len(got)
                last = time.monotonic()
        if not offsets:
            return None
        return min(offsets) if where == "first" else max(offsets)

    def bounds(self) -> dict[str, tuple[int, int]]:
        connection = self._connect()
        try:
            first = self._probe(connection, "first", 1)
            if first is None:
                return {self.queue: (0, 0)}
            last = self._probe(connection, "last", _PREFETCH)
            high = (last if last is not None else first) + 1
            return {self.queue: (first, max(first, high))}
        finally:
            with contextlib.suppress(Exception):
                connection.close()

    # -- records --------------------------------------------------------------------------
    def _record(self, method: Any, properties: Any, body: bytes, offset: int) -> LogRecord | None:
        headers = dict(headers_of(properties))
        headers.pop(OFFSET_HEADER, None)
        try:
            topic = self.names.topic_of(method.exchange, method.routing_key, headers)
        except NameNotRepresentable:
            return None  # no topic (empty routing key): the gateway drops it too
        stamp = None
        if properties.timestamp:
            stamp = datetime.fromtimestamp(int(properties.timestamp), UTC)
        return LogRecord(
            stream=(self.queue, 0),
            offset=offset,
            topic=topic,
            body=body,
            headers=headers,
            content_type=properties.content_type or "application/octet-stream",
            timestamp=stamp,
        )

    def read(self, stream: str, start: int, end: int) -> Iterator[LogRecord]:
        if stream != self.queue:
            raise SourceError(self.where(), f"the checkpoint names the stream {stream!r}")
        connection = self._connect()
        try:
            size = end - start if start != EARLIEST else _PREFETCH
            channel, got = self._attach(
                connection, "first" if start == EARLIEST else start, max(1, min(size, _PREFETCH))
            )
            idle_since = time.monotonic()
            first = True
            while True:
                connection.process_data_events(time_limit=0.05)
                if not got:
                    if time.monotonic() - idle_since > self.poll_timeout:
                        raise TimeoutError(
                            f"no message for {self.poll_timeout:.0f}s while reading "
                            f"{stream} up to offset {end - 1}"
                        )
                    continue
                idle_since = time.monotonic()
                batch, got[:] = list(got), []
                for method, properties, body in batch:
                    offset = int((properties.headers or {})[OFFSET_HEADER])
                    if first:
                        first = False
                        if start != EARLIEST and offset > start:
                            raise RecordsMissing(stream, start, offset)
                    if offset >= end:
                        return
                    record = self._record(method, properties, body, offset)
                    if record is not None:
                        yield record
                    if offset >= end - 1:
                        return
                # acks only extend the stream consumer's credit
                channel.basic_ack(batch[-1][0].delivery_tag, multiple=True)
        finally:
            with contextlib.suppress(Exception):
                connection.close()


class RabbitMQSource(OffsetSource):
    """Spark data source ``wsn_rabbitmq`` (see the module docstring)."""

    backend_class = RabbitMQBackend

    @classmethod
    def name(cls) -> str:
        return "wsn_rabbitmq"


def ensure_tap(options: Mapping[str, str]) -> str:
    """Declare the tap of a RabbitMQ source (options as for ``wsn_rabbitmq``) so that it
    collects from now on; returns the queue name."""
    from .options import lower_keys

    backend = RabbitMQBackend(lower_keys(options))
    backend.prepare()
    return backend.queue
