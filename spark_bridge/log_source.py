"""``wsn_log``: the source over the bridge's notification logs (``spark_bridge.log``), the
replayable form of middleware that has none (the MQTT buffer, ``wsnmom spark-buffer``).

Stream: one, the log's name; offsets: its sequence numbers.  The rows are the same as the
middleware's own source would give: the log keeps the routing topic, headers and body, and
the same decoding and residual filter apply (the buffer subscribes with the native
patterns of its own expression; a source may select less than its buffer, never more).

Options (besides the common ones of ``reader``)
    ``path``
        the log file.
    ``shipFromDriver``
        false (default): tasks open the log file themselves, which needs the file on every
        executor's file system (local mode, a shared file system).  true: the driver reads
        each task's records and ships them with the task, for clusters whose executors
        cannot see the buffer's disk (meant for trickles: a micro-batch passes through the
        driver's memory).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from wsnmom.adapters.logbase.public import LogRecord

from .log import NotificationLog
from .options import get_bool
from .reader import EARLIEST, Backend, OffsetSource, RangePartition, RecordsMissing

__all__ = ["LogBackend", "LogSource"]


@dataclass
class ShippedRange(RangePartition):
    """A task whose records the driver read (``shipFromDriver``)."""

    records: list[LogRecord] = field(default_factory=list)


class LogBackend(Backend):
    """A notification log as the reader's one stream."""

    format_name = "wsn_log"
    option_names = ("path", "shipFromDriver")

    def __init__(self, options: Mapping[str, str]) -> None:
        super().__init__(options)
        path = self.options.get("path")
        if not path:
            raise ValueError("the log source needs the option path (the buffer's log file)")
        self.path = path
        self.ship = get_bool(self.options, "shipfromdriver", False)
        self._log: NotificationLog | None = None

    @property
    def log(self) -> NotificationLog:
        if self._log is None:
            self._log = NotificationLog(self.path, create=False)
        return self._log

    @property
    def middleware(self) -> str:  # type: ignore[override]
        """What the log buffers (``mqtt`` for the MQTT buffer), else ``log``."""
        return self.log.middleware

    def default_alias(self) -> str:
        return NotificationLog(self.options["path"], create=False).name

    def broker(self) -> str:
        return self.path

    def where(self) -> str:
        return f"log source {self.alias!r} ({self.path})"

    def bounds(self) -> dict[str, tuple[int, int]]:
        return {self.log.name: self.log.bounds()}

    def plan(self, part: RangePartition) -> RangePartition:
        if not self.ship:
            return part
        return ShippedRange(part.stream, part.start, part.end, list(self._read(part)))

    def read_partition(self, part: RangePartition) -> Iterator[LogRecord]:
        if isinstance(part, ShippedRange):
            return iter(part.records)
        return self._read(part)

    def _read(self, part: RangePartition) -> Iterator[LogRecord]:
        return self.read(part.stream, part.start, part.end)

    def read(self, stream: str, start: int, end: int) -> Iterator[LogRecord]:
        log = self.log
        low, _ = log.bounds()
        if start == EARLIEST:
            start = low
        elif start < low:
            raise RecordsMissing(stream, start, low)
        return log.read(start, end)

    def close(self) -> None:
        log, self._log = self._log, None
        if log is not None:
            log.close()


class LogSource(OffsetSource):
    """Spark data source ``wsn_log`` (see the module docstring)."""

    backend_class = LogBackend

    @classmethod
    def name(cls) -> str:
        return "wsn_log"
