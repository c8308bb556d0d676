"""The replayable source every middleware of the bridge plugs into: Spark's batch and
streaming readers over *streams* with offsets (Kafka topic partitions, a RabbitMQ stream
queue, a buffer log).

A middleware provides a :class:`Backend`: the offsets available now per stream, and the
records of one stream in an offset range.  This module does the rest, the same way for
all of them:

* **Offsets** are the JSON object ``{"source": alias, "streams": {stream: next offset}}``
  that Spark writes to the query's checkpoint.  A stream missing from a start offset (a
  Kafka topic created after the query started) is read from its first record.
* ``latestOffset(start, limit)`` asks the backend for the ends of its streams and applies
  the read limit (``maxRecordsPerTrigger``: shared fairly over the streams with data).
  ``Trigger.AvailableNow`` fixes the ends once, at the start of the query.
* ``partitions(start, end)`` cuts each stream's range into equal tasks of at most
  ``maxRecordsPerPartition`` offsets, and the longest ranges further until there are
  ``minPartitions`` tasks; one task reads exactly its range, so a micro-batch that Spark
  runs again returns the same records.
* ``read`` decodes and filters each record as the gateway does (``Backend.batches``:
  ``schema.RowBuilder`` record by record, or the backend's own column-wise conversion).
* Records that retention removed before they were read: the query fails naming the
  source and the range (``failOnDataLoss``, default true), or skips them with a warning.

The batch reader reads a snapshot: ``startingOffsets`` (default ``earliest``) to
``endingOffsets`` (default the ends when the query is planned).
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from wsnmom.adapters.logbase.public import LogRecord

from .options import (
    COMMON_OPTIONS,
    EARLIEST,
    SourceError,
    check_names,
    get_bool,
    get_int,
    get_json,
    lower_keys,
    offset_values,
    offsets_option,
)
from .schema import DDL, RowBuilder
from .selection import OPTION_NAMES, Compiled, Selection

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType
    from wsnmom.core.filters import CompiledFilter

__all__ = ["EARLIEST", "Backend", "OffsetSource", "RangePartition", "RecordsMissing", "log"]

log = logging.getLogger("wsnmom.spark_bridge")

#: ``minPartitions`` never splits a range into tasks of fewer offsets than this (a task's
#: consumer costs ~10-20 ms to start)
MIN_SPLIT = 10_000
#: the offsets' format version (a different one is refused, never misread)
OFFSET_VERSION = 1


class RecordsMissing(Exception):
    """The stream no longer holds offsets ``[first, next)`` (retention removed them)."""

    def __init__(self, stream: str, first: int, next_: int) -> None:
        super().__init__(f"{stream}: offsets {first}..{next_ - 1} are gone")
        self.stream = stream
        self.first = first
        self.next = next_


class Backend(abc.ABC):
    """One middleware as seen by the generic reader.  Built from the source's options in
    every process that needs it; must pickle (clients are opened lazily and dropped by
    ``__getstate__``)."""

    #: the ``middleware`` column
    middleware: str
    #: the data source's name (``wsn_kafka``), for messages
    format_name: str
    #: the options of this backend besides :data:`COMMON_OPTIONS`, as the docs spell them
    option_names: tuple[str, ...] = ()
    #: prefixes of further options (``kafka.`` for librdkafka properties)
    option_prefixes: tuple[str, ...] = ()

    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = dict(options)
        check_names(
            self.options,
            COMMON_OPTIONS + OPTION_NAMES + self.option_names,
            f"the {self.format_name} source",
            prefixes=self.option_prefixes,
        )
        self.alias = self.options.get("alias") or self.default_alias()
        #: ``includeHeaders``: false leaves the ``headers`` column null (less work per row)
        self.include_headers = bool(get_bool(self.options, "includeheaders", True))

    @abc.abstractmethod
    def default_alias(self) -> str:
        """The source alias when the options give none."""

    @abc.abstractmethod
    def broker(self) -> str:
        """Where the data comes from, for messages (no secrets)."""

    def where(self) -> str:
        """``<middleware> source '<alias>' (<broker>)`` for error messages."""
        return f"{self.middleware} source {self.alias!r} ({self.broker()})"

    def prepare(self) -> None:
        """Make sure the source exists (a tap queue): called on the driver before offsets
        are first asked for."""
        return None

    @abc.abstractmethod
    def bounds(self) -> dict[str, tuple[int, int]]:
        """``{stream: (first offset held, next offset)}`` now."""

    @abc.abstractmethod
    def read(self, stream: str, start: int, end: int) -> Iterator[LogRecord]:
        """The records of ``stream`` with offsets in ``[start, end)``, in order; ``start``
        may be :data:`EARLIEST`.  Raises :class:`RecordsMissing` before yielding anything
        when ``start`` is no longer held."""

    def plan(self, part: RangePartition) -> RangePartition:
        """The task Spark gets for ``part`` (on the driver; a backend may attach data)."""
        return part

    def read_partition(self, part: RangePartition) -> Iterator[LogRecord]:
        """The records of one task (on an executor)."""
        return self.read(part.stream, part.start, part.end)

    def batches(self, part: RangePartition, selection: CompiledFilter) -> Iterator[pa.RecordBatch]:
        """The rows of one task that ``selection`` accepts, as Arrow record batches: by
        default each record of :meth:`read_partition` decoded and filtered as the gateway
        does (``schema.RowBuilder``); a backend may build them column-wise."""
        rows = RowBuilder(
            self.alias, self.middleware, selection, include_headers=self.include_headers
        )
        stream = part.stream
        return rows.batches((record, stream) for record in self.read_partition(part))

    def commit(self, offsets: Mapping[str, int]) -> None:
        """Spark finished everything before ``offsets`` (informational)."""
        return None

    def close(self) -> None:
        """Release clients (driver side, when the query stops)."""
        return None

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "alias": self.alias}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])  # type: ignore[misc]
        self.alias = state["alias"]


@dataclass
class RangePartition(InputPartition):
    """One task: the records of ``stream`` in ``[start, end)`` (``start`` may be EARLIEST)."""

    stream: str
    start: int
    end: int


def _offsets(source: str, streams: Mapping[str, int]) -> dict[str, Any]:
    return {"v": OFFSET_VERSION, "source": source, "streams": dict(sorted(streams.items()))}


def _streams_of(offset: Mapping[str, Any] | None, where: str, source: str) -> dict[str, int]:
    """The per-stream offsets of a checkpointed offset written by this module."""
    if not offset:
        return {}
    if offset.get("v") != OFFSET_VERSION or not isinstance(offset.get("streams"), dict):
        raise SourceError(
            where,
            f"the checkpoint holds offsets {dict(offset)!r} that this source did not write "
            "(another implementation, e.g. Spark's native Kafka connector, or another "
            "version): start the query with a new checkpoint location",
        )
    if offset.get("source") != source:
        raise SourceError(
            where,
            f"the checkpoint belongs to source {offset.get('source')!r}: the sources of a "
            "query and their aliases must not change between runs",
        )
    return {str(k): int(v) for k, v in offset["streams"].items()}


class _Common:
    """What the batch and the streaming reader share."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        options = backend.options
        self.selection = Selection.from_options(options)
        # compiled once here so a bad expression fails when the query is defined
        self._compiled: Compiled | None = Compiled(self.selection)
        self.max_per_partition = get_int(options, "maxrecordsperpartition", 100_000, low=1)
        self.min_partitions = get_int(options, "minpartitions", 1, low=1) or 1
        self.fail_on_data_loss = get_bool(options, "failondataloss", True)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_compiled"] = None
        return state

    @property
    def compiled(self) -> Compiled:
        if self._compiled is None:
            self._compiled = Compiled(self.selection)
        return self._compiled

    def where(self) -> str:
        return self.backend.where()

    def bounds(self) -> dict[str, tuple[int, int]]:
        try:
            return self.backend.bounds()
        except SourceError:
            raise
        except Exception as exc:
            raise SourceError(self.where(), f"cannot read the offsets: {exc}") from exc

    def starting(self, key: str, bounds: Mapping[str, tuple[int, int]]) -> dict[str, int]:
        """Offsets option ``key`` (``startingOffsets``, ``endingOffsets``) against the
        streams' ``bounds`` now (``options.offsets_option``)."""
        return offsets_option(self.backend.options, key, bounds, self.where())

    def _explicit(self, key: str) -> dict[str, int] | None:
        """Option ``key`` when it is a JSON object of offsets (none -1 or -2), else None."""
        text = (self.backend.options.get(key) or "").strip()
        if not text.startswith("{"):
            return None
        data = get_json(self.backend.options, key)
        if not isinstance(data, dict):
            return None
        offsets = offset_values(data, key, self.where())
        return offsets if all(v >= 0 for v in offsets.values()) else None

    def ranges(self, start: Mapping[str, int], end: Mapping[str, int]) -> list[RangePartition]:
        """Tasks covering ``[start, end)`` of every stream: each stream's range in equal
        pieces of at most ``maxRecordsPerPartition`` offsets, and more pieces of the longest
        ranges until there are ``minPartitions`` tasks (none shorter than
        :data:`MIN_SPLIT` offsets)."""
        parts: list[RangePartition] = []
        size = self.max_per_partition or 1
        spans: dict[str, tuple[int, int]] = {}
        for stream, stop in sorted(end.items()):
            first = start.get(stream, EARLIEST)
            if first == EARLIEST:
                # a stream this query has not seen yet: one task from its first record
                if stop > 0:
                    parts.append(RangePartition(stream, EARLIEST, stop))
                continue
            if first < stop:
                spans[stream] = (first, stop)
        pieces = {s: -(-(hi - lo) // size) for s, (lo, hi) in spans.items()}
        while len(parts) + sum(pieces.values()) < self.min_partitions:
            # the stream whose pieces are longest, if they can be halved further
            widest = max(
                pieces, key=lambda s: (spans[s][1] - spans[s][0]) / pieces[s], default=None
            )
            if widest is None:
                break
            lo, hi = spans[widest]
            if (hi - lo) // (pieces[widest] + 1) < MIN_SPLIT:
                break
            pieces[widest] += 1
        for stream, (lo, hi) in spans.items():
            count = pieces[stream]
            step, extra = divmod(hi - lo, count)
            for i in range(count):
                upper = lo + step + (1 if i < extra else 0)
                parts.append(RangePartition(stream, lo, upper))
                lo = upper
        return sorted(parts, key=lambda p: (p.stream, p.start))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, RangePartition):
            return  # Spark's single placeholder task of a read with nothing to read
        backend = self.backend
        try:
            yield from self._batches(partition)
        except SourceError:
            raise
        except Exception as exc:
            raise SourceError(
                self.where(),
                f"reading {partition.stream} offsets {partition.start}..{partition.end - 1} "
                f"failed: {type(exc).__name__}: {exc}",
            ) from exc
        finally:
            backend.close()

    def _batches(self, partition: RangePartition) -> Iterator[pa.RecordBatch]:
        backend = self.backend
        selection = self.compiled.filter
        try:
            yield from backend.batches(partition, selection)
        except RecordsMissing as gone:
            message = (
                f"records {gone.first}..{gone.next - 1} of {gone.stream} were removed "
                "before they were read (retention)"
            )
            if self.fail_on_data_loss:
                raise SourceError(
                    self.where(), message + "; set failOnDataLoss=false to skip them"
                ) from None
            log.warning("%s: %s; skipped", self.where(), message)
            if gone.next < partition.end:
                rest = RangePartition(partition.stream, gone.next, partition.end)
                yield from backend.batches(rest, selection)


class BatchReader(_Common, DataSourceReader):
    """A snapshot read: ``startingOffsets`` .. ``endingOffsets`` (default: the ends when
    the query is planned)."""

    def __init__(self, backend: Backend) -> None:
        super().__init__(backend)

    def snapshot(self) -> tuple[dict[str, int], dict[str, int]]:
        """``(start, end)`` offsets of every stream for a read now.  When both are given
        as offsets (as ``read_notifications`` fixes a batch read's ranges), the broker is
        not asked again."""
        backend = self.backend
        backend.prepare()
        end = self._explicit("endingoffsets")
        if end is not None:
            start = self._explicit("startingoffsets")
            if start is not None and set(end) <= set(start):
                return self._ordered({s: start[s] for s in end}, end)
        bounds = self.bounds()
        start = self.starting("startingoffsets", bounds)
        ending = backend.options.get("endingoffsets")
        if ending and ending.strip() != "latest":
            end = self.starting("endingoffsets", bounds)
        else:
            end = {s: high for s, (_, high) in bounds.items()}
        return self._ordered(start, end)

    def _ordered(
        self, start: dict[str, int], end: dict[str, int]
    ) -> tuple[dict[str, int], dict[str, int]]:
        """``(start, end)``, refused when a stream would end before it starts."""
        for stream, stop in sorted(end.items()):
            first = start.get(stream, stop)
            if first > stop:
                raise SourceError(
                    self.where(),
                    f"startingOffsets {first} of {stream} is after its endingOffsets {stop}",
                )
        return start, end

    def partitions(self) -> Sequence[InputPartition]:
        backend = self.backend
        start, end = self.snapshot()
        parts = [backend.plan(p) for p in self.ranges(start, end)]
        log.info(
            "%s: batch read of %s, %d task(s): %s",
            self.where(),
            self.selection.describe(),
            len(parts),
            ", ".join(f"{p.stream} {max(p.start, 0)}..{p.end}" for p in parts) or "nothing",
        )
        backend.close()
        return parts


class StreamReader(_Common, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The micro-batch reader (see the module docstring)."""

    def __init__(self, backend: Backend) -> None:
        super().__init__(backend)
        self.max_per_trigger = get_int(backend.options, "maxrecordspertrigger", None, low=1)
        #: the ends ``Trigger.AvailableNow`` stops at
        self._target: dict[str, tuple[int, int]] | None = None
        self._prepared = False

    def _ensure(self) -> None:
        if not self._prepared:
            self.backend.prepare()
            self._prepared = True

    def _bounds_now(self) -> dict[str, tuple[int, int]]:
        self._ensure()
        return self.bounds()

    def initialOffset(self) -> dict[str, Any]:
        return _offsets(self.backend.alias, self.starting("startingoffsets", self._bounds_now()))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.max_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.max_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._bounds_now()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = _streams_of(start, self.where(), self.backend.alias)
        bounds = dict(self._target) if self._target is not None else self._bounds_now()
        # streams the checkpoint does not know yet start at their first record
        first = {s: begin.get(s, low) for s, (low, _) in bounds.items()}
        ends = {s: max(high, first[s]) for s, (_, high) in bounds.items()}
        for stream, offset in begin.items():
            # a stream that disappeared (topic deleted) or shrank keeps its position
            first[stream] = offset
            ends[stream] = max(ends.get(stream, offset), offset)
        if isinstance(limit, ReadMaxRows):
            ends = _limit(first, ends, limit.max_rows)
        return _offsets(self.backend.alias, ends)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        try:
            return _offsets(self.backend.alias, {s: h for s, (_, h) in self._bounds_now().items()})
        except SourceError:
            return None

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        where, alias = self.where(), self.backend.alias
        parts = self.ranges(_streams_of(start, where, alias), _streams_of(end, where, alias))
        return [self.backend.plan(p) for p in parts]

    def commit(self, end: dict[str, Any]) -> None:
        try:
            self.backend.commit(_streams_of(end, self.where(), self.backend.alias))
        except SourceError:
            raise
        except Exception as exc:  # informational only: never fail the query for it
            log.warning("%s: commit of %s failed: %s", self.where(), end, exc)

    def stop(self) -> None:
        self.backend.close()


def _limit(begin: Mapping[str, int], ends: dict[str, int], budget: int) -> dict[str, int]:
    """``ends`` cut so that at most ``budget`` offsets past ``begin`` are read, shared
    fairly over the streams that have data."""
    pending = {s: e - begin.get(s, e) for s, e in ends.items()}
    pending = {s: n for s, n in pending.items() if n > 0}
    if sum(pending.values()) <= budget:
        return ends
    granted = dict.fromkeys(pending, 0)
    left = budget
    while left > 0 and pending:
        share = max(1, left // len(pending))
        for stream in sorted(pending):
            take = min(share, pending[stream], left)
            granted[stream] += take
            pending[stream] -= take
            left -= take
            if left <= 0:
                break
        pending = {s: n for s, n in pending.items() if n > 0}
    out = dict(ends)
    for stream, n in granted.items():
        out[stream] = begin[stream] + n
    return out


class OffsetSource(DataSource):
    """Base of the bridge's data sources: subclasses name themselves and their backend."""

    backend_class: type[Backend]

    def __init__(self, options: Mapping[str, str]) -> None:
        super().__init__(lower_keys(options))

    def schema(self) -> str:
        return DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return BatchReader(self.backend_class(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StreamReader(self.backend_class(self.options))
