"""An append-only log on local disk: streams of records, readers at any offset, stored
positions.  The storage behind the ``filelog`` reference adapter; implements the
``adapters.logbase.backend`` protocols so the cursor engine serves its subscriptions.

Layout of the directory::

    filelog.lock            held (flock) by the one process using the directory
    <log>.<partition>.log   one file per stream: frames of (header length, body length,
                            JSON header, body), offset = frame number
    trimmed.json            first offset still held per stream (retention)
    head.json               the head reader's committed positions
    positions.json          stored cursor positions

Records are also kept in memory (this is a reference and test adapter, not a store for
large volumes).  Appends are flushed to the operating system before ``append`` returns, so
a killed process loses nothing; ``fsync=True`` also survives a power failure.
``retention`` (records per stream) drops the oldest records, so readers behind them get
``RecordsLost``.
"""

from __future__ import annotations

import json
import os
import struct
import threading
import zlib
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from wsnmom.core.adapter import AdapterUnavailable
from wsnmom.topic_mapping.model import Topic

from ..dir_lock import DirectoryLock, lock_directory
from ..logbase.backend import EARLIEST, LogRecord, RecordsLost, StreamId

__all__ = ["FileLog"]

_FRAME = struct.Struct(">II")


def _atomic_write(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, separators=(",", ":")))
    os.replace(tmp, path)


def _stream_key(stream: StreamId) -> str:
    return f"{stream[0]}.{stream[1]}"


def _parse_key(key: str) -> StreamId:
    log, _, partition = key.rpartition(".")
    return log, int(partition)


class FileLog:
    """The log directory (see the module docstring).  Thread-safe."""

    def __init__(
        self,
        path: Path,
        *,
        partitions: int = 2,
        retention: int | None = None,
        fsync: bool = False,
    ) -> None:
        self.path = path
        self.partitions = partitions
        self.retention = retention
        self.fsync = fsync
        self.cond = threading.Condition()
        #: per stream: first offset held, records held (offset = first + index)
        self._first: dict[StreamId, int] = {}
        self._records: dict[StreamId, list[LogRecord]] = {}
        self._files: dict[StreamId, IO[bytes]] = {}
        self._dir_lock: DirectoryLock | None = None
        self.closed = True

    # -- open / close ----------------------------------------------------------------------
    def open(self) -> None:
        """Lock the directory and load every stream."""
        self.path.mkdir(parents=True, exist_ok=True)
        self._dir_lock = lock_directory(str(self.path), "filelog.lock", "file log")
        trimmed = self._read_json("trimmed.json")
        for file in sorted(self.path.glob("*.log")):
            stream = _parse_key(file.stem)
            first = int(trimmed.get(_stream_key(stream), 0))
            self._first[stream] = first
            self._records[stream] = self._load(stream, file, first)
        self.closed = False

    def close(self) -> None:
        """Close the files and release the directory."""
        with self.cond:
            self.closed = True
            for f in self._files.values():
                f.close()
            self._files = {}
            self.cond.notify_all()
        if self._dir_lock is not None:
            self._dir_lock.release()
            self._dir_lock = None

    def _read_json(self, name: str) -> dict[str, Any]:
        try:
            data = json.loads((self.path / name).read_text())
        except FileNotFoundError:
            return {}
        return data if isinstance(data, dict) else {}

    def _load(self, stream: StreamId, file: Path, first: int) -> list[LogRecord]:
        out: list[LogRecord] = []
        data = file.read_bytes()
        pos = offset = 0
        while pos + _FRAME.size <= len(data):
            head_len, body_len = _FRAME.unpack_from(data, pos)
            end = pos + _FRAME.size + head_len + body_len
            if end > len(data):
                break  # a torn last frame (killed mid-write): never acknowledged
            header = json.loads(data[pos + _FRAME.size : pos + _FRAME.size + head_len])
            body = data[pos + _FRAME.size + head_len : end]
            if offset >= first:
                out.append(_record(stream, offset, header, body))
            pos, offset = end, offset + 1
        if pos != len(data):
            with file.open("r+b") as f:
                f.truncate(pos)
        return out

    # -- writing ---------------------------------------------------------------------------
    def stream_for(self, log: str, topic: Topic) -> StreamId:
        """The stream a record on ``topic`` goes to (partition by topic path)."""
        key = "/".join(topic.path).encode("utf-8")
        return log, zlib.crc32(key) % self.partitions

    def append(
        self, entries: Sequence[tuple[StreamId, Topic, bytes, Mapping[str, str], str]]
    ) -> None:
        """Append records (stream, topic, body, headers, content type); durable on return."""
        now = datetime.now(UTC)
        with self.cond:
            if self.closed:
                raise AdapterUnavailable("the file log is closed")
            touched: set[StreamId] = set()
            for stream, topic, body, headers, content_type in entries:
                records = self._records.setdefault(stream, [])
                first = self._first.setdefault(stream, 0)
                offset = first + len(records)
                header = {
                    "ns": topic.namespace,
                    "path": list(topic.path),
                    "h": dict(headers),
                    "ct": content_type,
                    "ts": now.timestamp(),
                }
                raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
                self._file(stream).write(_FRAME.pack(len(raw), len(body)) + raw + body)
                records.append(_record(stream, offset, header, body))
                touched.add(stream)
            for stream in touched:
                f = self._files[stream]
                f.flush()
                if self.fsync:
                    os.fsync(f.fileno())
            if self.retention is not None:
                self._trim(touched)
            self.cond.notify_all()

    def _file(self, stream: StreamId) -> IO[bytes]:
        f = self._files.get(stream)
        if f is None:
            f = self._files[stream] = (self.path / f"{_stream_key(stream)}.log").open("ab")
        return f

    def _trim(self, streams: Iterable[StreamId]) -> None:
        assert self.retention is not None
        changed = False
        for stream in streams:
            records = self._records[stream]
            excess = len(records) - self.retention
            if excess > 0:
                del records[:excess]
                self._first[stream] += excess
                changed = True
        if changed:
            _atomic_write(
                self.path / "trimmed.json", {_stream_key(s): f for s, f in self._first.items()}
            )

    # -- reading ---------------------------------------------------------------------------
    def streams(self) -> dict[StreamId, int]:
        """Every stream and its next offset."""
        with self.cond:
            return {s: self._first[s] + len(r) for s, r in self._records.items()}

    def read(
        self, positions: Mapping[StreamId, int], max_records: int
    ) -> tuple[list[LogRecord | RecordsLost], dict[StreamId, int]]:
        """Records from ``positions`` (hold ``cond``); returns them and the new positions."""
        out: list[LogRecord | RecordsLost] = []
        new = dict(positions)
        for stream, offset in positions.items():
            records = self._records.get(stream)
            if records is None:
                continue
            first = self._first[stream]
            if offset == EARLIEST:
                offset = first
            elif offset < first:
                out.append(RecordsLost(stream, offset, first))
                offset = first
            index = offset - first
            take = records[index : index + max(0, max_records - len(out))]
            out.extend(take)
            new[stream] = offset + len(take)
            if len(out) >= max_records:
                break
        return out, new

    def wait(self, timeout: float) -> None:
        """Wait up to ``timeout`` for an append (hold ``cond``)."""
        if timeout > 0 and not self.closed:
            self.cond.wait(timeout)

    def load_positions(self, name: str) -> dict[str, dict[StreamId, int]]:
        """Stored positions from ``name`` (``head.json`` or ``positions.json``)."""
        raw = self._read_json(name)
        return {
            key: {_parse_key(k): int(v) for k, v in value.items()} for key, value in raw.items()
        }

    def load_namespaces(self) -> dict[str, str]:
        """Log name -> namespace URI of every log written so far."""
        return {str(k): str(v) for k, v in self._read_json("namespaces.json").items()}

    def save_namespaces(self, namespaces: Mapping[str, str]) -> None:
        """Remember which namespace each log holds."""
        _atomic_write(self.path / "namespaces.json", dict(namespaces))

    def save_positions(self, name: str, data: Mapping[str, Mapping[StreamId, int]]) -> None:
        """Replace ``name`` with ``data``."""
        _atomic_write(
            self.path / name,
            {key: {_stream_key(s): o for s, o in value.items()} for key, value in data.items()},
        )


def _record(stream: StreamId, offset: int, header: Mapping[str, Any], body: bytes) -> LogRecord:
    return LogRecord(
        stream=stream,
        offset=offset,
        topic=Topic(str(header["ns"]), tuple(header["path"])),
        body=body,
        headers=dict(header.get("h", {})),
        content_type=str(header.get("ct", "application/xml")),
        timestamp=datetime.fromtimestamp(float(header["ts"]), UTC) if "ts" in header else None,
    )
