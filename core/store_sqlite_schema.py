"""The SQLite store's schema (``core.store_sqlite``) and the SQLite it needs.

The tables are created when missing (:data:`SCHEMA`) and the version the store records is
brought to :data:`SCHEMA_VERSION` (:func:`migrate`, in the transaction that opens the
store); a store whose version is newer than this wsnmom is refused.  A Python whose SQLite
library is older than :data:`SQLITE_NEEDED` cannot open the store at all
(:class:`SqliteTooOld`).
"""

from __future__ import annotations

import sqlite3

from wsnmom.core.store import StoreError

__all__ = ["SCHEMA", "SCHEMA_VERSION", "SQLITE_NEEDED", "SqliteTooOld", "migrate"]

#: 2: subscriptions have a revision every write bumps (``Subscription.revision``);
#: 3: intents, the durable subscriptions being made (``Store.put_intent``);
#: 4: recorded topics (``Store.record_topics``)
SCHEMA_VERSION = 4


class SqliteTooOld(StoreError):
    """The Python's SQLite library is older than the embedded store needs."""

    def __init__(self, found: str) -> None:
        super().__init__(
            f"the embedded store needs SQLite {_version(SQLITE_NEEDED)} or later, this "
            f"Python has SQLite {found}; use a Python built with a newer SQLite, or a "
            "PostgreSQL store (--store postgresql://...)"
        )


#: the oldest SQLite the embedded store runs on (``INSERT|UPDATE|DELETE ... RETURNING``: 3.35)
SQLITE_NEEDED = (3, 35, 0)


def _version(info: tuple[int, ...]) -> str:
    return ".".join(str(n) for n in info)


#: the tables and indexes, each created when missing
SCHEMA = [
    """CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS subscriptions (
        id TEXT PRIMARY KEY, termination_time TEXT, data TEXT NOT NULL,
        revision INTEGER NOT NULL DEFAULT 0)""",
    """CREATE TABLE IF NOT EXISTS pull_points (
        id TEXT PRIMARY KEY, name TEXT, termination_time TEXT, data TEXT NOT NULL)""",
    """CREATE INDEX IF NOT EXISTS pull_points_name ON pull_points (name)""",
    """CREATE TABLE IF NOT EXISTS registrations (
        id TEXT PRIMARY KEY, termination_time TEXT, data TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS current_messages (
        namespace TEXT NOT NULL, path TEXT NOT NULL, data TEXT NOT NULL,
        PRIMARY KEY (namespace, path))""",
    """CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS upstreams (id TEXT PRIMARY KEY, data TEXT NOT NULL)""",
    # at: seconds since the epoch (one instance opens the file: its clock is the store's)
    """CREATE TABLE IF NOT EXISTS intents (name TEXT PRIMARY KEY, at REAL NOT NULL)""",
    # recorded topics: what ``wsnmom store migrate`` carries into a cluster's store
    """CREATE TABLE IF NOT EXISTS topics (
        namespace TEXT NOT NULL, path TEXT NOT NULL, PRIMARY KEY (namespace, path))""",
]


def migrate(conn: sqlite3.Connection) -> None:
    """Create what is missing and bring an older schema to :data:`SCHEMA_VERSION`, on
    ``conn`` inside its transaction; :raises StoreError: the store's schema is newer."""
    for stmt in SCHEMA:
        conn.execute(stmt)
    row = conn.execute("SELECT version FROM schema_version").fetchone()
    if row is None:
        conn.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
    elif row[0] > SCHEMA_VERSION:
        raise StoreError(
            f"store schema version {row[0]} is newer than this wsnmom ({SCHEMA_VERSION})"
        )
    elif row[0] < SCHEMA_VERSION:
        columns = {r[1] for r in conn.execute("PRAGMA table_info(subscriptions)")}
        if "revision" not in columns:  # version 1
            conn.execute("ALTER TABLE subscriptions ADD COLUMN revision INTEGER NOT NULL DEFAULT 0")
        conn.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))
