"""The sink's ledger: which batches a ``wsn_notify`` sink has published, and how far.

A micro-batch can run again: after a failure Spark replays the last batch of the
checkpoint, and the sink's ``commit`` may have published it already.  The sink publishes
the rows of a batch in a fixed order (partition, then row), in chunks, and records after
every chunk how many rows of the batch are out.  A replay skips what the ledger counts, so
every (batch, partition, row) is published once.  The one window left is a crash after the
middleware confirmed a chunk and before the ledger recorded it: that chunk goes out again,
with the same deterministic message ids (``<sink>/<batch>/<partition>/<row>``), which a
consumer can use to drop it.

SQLite, one file, on the driver's disk (commits run on the driver); several sinks may
share one file (``sink`` names them).
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

__all__ = ["Ledger"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS published (
    sink TEXT NOT NULL,
    batch TEXT NOT NULL,
    rows INTEGER NOT NULL,
    total INTEGER NOT NULL,
    complete INTEGER NOT NULL DEFAULT 0,
    updated REAL NOT NULL,
    PRIMARY KEY (sink, batch)
);
"""


class Ledger:
    """Progress of a sink's batches (see the module docstring)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        with self._db:
            self._db.executescript(_SCHEMA)

    def close(self) -> None:
        """Close the file."""
        self._db.close()

    def progress(self, sink: str, batch: str) -> tuple[int, bool]:
        """``(rows published, complete)`` of ``batch``; ``(0, False)`` when unknown."""
        row = self._db.execute(
            "SELECT rows, complete FROM published WHERE sink = ? AND batch = ?", (sink, batch)
        ).fetchone()
        return (0, False) if row is None else (int(row[0]), bool(row[1]))

    def record(self, sink: str, batch: str, rows: int, total: int, complete: bool) -> None:
        """Durably note that the first ``rows`` of ``batch`` are published."""
        with self._db:
            self._db.execute(
                "INSERT INTO published (sink, batch, rows, total, complete, updated) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (sink, batch) DO UPDATE SET "
                "rows = excluded.rows, total = excluded.total, complete = excluded.complete, "
                "updated = excluded.updated",
                (sink, batch, rows, total, int(complete), time.time()),
            )

    def batches(self, sink: str) -> list[tuple[str, int, int, bool]]:
        """``(batch, rows, total, complete)`` of every batch of ``sink`` (tooling)."""
        rows = self._db.execute(
            "SELECT batch, rows, total, complete FROM published WHERE sink = ? ORDER BY updated",
            (sink,),
        ).fetchall()
        return [(str(b), int(r), int(t), bool(c)) for b, r, t, c in rows]
