"""The SQLite store (:class:`SqliteStore`), the default implementation of
``core.store.Store``: plain ``sqlite3``, WAL journal, one connection guarded by a lock,
parameterised SQL, a ``schema_version`` table; each record a JSON document
(``core.store_documents``) next to the columns queries need.  Its schema, migration and
the SQLite it needs: ``core.store_sqlite_schema`` (whose names are imported from here too)."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from wsnmom.core.lifetimes import is_expired
from wsnmom.core.model import (
    EndpointReference,
    NotificationMessage,
    PublisherRegistration,
    PullPoint,
    Subscription,
)
from wsnmom.core.sqlite_space import reclaimable, vacuum_step
from wsnmom.core.store import IntentGone, Store, StoreError
from wsnmom.core.store_documents import (
    message_from_json,
    message_to_json,
    pull_point_from_json,
    pull_point_to_json,
    registration_demand_to_json,
    registration_from_json,
    registration_termination_to_json,
    registration_to_json,
    subscription_from_json,
    subscription_to_json,
    time_to_json,
)
from wsnmom.core.store_sqlite_schema import SCHEMA_VERSION, SQLITE_NEEDED, SqliteTooOld, migrate
from wsnmom.topic_mapping.model import Topic

__all__ = ["SCHEMA_VERSION", "SqliteStore", "SqliteTooOld", "sqlite_path"]

#: ids asked in one statement by ``held`` (SQLite binds at most 32,766 parameters)
_HELD_AT_ONCE = 10_000


def _sqlite_revised(row: tuple[Any, ...]) -> Subscription:
    """A subscription from its row's document and revision."""
    sub = subscription_from_json(json.loads(row[0]))
    sub.revision = int(row[1])
    return sub


def sqlite_path(url: str) -> str:
    """The file path of a ``sqlite:///`` URL (``:memory:`` allowed)."""
    prefix = "sqlite:///"
    if not url.startswith(prefix):
        raise StoreError(f"not a SQLite store URL: {url!r} (expected sqlite:///PATH)")
    path = url[len(prefix) :]
    if not path:
        raise StoreError(f"SQLite store URL without a path: {url!r}")
    return path


class SqliteStore(Store):
    """SQLite implementation of :class:`Store`."""

    def __init__(self, path: str) -> None:
        if sqlite3.sqlite_version_info < SQLITE_NEEDED:
            raise SqliteTooOld(sqlite3.sqlite_version)
        self.path = path
        if path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        try:
            self._conn: sqlite3.Connection | None = sqlite3.connect(
                path, check_same_thread=False, isolation_level=None, timeout=30.0
            )
            reclaimable(self._conn, path)
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._migrate()
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open SQLite store {path!r}: {exc}") from exc

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._conn is None:
                raise StoreError("store is closed")
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                # also after a COMMIT that failed (a full disk): a transaction left open
                # would refuse every later one until a restart
                if conn.in_transaction:
                    with suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                raise

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            if self._conn is None:
                raise StoreError("store is closed")
            return list(self._conn.execute(sql, params).fetchall())

    def _migrate(self) -> None:
        with self._tx() as conn:
            migrate(conn)

    @property
    def schema_version(self) -> int:
        """The schema version recorded in the store."""
        return int(self._query("SELECT version FROM schema_version")[0][0])

    # subscriptions
    def put_subscription(self, sub: Subscription) -> None:
        with self._tx() as conn:
            self._write_subscription(conn, sub)

    def add_subscription(self, sub: Subscription) -> None:
        with self._tx() as conn:
            self._claim(conn, sub.id)
            self._write_subscription(conn, sub)

    @staticmethod
    def _claim(conn: sqlite3.Connection, name: str) -> None:
        if conn.execute("DELETE FROM intents WHERE name = ?", (name,)).rowcount == 0:
            raise IntentGone(name)

    @staticmethod
    def _write_subscription(conn: sqlite3.Connection, sub: Subscription) -> None:
        row = conn.execute(
            "INSERT INTO subscriptions (id, termination_time, data, revision) "
            "VALUES (?, ?, ?, 1) ON CONFLICT (id) DO UPDATE SET "
            "termination_time = excluded.termination_time, data = excluded.data, "
            "revision = subscriptions.revision + 1 RETURNING revision",
            (sub.id, time_to_json(sub.termination_time), json.dumps(subscription_to_json(sub))),
        ).fetchone()
        sub.revision = int(row[0])

    def update_subscription(self, sub: Subscription) -> bool:
        with self._tx() as conn:
            row = conn.execute(
                "UPDATE subscriptions SET termination_time = ?, data = ?, "
                "revision = revision + 1 WHERE id = ? AND revision = ? RETURNING revision",
                (
                    time_to_json(sub.termination_time),
                    json.dumps(subscription_to_json(sub)),
                    sub.id,
                    sub.revision,
                ),
            ).fetchone()
        if row is None:
            return False
        sub.revision = int(row[0])
        return True

    def get_subscription(self, sub_id: str) -> Subscription | None:
        rows = self._query("SELECT data, revision FROM subscriptions WHERE id = ?", (sub_id,))
        return _sqlite_revised(rows[0]) if rows else None

    def delete_subscription(self, sub_id: str, *, intent: bool = False) -> bool:
        with self._tx() as conn:
            gone = conn.execute("DELETE FROM subscriptions WHERE id = ?", (sub_id,)).rowcount
            if gone and intent:
                self._intend(conn, sub_id)
        self._reclaim()
        return gone > 0

    def expire_subscription(self, sub_id: str, now: datetime, *, epoch: int) -> bool:
        # one instance opens the file: it leads, under the one epoch there is
        with self._tx() as conn:
            rows = conn.execute(
                "SELECT data, revision FROM subscriptions WHERE id = ?", (sub_id,)
            ).fetchall()
            if not rows or not is_expired(_sqlite_revised(rows[0]).termination_time, now):
                return False
            conn.execute("DELETE FROM subscriptions WHERE id = ?", (sub_id,))
            self._intend(conn, sub_id)
        self._reclaim()
        return True

    def list_subscriptions(self) -> list[Subscription]:
        rows = self._query("SELECT data, revision FROM subscriptions ORDER BY rowid")
        return [_sqlite_revised(r) for r in rows]

    # pull points
    def put_pull_point(self, pp: PullPoint) -> None:
        with self._tx() as conn:
            self._write_pull_point(conn, pp)

    def add_pull_point(self, pp: PullPoint) -> None:
        with self._tx() as conn:
            self._claim(conn, pp.id)
            self._write_pull_point(conn, pp)

    @staticmethod
    def _write_pull_point(conn: sqlite3.Connection, pp: PullPoint) -> None:
        conn.execute(
            "INSERT OR REPLACE INTO pull_points (id, name, termination_time, data) "
            "VALUES (?, ?, ?, ?)",
            (pp.id, pp.name, time_to_json(pp.termination_time), json.dumps(pull_point_to_json(pp))),
        )

    # intents
    def put_intent(self, name: str, at: datetime | None = None) -> None:
        with self._tx() as conn:
            self._intend(conn, name, at)

    @staticmethod
    def _intend(conn: sqlite3.Connection, name: str, at: datetime | None = None) -> None:
        when = time.time() if at is None else at.timestamp()
        conn.execute("INSERT OR REPLACE INTO intents (name, at) VALUES (?, ?)", (name, when))

    def delete_intent(self, name: str, older_than: float | None = None) -> bool:
        cutoff = float("inf") if older_than is None else time.time() - older_than
        with self._tx() as conn:
            sql = "DELETE FROM intents WHERE name = ? AND at <= ?"
            return conn.execute(sql, (name, cutoff)).rowcount > 0

    def list_intents(self, older_than: float = 0.0) -> list[tuple[str, datetime]]:
        rows = self._query(
            "SELECT name, at FROM intents WHERE at <= ? ORDER BY at, name",
            (time.time() - older_than,),
        )
        return [(str(r[0]), datetime.fromtimestamp(float(r[1]), UTC)) for r in rows]

    def get_pull_point(self, pp_id: str) -> PullPoint | None:
        rows = self._query("SELECT data FROM pull_points WHERE id = ?", (pp_id,))
        return pull_point_from_json(json.loads(rows[0][0])) if rows else None

    def held(self, ids: Collection[str]) -> set[str]:
        wanted = sorted(set(ids))
        found: set[str] = set()
        for at in range(0, len(wanted), _HELD_AT_ONCE):  # SQLite's bound on parameters
            part = wanted[at : at + _HELD_AT_ONCE]
            marks = ", ".join("?" * len(part))
            rows = self._query(
                f"SELECT id FROM subscriptions WHERE id IN ({marks}) "
                f"UNION SELECT id FROM pull_points WHERE id IN ({marks})",
                (*part, *part),
            )
            found.update(str(row[0]) for row in rows)
        return found

    def find_pull_point(self, name: str) -> PullPoint | None:
        rows = self._query("SELECT data FROM pull_points WHERE name = ?", (name,))
        return pull_point_from_json(json.loads(rows[0][0])) if rows else None

    def delete_pull_point(self, pp_id: str, *, intent: bool = False) -> bool:
        with self._tx() as conn:
            gone = conn.execute("DELETE FROM pull_points WHERE id = ?", (pp_id,)).rowcount
            if gone and intent:
                self._intend(conn, pp_id)
        self._reclaim()
        return gone > 0

    def expire_pull_point(self, pp_id: str, now: datetime, *, epoch: int) -> bool:
        with self._tx() as conn:
            rows = conn.execute("SELECT data FROM pull_points WHERE id = ?", (pp_id,))
            found = [pull_point_from_json(json.loads(r[0])) for r in rows.fetchall()]
            if not found or not is_expired(found[0].termination_time, now):
                return False
            conn.execute("DELETE FROM pull_points WHERE id = ?", (pp_id,))
            self._intend(conn, pp_id)
        self._reclaim()
        return True

    def list_pull_points(self) -> list[PullPoint]:
        rows = self._query("SELECT data FROM pull_points ORDER BY rowid")
        return [pull_point_from_json(json.loads(r[0])) for r in rows]

    # registrations
    def put_registration(self, reg: PublisherRegistration) -> None:
        with self._tx() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO registrations (id, termination_time, data) "
                "VALUES (?, ?, ?)",
                (reg.id, time_to_json(reg.termination_time), json.dumps(registration_to_json(reg))),
            )

    def get_registration(self, reg_id: str) -> PublisherRegistration | None:
        rows = self._query("SELECT data FROM registrations WHERE id = ?", (reg_id,))
        return registration_from_json(json.loads(rows[0][0])) if rows else None

    def renew_registration(self, reg_id: str, termination_time: datetime | None) -> bool:
        return self._patch_registration(
            reg_id,
            registration_termination_to_json(termination_time),
            termination_time=time_to_json(termination_time),
        )

    def save_registration_demand(
        self, reg_id: str, subscription: EndpointReference | None, paused: bool, *, epoch: int
    ) -> bool:
        # one instance opens the file: it leads, under the one epoch there is
        return self._patch_registration(reg_id, registration_demand_to_json(subscription, paused))

    def _patch_registration(self, reg_id: str, part: dict[str, Any], **columns: Any) -> bool:
        """Merge ``part`` into the stored document and write ``columns`` next to it, in one
        write transaction: no other write of the file comes between the read and the
        write."""
        with self._tx() as conn:
            row = conn.execute("SELECT data FROM registrations WHERE id = ?", (reg_id,)).fetchone()
            if row is None:
                return False
            sets = ", ".join(f"{name} = ?" for name in ("data", *columns))
            conn.execute(
                f"UPDATE registrations SET {sets} WHERE id = ?",
                (json.dumps({**json.loads(row[0]), **part}), *columns.values(), reg_id),
            )
        return True

    def delete_registration(self, reg_id: str) -> PublisherRegistration | None:
        with self._tx() as conn:
            rows = conn.execute(
                "DELETE FROM registrations WHERE id = ? RETURNING data", (reg_id,)
            ).fetchall()
        self._reclaim()
        return registration_from_json(json.loads(rows[0][0])) if rows else None

    def expire_registration(
        self, reg_id: str, now: datetime, *, epoch: int
    ) -> PublisherRegistration | None:
        with self._tx() as conn:
            rows = conn.execute("SELECT data FROM registrations WHERE id = ?", (reg_id,))
            found = [registration_from_json(json.loads(r[0])) for r in rows.fetchall()]
            if not found or not is_expired(found[0].termination_time, now):
                return None
            conn.execute("DELETE FROM registrations WHERE id = ?", (reg_id,))
        self._reclaim()
        return found[0]

    def _reclaim(self) -> None:
        """Give free pages back to the filesystem once enough have gathered."""
        with self._lock:
            if self._conn is not None:
                with suppress(sqlite3.Error):
                    vacuum_step(self._conn, checkpoint=True)

    def list_registrations(self) -> list[PublisherRegistration]:
        rows = self._query("SELECT data FROM registrations ORDER BY rowid")
        return [registration_from_json(json.loads(r[0])) for r in rows]

    # current messages
    def put_current_message(self, message: NotificationMessage) -> None:
        if message.topic is None:
            raise ValueError("a current message needs a topic")
        with self._tx() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO current_messages (namespace, path, data) VALUES (?, ?, ?)",
                (
                    message.topic.namespace,
                    "/".join(message.topic.path),
                    json.dumps(message_to_json(message)),
                ),
            )

    def get_current_message(self, topic: Topic) -> NotificationMessage | None:
        rows = self._query(
            "SELECT data FROM current_messages WHERE namespace = ? AND path = ?",
            (topic.namespace, "/".join(topic.path)),
        )
        return message_from_json(json.loads(rows[0][0])) if rows else None

    def list_current_messages(self) -> list[NotificationMessage]:
        rows = self._query("SELECT data FROM current_messages ORDER BY namespace, path")
        return [message_from_json(json.loads(r[0])) for r in rows]

    def record_topics(self, topics: Sequence[Topic], within: int | None = None) -> list[Topic]:
        rows = [(t.namespace, "/".join(t.path)) for t in topics]
        insert = "INSERT OR IGNORE INTO topics (namespace, path) VALUES (?, ?)"
        refused: list[Topic] = []
        with self._tx() as conn:  # one writer at a time: the count cannot go stale
            if within is None:
                conn.executemany(insert, rows)
                return refused
            room = within - int(conn.execute("SELECT count(*) FROM topics").fetchone()[0])
            for topic, row in zip(topics, rows, strict=True):
                known = conn.execute(
                    "SELECT 1 FROM topics WHERE namespace = ? AND path = ?", row
                ).fetchone()
                if known is not None:
                    continue
                if room <= 0:
                    refused.append(topic)
                    continue
                room -= 1
                conn.execute(insert, row)
        return refused

    def list_topics(self) -> list[Topic]:
        rows = self._query("SELECT namespace, path FROM topics ORDER BY rowid")
        return [Topic(str(r[0]), tuple(str(r[1]).split("/"))) for r in rows]

    def put_upstream(self, name: str, data: dict[str, Any]) -> None:
        with self._tx() as conn:
            conn.execute(
                "INSERT INTO upstreams (id, data) VALUES (?, ?) "
                "ON CONFLICT (id) DO UPDATE SET data = excluded.data",
                (name, json.dumps(data)),
            )

    def delete_upstream(self, name: str) -> bool:
        with self._tx() as conn:
            return conn.execute("DELETE FROM upstreams WHERE id = ?", (name,)).rowcount > 0

    def list_upstreams(self) -> list[dict[str, Any]]:
        rows = self._query("SELECT data FROM upstreams ORDER BY rowid")
        return [dict(json.loads(r[0])) for r in rows]

    def get_meta(self, key: str) -> str | None:
        rows = self._query("SELECT value FROM meta WHERE key = ?", (key,))
        return str(rows[0][0]) if rows else None

    def set_meta(self, key: str, value: str, *, epoch: int | None = None) -> None:
        # one instance opens the file: it leads, under the one epoch there is
        with self._tx() as conn:
            conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def fence(self, epoch: int) -> None:
        pass  # one instance opens the file: it leads, under the one epoch there is

    def ping(self) -> bool:
        try:
            self._query("SELECT 1")
        except (sqlite3.Error, StoreError):
            return False
        return True

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
