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
own connections and never block the writer.

No pyspark here: the buffer runs without Spark.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from wsnmom.adapters.logbase.public import LogRecord
from wsnmom.topic_mapping.model import Topic

__all__ = ["FORMAT", "Entry", "NotificationLog"]

#: the file format version stored in the log's ``meta`` table
FORMAT = "1"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS records (
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
);
CREATE INDEX IF NOT EXISTS records_digest ON records (digest) WHERE digest IS NOT NULL;
"""


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
        if not create and not self.path.exists():
            raise FileNotFoundError(f"no notification log at {self.path}")
        if create:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        db = self._db()
        with db:
            db.executescript(_SCHEMA)
            meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
            version = meta.get("format")
            if version is not None and version != FORMAT:
                raise ValueError(f"{self.path} is a log of format {version}, not {FORMAT}")
            wanted = {"format": FORMAT}
            if name is not None:
                wanted["name"] = name
            if middleware is not None:
                wanted["middleware"] = middleware
            for key, value in wanted.items():
                if key not in meta:
                    db.execute("INSERT INTO meta (key, value) VALUES (?, ?)", (key, value))
                    meta[key] = value
        self.name = meta.get("name") or self.path.stem
        self.middleware = meta.get("middleware") or "log"

    def _db(self) -> sqlite3.Connection:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.isolation_level = "DEFERRED"
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
