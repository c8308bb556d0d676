"""Giving the disk space of deleted rows back to the filesystem, for the SQLite databases
in the data directory (the store, the embedded middleware, the MQTT adapter's queues).

SQLite keeps the pages of deleted rows in its file for reuse: destroying 100 of 200 pull
points on a full disk freed no byte.  With ``auto_vacuum = INCREMENTAL`` those pages can
be cut off the end of the file (``PRAGMA incremental_vacuum``), a few at a time, without
the copy of the whole database a ``VACUUM`` makes (which needs as much free space as the
database takes: none is left on a full disk).  ``journal_size_limit`` truncates the WAL
after a checkpoint, which otherwise keeps the size of its largest transaction.
"""

from __future__ import annotations

import logging
import os
import sqlite3

__all__ = ["JOURNAL_LIMIT", "VACUUM_STEP", "reclaimable", "vacuum_step"]

log = logging.getLogger("wsnmom.storage")

#: bytes the WAL is truncated to after a checkpoint
JOURNAL_LIMIT = 4 * 1024 * 1024
#: free pages cut off per step (a step holds the write lock for milliseconds)
VACUUM_STEP = 512
#: free pages below which a step does nothing (not worth a write transaction)
_MIN_FREE_PAGES = 64
#: a database still without incremental vacuum is converted at open up to this size (a
#: VACUUM copies it whole); a larger one keeps full pages until ``VACUUM`` by hand
CONVERT_LIMIT = 256 * 1024 * 1024


def reclaimable(conn: sqlite3.Connection, path: str) -> None:
    """Set incremental auto-vacuum and the WAL size limit on ``conn`` (call before the
    schema is created, outside a transaction): a new database gets it outright, an
    existing one up to :data:`CONVERT_LIMIT` bytes by a VACUUM."""
    conn.execute(f"PRAGMA journal_size_limit={JOURNAL_LIMIT}")
    if int(conn.execute("PRAGMA auto_vacuum").fetchone()[0]) == 2:
        return
    conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
    pages = int(conn.execute("PRAGMA page_count").fetchone()[0])
    if pages == 0:
        return  # a new database: the setting applies as the first table is created
    size = os.path.getsize(path) if path != ":memory:" and os.path.exists(path) else 0
    if size > CONVERT_LIMIT:
        log.info(
            "%s (%d MiB) gives the space of deleted rows back only after a VACUUM by hand",
            path,
            size // (1024 * 1024),
        )
        return
    try:
        conn.execute("VACUUM")
    except sqlite3.Error as exc:  # no room for the copy (a full disk): convert next time
        log.warning("%s keeps the space of deleted rows until it can be vacuumed: %s", path, exc)


def vacuum_step(
    conn: sqlite3.Connection, pages: int = VACUUM_STEP, *, checkpoint: bool = False
) -> int:
    """Cut up to ``pages`` free pages off the database file (outside a transaction; with
    ``checkpoint`` a passive WAL checkpoint follows, which shrinks the file); the number
    of free pages left (0 when too few to bother)."""
    free = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
    if free < _MIN_FREE_PAGES:
        return 0
    # a script steps the pragma to its end; execute() would free one page per call
    conn.executescript(f"PRAGMA incremental_vacuum({int(pages)});")
    if checkpoint:
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
    return int(conn.execute("PRAGMA freelist_count").fetchone()[0])
