"""What the gateway remembers about its MQTT session between runs (``session.sqlite3``
next to the queues): the session's client identifier and the filters the broker holds
for it, with their subscription identifiers.

After a restart the broker still has the session's subscriptions (clean start false); the
gateway compares them with the filters its subscriptions need now and unsubscribes those
nobody needs any more (a crash between deleting a subscription and the UNSUBACK leaves
one behind).  A row is written when the broker acknowledged a filter and deleted when it
acknowledged its removal.  Used from one thread at a time (the session's worker, and
``open``); a lock guards it anyway.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import uuid

__all__ = ["SessionState"]

log = logging.getLogger("wsnmom.adapters.mqtt")

FILE = "session.sqlite3"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS filters(filter TEXT PRIMARY KEY, sid INTEGER NOT NULL);
"""


class SessionState:
    """The session's client id and subscribed filters, in a small SQLite file."""

    def __init__(self, directory: str, file: str = FILE) -> None:
        os.makedirs(directory, exist_ok=True)
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(
            os.path.join(directory, file), check_same_thread=False, isolation_level=None
        )
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.executescript(_SCHEMA)

    def client_id(self) -> str | None:
        """The client identifier the session was created with, if any."""
        with self._lock:
            row = self._conn.execute("SELECT value FROM meta WHERE key = 'client_id'").fetchone()
        return str(row[0]) if row else None

    def set_client_id(self, client_id: str) -> None:
        """Remember ``client_id``; the filters of an earlier one are forgotten."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            self._conn.execute(
                "INSERT OR REPLACE INTO meta(key, value) VALUES ('client_id', ?)", (client_id,)
            )
            self._conn.execute("DELETE FROM filters")
            self._conn.execute("COMMIT")

    def settle_client_id(self, wanted: str | None) -> str:
        """The session's client id: ``wanted`` when given, else the one kept here, else a
        new one (``wsnmom-<random>``); kept for the next run.  A changed id is logged: the
        broker's session of the old one, and what it holds, is no longer used."""
        stored = self.client_id()
        if wanted is not None and stored is not None and wanted != stored:
            log.warning(
                "MQTT client_id changed from %r to %r: the broker's session of the old id "
                "(and what it holds) is no longer used",
                stored,
                wanted,
            )
        client_id = wanted or stored or f"wsnmom-{uuid.uuid4().hex[:16]}"
        if client_id != stored:
            self.set_client_id(client_id)
        return client_id

    def filters(self) -> dict[str, int]:
        """Filter -> subscription identifier, as the broker acknowledged them."""
        with self._lock:
            return {
                str(f): int(s) for f, s in self._conn.execute("SELECT filter, sid FROM filters")
            }

    def update(self, added: list[tuple[str, int]], removed: list[tuple[str, int]]) -> None:
        """Filters the broker acknowledged (``added``) and removed (``removed``; a row
        is deleted only when it still has that identifier)."""
        if not added and not removed:
            return
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self._conn.executemany("DELETE FROM filters WHERE filter = ? AND sid = ?", removed)
                self._conn.executemany(
                    "INSERT OR REPLACE INTO filters(filter, sid) VALUES (?, ?)", added
                )
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def clear_filters(self) -> None:
        """The broker lost the session: it holds no filter."""
        with self._lock:
            self._conn.execute("DELETE FROM filters")

    def close(self) -> None:
        with self._lock:
            self._conn.close()
