"""``FileLogAdapter``: the reference adapter of the *log* shape, on an append-only log in a
local directory.

It exists to prove core on offset semantics without a Kafka cluster, and as a worked
example for authors of log-based adapters: subscriptions are cursors served by
``adapters.logbase.CursorEngine``; this module only maps topics to streams and implements
the backend protocols over :class:`~wsnmom.adapters.filelog.log.FileLog`.  Use it for
development and tests, not for production volumes (records are also held in memory).

Features
    * One log per topic namespace, ``partitions`` streams each (a topic always goes to the
      same stream, so order holds per topic; ``ordering="partition"``).
    * Offset acknowledgements: a cursor commits the contiguous prefix of settled records
      (``ack_mode="offset"``), no per-message nack (a requeue rewinds the cursor), no
      native pull (core keeps a pull buffer), QueueLimits enforced by core.
    * Durable: records, cursor positions and the head position survive the process
      (SIGKILL included); ``fsync`` makes appends survive a power failure too.
    * ``retention``: records kept per stream; a paused subscription behind it is told how
      many it lost (``SubscriptionHandle.lost``).

Connection String
    ``filelog://PATH`` (relative to the working directory) or ``filelog:///abs/path``;
    options may also be given as query arguments: ``?partitions=4&retention=1000``.

Options
    ``partitions`` (2), ``retention`` (records per stream, unlimited), ``fsync`` (false),
    ``catch_up_readers`` (4).
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote

from wsnmom.adapters.embedded import EMBEDDED_SYNTAX
from wsnmom.core.adapter import (
    HEADER_MESSAGE_ID,
    AdapterError,
    AdapterUnavailable,
    Capabilities,
    OutboundMessage,
    PublishReceipt,
    SubscriptionHandle,
    SubscriptionSpec,
    is_internal_namespace,
)
from wsnmom.core.adapter_options import AdapterOptionError, option, parse_options
from wsnmom.topic_mapping.model import PathPattern

from ..logbase.adapter import LogAdapter
from ..logbase.backend import LogRecord, RecordsLost, StreamId
from ..logbase.cursor import CursorHandle
from ..logbase.engine import CursorEngine
from .log import FileLog

__all__ = ["FileLogAdapter"]

SCHEME = "filelog"


@dataclass(frozen=True, slots=True)
class FileLogOptions:
    """The file log adapter's options."""

    partitions: int = option(2, minimum=1, doc="streams per topic namespace")
    retention: int | None = option(
        None, minimum=1, doc="records kept per stream (default: unlimited)"
    )
    fsync: bool = option(False, doc="fsync every append (survives a power failure)")
    catch_up_readers: int = option(4, minimum=1, doc="readers for subscriptions that are behind")


class _Reader:
    """``LogReader`` over the file log."""

    def __init__(self, log: FileLog) -> None:
        self._log = log
        self._positions: dict[StreamId, int] = {}

    def assign(self, positions: Mapping[StreamId, int]) -> None:
        self._positions = dict(positions)

    def poll(self, max_records: int, timeout: float) -> Sequence[LogRecord | RecordsLost]:
        with self._log.cond:
            out, new = self._log.read(self._positions, max_records)
            if not out:
                self._log.wait(timeout)
                out, new = self._log.read(self._positions, max_records)
            self._positions = new
        return out

    def close(self) -> None:
        self._positions = {}


class _HeadReader:
    """``HeadReader`` over the file log: follows every stream, commits to head.json."""

    def __init__(self, log: FileLog) -> None:
        self._log = log
        committed = log.load_positions("head.json").get("head", {})
        self._positions: dict[StreamId, int] = {}
        for stream, end in log.streams().items():
            self._positions[stream] = committed.get(stream, end if not committed else 0)

    def _follow_new(self) -> None:
        for stream in self._log.streams():
            self._positions.setdefault(stream, 0)

    def poll(self, max_records: int, timeout: float) -> Sequence[LogRecord | RecordsLost]:
        with self._log.cond:
            self._follow_new()
            out, new = self._log.read(self._positions, max_records)
            if not out:
                self._log.wait(timeout)
                self._follow_new()
                out, new = self._log.read(self._positions, max_records)
            self._positions.update(new)
        return out

    def positions(self) -> dict[StreamId, int]:
        with self._log.cond:
            self._follow_new()
            return dict(self._positions)

    def commit(self, positions: Mapping[StreamId, int]) -> None:
        self._log.save_positions("head.json", {"head": positions})

    def close(self) -> None:
        return None


class _PositionStore:
    """``PositionStore`` in positions.json."""

    def __init__(self, log: FileLog) -> None:
        self._log = log
        self._lock = threading.Lock()
        self._data = log.load_positions("positions.json")

    def load(self) -> dict[str, dict[StreamId, int]]:
        with self._lock:
            return {k: dict(v) for k, v in self._data.items()}

    def load_one(self, name: str) -> dict[StreamId, int] | None:
        with self._lock:
            found = self._data.get(name)
            return None if found is None else dict(found)

    def save(self, changes: Mapping[str, Mapping[StreamId, int]]) -> None:
        with self._lock:
            for name, positions in changes.items():
                self._data.setdefault(name, {}).update(positions)
            self._log.save_positions("positions.json", self._data)

    def delete(self, names: Iterable[str]) -> None:
        with self._lock:
            for name in names:
                self._data.pop(name, None)
            self._log.save_positions("positions.json", self._data)


class _Backend:
    """``LogBackend``: one log per namespace."""

    def __init__(self, log: FileLog, namespaces: dict[str, str]) -> None:
        self._log = log
        #: log name -> namespace URI
        self._namespaces = namespaces

    def head_reader(self) -> _HeadReader:
        return _HeadReader(self._log)

    def reader(self) -> _Reader:
        return _Reader(self._log)

    def position_store(self) -> _PositionStore:
        return _PositionStore(self._log)

    def end_positions(self) -> dict[StreamId, int]:
        return self._log.streams()

    def may_carry(self, log: str, patterns: tuple[PathPattern, ...] | None) -> bool:
        namespace = self._namespaces.get(log)
        if namespace is None:
            return False
        if patterns is None:
            return not is_internal_namespace(namespace)
        return any(p.namespace == namespace for p in patterns)


def log_name(namespace: str) -> str:
    """The log (file name prefix) of a namespace: a digest, so any URI is a safe name."""
    return "ns" + hashlib.sha1(namespace.encode("utf-8")).hexdigest()[:20]


def parse_url(url: str) -> tuple[Path, dict[str, str]]:
    """``filelog://PATH?opt=value`` -> directory and options."""
    prefix = SCHEME + "://"
    if not url.startswith(prefix):
        raise ValueError(f"not a filelog URL: {url!r} (expected {prefix}PATH)")
    rest, _, query = url[len(prefix) :].partition("?")
    if not rest:
        raise ValueError(f"the filelog URL needs a directory: {prefix}PATH")
    return Path(unquote(rest)), dict(parse_qsl(query))


class _Shared:
    """The log and cursor engine of one directory, shared by the adapters of a process
    that open it (the directory itself is locked against other processes)."""

    def __init__(self, log: FileLog, engine: CursorEngine, namespaces: dict[str, str]) -> None:
        self.log = log
        self.engine = engine
        self.namespaces = namespaces
        self.users = 0


_SHARED: dict[Path, _Shared] = {}
_SHARED_LOCK = threading.Lock()


def _acquire(path: Path, options: FileLogOptions) -> _Shared:
    key = path.resolve()
    with _SHARED_LOCK:
        shared = _SHARED.get(key)
        if shared is None:
            log = FileLog(
                path,
                partitions=options.partitions,
                retention=options.retention,
                fsync=options.fsync,
            )
            log.open()
            namespaces = log.load_namespaces()
            engine = CursorEngine(
                _Backend(log, namespaces),
                catch_up_readers=options.catch_up_readers,
            )
            try:
                engine.start()
            except Exception:
                log.close()
                raise
            shared = _SHARED[key] = _Shared(log, engine, namespaces)
        shared.users += 1
        return shared


def _release(path: Path, shared: _Shared) -> None:
    key = path.resolve()
    with _SHARED_LOCK:
        shared.users -= 1
        if shared.users > 0:
            return
        _SHARED.pop(key, None)
    shared.engine.close()
    shared.log.close()


class FileLogAdapter(LogAdapter):
    """Log-shaped reference adapter (see the module docstring)."""

    name = "filelog"
    schemes = (SCHEME,)
    extra = None
    capabilities = Capabilities(
        syntax=EMBEDDED_SYNTAX,
        ack_mode="offset",
        durable_subscriptions=True,
        native_pull=False,
        retained_current_message=False,
        native_headers=True,
        native_queue_limits=False,
        ordering="partition",
        competing_consumers=False,
        max_message_bytes=None,
        sole_publisher=False,
        per_message_nack=False,
        shape="log",
        # a reader of its own reads from the cursor's positions, committing nothing
        peek=True,
        # what discard skips (the oldest or the newest) is read and published to
        # SubscriptionSpec.dead_letters before the cursor commits past it
        native_dead_letters=True,
    )

    declared_options = FileLogOptions

    def __init__(self, url: str, options: Mapping[str, Any] | None = None) -> None:
        try:
            path, query = parse_url(url)
        except ValueError as exc:
            raise AdapterOptionError(str(exc)) from None
        super().__init__(url, {**query, **(options or {})})
        #: the options, checked
        self.opts = parse_options(FileLogOptions, adapter="filelog", query=query, options=options)
        self.path = path
        self._lock = threading.Lock()
        self._shared: _Shared | None = None
        self._handles: weakref.WeakSet[CursorHandle] = weakref.WeakSet()

    # -- lifecycle -------------------------------------------------------------------------
    def open(self) -> None:
        with self._lock:
            if self._shared is None:
                self._shared = _acquire(self.path, self.opts)

    def close(self) -> None:
        with self._lock:
            shared, self._shared = self._shared, None
            handles = list(self._handles)
            self._handles = weakref.WeakSet()
        if shared is None:
            return
        for handle in handles:  # what this adapter handed out comes again elsewhere
            handle.stop()
        _release(self.path, shared)

    def ping(self, timeout: float = 1.0) -> bool:
        shared = self._shared
        return shared is not None and not shared.log.closed

    def available(self) -> bool:
        return self._shared is not None

    def unavailable_reason(self) -> str | None:
        return None if self._shared is not None else "the filelog adapter is not open"

    def _require(self) -> _Shared:
        shared = self._shared
        if shared is None:
            raise AdapterUnavailable("the filelog adapter is not open")
        return shared

    # -- publishing ------------------------------------------------------------------------
    def _log_for(self, shared: _Shared, namespace: str) -> str:
        name = log_name(namespace)
        if name not in shared.namespaces:
            with _SHARED_LOCK:
                shared.namespaces[name] = namespace
                shared.log.save_namespaces(shared.namespaces)
        return name

    def publish(self, message: OutboundMessage, timeout: float = 10.0) -> PublishReceipt:
        return self.publish_many([message], timeout)[0]

    def publish_many(
        self, messages: Sequence[OutboundMessage], timeout: float = 10.0
    ) -> list[PublishReceipt]:
        shared = self._require()
        entries = []
        for m in messages:
            stream = shared.log.stream_for(self._log_for(shared, m.topic.namespace), m.topic)
            headers = dict(m.headers)
            headers.setdefault(HEADER_MESSAGE_ID, m.message_id)
            entries.append((stream, m.topic, m.body, headers, m.content_type))
        try:
            shared.log.append(entries)
        except OSError as exc:
            raise AdapterError(f"appending to the file log failed: {exc}") from exc
        return [PublishReceipt(routed=None) for _ in messages]

    # -- subscriptions ---------------------------------------------------------------------
    def cursor_engine(self) -> CursorEngine:
        return self._require().engine

    def subscription(self, spec: SubscriptionSpec) -> SubscriptionHandle:
        handle = super().subscription(spec)
        assert isinstance(handle, CursorHandle)
        self._handles.add(handle)
        return handle
