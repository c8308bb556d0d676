"""The bridge's append-only notification log: a SQLite file that a buffer appends to and
the ``wsn_log`` source reads by sequence number.

Middleware without replay (MQTT; classic queues) cannot give Spark offsets.  A buffer
process takes their messages, appends them here and only then acknowledges them to the
middleware, so the log holds every message the middleware handed out, once.  Each record
gets the next sequence number (the offset Spark checkpoints) and, when the message names
one, a unique *dedupe key*: a message redelivered after a crash between the append and the
acknowledgement is recognised and not appended twice.

Records keep what the gateway's codec needs to decode them (native name, routing topic,
body, headers, content type, arrival time), so reading the log gives the same rows as
reading the middleware.  Writes use one connection in WAL mode with ``synchronous=FULL``:
a committed append survives a crash of the buffer and of the machine.  Readers use their
own connections, never block the writer and never write.  A new log is built next to
its path and linked into place complete, so a reader that finds the file (a Spark query
started with its buffer) finds a whole log, never one half-created.

No pyspark here: the buffer runs without Spark.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from wsnmom.adapters.logbase.public import LogRecord
from wsnmom.topic_mapping.model import Topic

__all__ = ["FORMAT", "Entry", "NotificationLog"]

#: the file format version stored in the log's ``meta`` table
FORMAT = "1"

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS records (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        dedupe TEXT UNIQUE,
        digest TEXT,
        native TEXT NOT NULL,
        topic_ns TEXT NOT NULL,
        topic_path TEXT NOT NULL,
        body BLOB NOT NULL,
        headers TEXT NOT NULL,
        content_type TEXT NOT NULL,
        received_at REAL NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS records_digest ON records (digest) WHERE digest IS NOT NULL",
)


@dataclass(frozen=True, slots=True)
class Entry:
    """One message to append.

    ``dedupe``: a key unique to the message (its message id), or None.  ``digest``: a
    content digest used to recognise a redelivery of a message without a key
    (``NotificationLog.append(..., redelivered=...)``).
    """

    native: str
    topic: Topic
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = ""
    dedupe: str | None = None
    digest: str | None = None
    received_at: float = field(default_factory=time.time)


class NotificationLog:
    """An append-only log file (see the module docstring).  ``append`` from one thread at
    a time; reading methods from any thread (each uses its own connection)."""

    def __init__(
        self,
        path: str | Path,
        *,
        name: str | None = None,
        middleware: str | None = None,
        create: bool = True,
    ) -> None:
        self.path = Path(path)
        self._local = threading.local()
        self._writer = create
        if not create and not self.path.exists():
            raise FileNotFoundError(f"no notification log at {self.path}")
        wanted = {"format": FORMAT}
        if name is not None:
            wanted["name"] = name
        if middleware is not None:
            wanted["middleware"] = middleware
        if create and not self.path.exists():
            _create(self.path, wanted)
        try:
            if create:
                meta = _initialise(self._db(), self.path, wanted)
            else:
                meta = _read_meta(self._db(), self.path)
        except BaseException:
            self.close()
            raise
        self.name = meta.get("name") or self.path.stem
        self.middleware = meta.get("middleware") or "log"

    def _db(self) -> sqlite3.Connection:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            db = _connect(self.path, wal=self._writer)
            self._local.db = db
        return db

    def close(self) -> None:
        """Close this thread's connection."""
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None

    # -- writing --------------------------------------------------------------------------
    def append(
        self,
        entries: Sequence[Entry],
        *,
        redelivered: Sequence[bool] | None = None,
        window: int = 10_000,
    ) -> list[int | None]:
        """Append ``entries`` in one transaction (durable when this returns); the sequence
        number of each, or None for a duplicate: an entry whose dedupe key is already in
        the log, or a redelivered one (``redelivered[i]``) without a key whose digest
        equals one of the last ``window`` records'."""
        db = self._db()
        out: list[int | None] = []
        with db:
            for i, entry in enumerate(entries):
                if (
                    redelivered is not None
                    and redelivered[i]
                    and entry.dedupe is None
                    and entry.digest is not None
                    and self._recent_digest(db, entry.digest, window)
                ):
                    out.append(None)
                    continue
                cursor = db.execute(
                    "INSERT OR IGNORE INTO records (dedupe, digest, native, topic_ns, "
                    "topic_path, body, headers, content_type, received_at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        entry.dedupe,
                        entry.digest if entry.dedupe is None else None,
                        entry.native,
                        entry.topic.namespace,
                        "/".join(entry.topic.path),
                        entry.body,
                        json.dumps(entry.headers, separators=(",", ":")),
                        entry.content_type,
                        entry.received_at,
                    ),
                )
                out.append(cursor.lastrowid if cursor.rowcount == 1 else None)
        return out

    @staticmethod
    def _recent_digest(db: sqlite3.Connection, digest: str, window: int) -> bool:
        row = db.execute(
            "SELECT 1 FROM records WHERE digest = ? AND seq > "
            "(SELECT COALESCE(MAX(seq), 0) FROM records) - ? LIMIT 1",
            (digest, window),
        ).fetchone()
        return row is not None

    def trim(self, before: int) -> int:
        """Delete the records with sequence numbers below ``before`` (retention); returns
        how many were deleted."""
        db = self._db()
        with db:
            return db.execute("DELETE FROM records WHERE seq < ?", (before,)).rowcount

    def trim_older(self, seconds: float) -> int:
        """Delete the records that arrived more than ``seconds`` ago."""
        db = self._db()
        with db:
            return db.execute(
                "DELETE FROM records WHERE received_at < ?", (time.time() - seconds,)
            ).rowcount

    # -- reading --------------------------------------------------------------------------
    def bounds(self) -> tuple[int, int]:
        """``(first sequence number held, next sequence number)``."""
        db = self._db()
        low, high = db.execute("SELECT MIN(seq), MAX(seq) FROM records").fetchone()
        if high is None:
            try:
                row = db.execute(
                    "SELECT seq FROM sqlite_sequence WHERE name = 'records'"
                ).fetchone()
            except sqlite3.OperationalError:  # no table before the first append
                row = None
            nxt = (row[0] if row else 0) + 1
            return nxt, nxt
        return int(low), int(high) + 1

    def __len__(self) -> int:
        return int(self._db().execute("SELECT COUNT(*) FROM records").fetchone()[0])

    def read(self, start: int, end: int, *, chunk: int = 5000) -> Iterator[LogRecord]:
        """The records with ``start <= seq < end``, in order."""
        db = self._db()
        position = start
        while position < end:
            rows = db.execute(
                "SELECT seq, topic_ns, topic_path, body, headers, content_type, received_at "
                "FROM records WHERE seq >= ? AND seq < ? ORDER BY seq LIMIT ?",
                (position, end, chunk),
            ).fetchall()
            if not rows:
                return
            for seq, ns, path, body, headers, content_type, received_at in rows:
                yield LogRecord(
                    stream=(self.name, 0),
                    offset=seq,
                    topic=Topic(ns, tuple(path.split("/"))),
                    body=bytes(body),
                    headers=json.loads(headers),
                    content_type=content_type,
                    timestamp=datetime.fromtimestamp(received_at, UTC),
                )
            position = rows[-1][0] + 1

    def entries(self) -> Iterable[tuple[int, str, bytes]]:
        """``(seq, native name, body)`` of every record (tests, tooling)."""
        return self._db().execute("SELECT seq, native, body FROM records ORDER BY seq").fetchall()


# -- creating and opening -------------------------------------------------------------------
# A log file appears at its path only complete (schema and meta committed): a reader that
# finds the file never sees a log half-created, and never writes to it.


def _connect(path: Path, *, wal: bool) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=30, isolation_level=None)
    if wal:  # a reader leaves the file alone: the journal mode is stored in it
        db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.isolation_level = "DEFERRED"
    return db


def _create(path: Path, wanted: dict[str, str]) -> None:
    """Build a new log next to ``path`` and link it into place; when another process
    created ``path`` meanwhile, leave its log (the caller then opens and checks it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    draft = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.new")
    try:
        # a rollback journal: the committed draft is all in its one file when it is linked
        # (the writer that opens the path then turns WAL on)
        with closing(_connect(draft, wal=False)) as db:
            _initialise(db, draft, wanted)
        try:
            os.link(draft, path)  # unlike a rename, never replaces a log created meanwhile
        except FileExistsError:
            return
        _fsync_dir(path.parent)
    finally:
        draft.unlink(missing_ok=True)


def _initialise(db: sqlite3.Connection, path: Path, wanted: dict[str, str]) -> dict[str, str]:
    """Create what is missing of the schema and of the ``wanted`` meta in one write
    transaction, check the format; the meta."""
    with db:
        db.execute("BEGIN IMMEDIATE")  # a concurrent opener waits, then sees this one's meta
        for statement in _SCHEMA:
            db.execute(statement)
        meta: dict[str, str] = dict(db.execute("SELECT key, value FROM meta").fetchall())
        _check_format(path, meta.get("format", FORMAT))
        for key, value in wanted.items():
            if key not in meta:
                db.execute("INSERT INTO meta (key, value) VALUES (?, ?)", (key, value))
                meta[key] = value
    return meta


def _read_meta(db: sqlite3.Connection, path: Path) -> dict[str, str]:
    try:
        meta: dict[str, str] = dict(db.execute("SELECT key, value FROM meta").fetchall())
    except sqlite3.OperationalError as exc:
        if "no such table" not in str(exc):
            raise
        meta = {}
    if "format" not in meta:
        raise ValueError(f"{path} is not a notification log")
    _check_format(path, meta["format"])
    return meta


def _check_format(path: Path, version: str) -> None:
    if version != FORMAT:
        raise ValueError(f"{path} is a log of format {version}, not {FORMAT}")


def _fsync_dir(directory: Path) -> None:
    """Make the new directory entry durable, as the log's commits are."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
