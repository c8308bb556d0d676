"""The PostgreSQL store: the same records as the SQLite store, in a server several gateway
instances can share.

Opened for ``postgresql://user:password@host:port/database`` (``postgres://`` too) through
psycopg 3 with a connection pool (extra ``postgres``).  Records are JSON documents (jsonb)
next to the columns queries need, as in SQLite, so ``wsnmom store migrate`` copies them
one to one.

The schema is versioned by numbered migrations (:data:`MIGRATIONS`, the table
``wsnmom_schema``).  Every instance runs the missing ones at start inside one transaction
that holds a transaction-scoped advisory lock, so when several instances start together
one migrates and the others wait for it, then find nothing left to do.  A store whose
version is newer than this wsnmom is refused.

Connection trouble surfaces as :class:`~wsnmom.core.store.StoreUnavailable` (a
:class:`~wsnmom.core.store.StoreError`): the frontend answers it with a Receiver fault
and HTTP 503, and ``ping`` (``/readyz``) says the store is not answering.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import urlsplit

from wsnmom.core.coordination import Coordination
from wsnmom.core.model import NotificationMessage, PublisherRegistration, PullPoint, Subscription
from wsnmom.core.store import IntentGone, Store, StoreError, StoreUnavailable
from wsnmom.core.store_documents import (
    message_from_json,
    message_to_json,
    pull_point_from_json,
    pull_point_to_json,
    registration_from_json,
    registration_to_json,
    subscription_from_json,
    subscription_to_json,
)
from wsnmom.topic_mapping.model import Topic

#: the advisory-lock key migrations serialise on ("wsnm" as a number)
MIGRATION_LOCK = 0x77736E6D

#: numbered migrations: version -> statements; never edit one that was released, add one
MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        """CREATE TABLE subscriptions (
            id TEXT PRIMARY KEY, seq BIGSERIAL, termination_time TIMESTAMPTZ,
            data JSONB NOT NULL)""",
        """CREATE TABLE pull_points (
            id TEXT PRIMARY KEY, seq BIGSERIAL, name TEXT, termination_time TIMESTAMPTZ,
            data JSONB NOT NULL)""",
        "CREATE INDEX pull_points_name ON pull_points (name)",
        """CREATE TABLE registrations (
            id TEXT PRIMARY KEY, seq BIGSERIAL, termination_time TIMESTAMPTZ,
            data JSONB NOT NULL)""",
        """CREATE TABLE current_messages (
            namespace TEXT NOT NULL, path TEXT NOT NULL, data JSONB NOT NULL,
            PRIMARY KEY (namespace, path))""",
    ),
    2: ("CREATE TABLE wsnmom_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",),
    # the cluster (core.coordination_postgres): every write of a resource leaves a row in
    # the change log (origin: the writer's application_name, its instance id) and wakes
    # the other instances with NOTIFY; instances and shard leases with epochs
    3: (
        """CREATE TABLE wsnmom_changes (
            seq BIGSERIAL PRIMARY KEY, kind TEXT NOT NULL, id TEXT NOT NULL,
            origin TEXT NOT NULL, at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())""",
        """CREATE FUNCTION wsnmom_note_change() RETURNS trigger LANGUAGE plpgsql AS $$
        DECLARE rid TEXT;
        BEGIN
            IF TG_OP = 'DELETE' THEN rid := OLD.id; ELSE rid := NEW.id; END IF;
            INSERT INTO wsnmom_changes (kind, id, origin)
                VALUES (TG_ARGV[0], rid, current_setting('application_name'));
            PERFORM pg_notify('wsnmom_changes', TG_ARGV[0]);
            RETURN NULL;
        END $$""",
        """CREATE TRIGGER subscriptions_changed AFTER INSERT OR UPDATE OR DELETE
            ON subscriptions FOR EACH ROW EXECUTE FUNCTION wsnmom_note_change('subscription')""",
        """CREATE TRIGGER pull_points_changed AFTER INSERT OR UPDATE OR DELETE
            ON pull_points FOR EACH ROW EXECUTE FUNCTION wsnmom_note_change('pull_point')""",
        """CREATE TRIGGER registrations_changed AFTER INSERT OR UPDATE OR DELETE
            ON registrations FOR EACH ROW EXECUTE FUNCTION wsnmom_note_change('registration')""",
        """CREATE TABLE wsnmom_instances (
            id TEXT PRIMARY KEY, address TEXT NOT NULL, version TEXT NOT NULL,
            started_at TIMESTAMPTZ NOT NULL DEFAULT now(), heartbeat TIMESTAMPTZ NOT NULL)""",
        """CREATE TABLE wsnmom_shards (
            shard INTEGER PRIMARY KEY, owner TEXT, epoch BIGINT NOT NULL DEFAULT 0,
            expires_at TIMESTAMPTZ NOT NULL)""",
    ),
    # upstreams added at run time (``wsnmom upstream add``)
    4: ("CREATE TABLE upstreams (id TEXT PRIMARY KEY, seq BIGSERIAL, data JSONB NOT NULL)",),
    # every write of a subscription bumps its revision; an instance follows a stored
    # change only when its revision is higher than the one it holds (``core.follow``)
    5: ("ALTER TABLE subscriptions ADD COLUMN revision BIGINT NOT NULL DEFAULT 0",),
    # the nonce of every request one instance forwarded to another, kept while its
    # signature is valid: a replayed request is refused (``core.coordination_postgres``)
    6: (
        """CREATE TABLE wsnmom_nonces (
            nonce TEXT PRIMARY KEY, expires_at TIMESTAMPTZ NOT NULL)""",
        "CREATE INDEX wsnmom_nonces_expiry ON wsnmom_nonces (expires_at)",
    ),
    # the NOTIFY of a change names its writer (its instance id) instead of its kind: an
    # instance is not woken by its own writes (``PostgresCoordination.wait``)
    7: (
        """CREATE OR REPLACE FUNCTION wsnmom_note_change() RETURNS trigger
        LANGUAGE plpgsql AS $$
        DECLARE rid TEXT; writer TEXT := current_setting('application_name');
        BEGIN
            IF TG_OP = 'DELETE' THEN rid := OLD.id; ELSE rid := NEW.id; END IF;
            INSERT INTO wsnmom_changes (kind, id, origin) VALUES (TG_ARGV[0], rid, writer);
            PERFORM pg_notify('wsnmom_changes', writer);
            RETURN NULL;
        END $$""",
    ),
    # intents: durable subscriptions being made before their record is written; the
    # record's write removes its intent in the same statement (``core.orphans``)
    8: (
        """CREATE TABLE wsnmom_intents (
            name TEXT PRIMARY KEY, at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())""",
    ),
}
SCHEMA_VERSION = max(MIGRATIONS)

#: seconds a connection attempt may take before the store counts as unreachable
CONNECT_TIMEOUT = 5.0
#: seconds a request waits for a pooled connection before the store counts as overloaded
POOL_TIMEOUT = 10.0
#: while the server is down, seconds between the connection attempts that look for it
PROBE_INTERVAL = 1.0

T = TypeVar("T")


class PostgresStore(Store):
    """PostgreSQL implementation of :class:`~wsnmom.core.store.Store`."""

    def __init__(
        self, url: str, *, min_size: int = 1, max_size: int = 8, instance_id: str = ""
    ) -> None:
        try:
            import psycopg
            import psycopg_pool  # noqa: F401
            from psycopg.types.json import Jsonb
        except ImportError as exc:
            raise StoreError(
                f"a PostgreSQL store needs psycopg 3 ({exc}): pip install 'wsnmom[postgres]'"
            ) from None
        parts = urlsplit(url)
        if not parts.hostname and "host=" not in parts.query:
            raise StoreError(f"PostgreSQL store URL without a host: {url!r}")
        self._psycopg = psycopg
        self._jsonb = Jsonb
        self._closed = False
        self._lock = threading.Lock()
        try:  # one plain attempt first: a refused connection fails at once, with its reason
            psycopg.connect(url, connect_timeout=int(CONNECT_TIMEOUT)).close()
        except psycopg.Error as exc:
            raise StoreUnavailable(f"cannot connect to the PostgreSQL store: {exc}") from None
        self._url = url
        self._sizes = (min_size, max_size)
        #: the connections' application_name: the origin of the changes this instance
        #: writes, which its own change follower skips
        self.instance_id = instance_id or "wsnmom"
        #: monotonic time of the last failed use while the server does not answer (None: up)
        self._down_since: float | None = None
        self._last_probe = 0.0
        self._recovering = threading.Lock()
        try:
            self._pool = self._new_pool()
        except Exception as exc:  # psycopg_pool.PoolTimeout, psycopg.Error
            raise StoreUnavailable(f"cannot open the PostgreSQL store: {exc}") from None
        try:
            self._migrate()
        except BaseException:
            self._pool.close()
            raise

    # ------------------------------------------------------------------ plumbing

    def _new_pool(self) -> Any:
        from psycopg_pool import ConnectionPool

        min_size, max_size = self._sizes
        pool = ConnectionPool(
            self._url,
            min_size=min_size,
            max_size=max_size,
            timeout=POOL_TIMEOUT,
            kwargs={
                "connect_timeout": int(CONNECT_TIMEOUT),
                # transactions are explicit (``_tx``); a lone statement commits by itself
                "autocommit": True,
                "application_name": self.instance_id,
            },
            open=False,
            name="wsnmom-store",
        )
        pool.open(wait=True, timeout=CONNECT_TIMEOUT * 2)
        return pool

    def _require_server(self) -> None:
        """While the server was found down: refuse at once, except for one probe per
        :data:`PROBE_INTERVAL`; when the probe connects, start a fresh pool (the old one
        may be waiting out its reconnection backoff) and carry on."""
        if self._down_since is None:
            return
        now = time.monotonic()
        if now - self._last_probe < PROBE_INTERVAL or not self._recovering.acquire(False):
            raise StoreUnavailable("the PostgreSQL store is not answering")
        try:
            self._last_probe = now
            try:
                self._psycopg.connect(self._url, connect_timeout=int(CONNECT_TIMEOUT)).close()
            except self._psycopg.Error as exc:
                raise StoreUnavailable(f"the PostgreSQL store is not answering: {exc}") from None
            old, self._pool = self._pool, self._new_pool()
            self._down_since = None
            old.close(timeout=0)
        finally:
            self._recovering.release()

    def _down(self, why: str) -> StoreUnavailable:
        if self._down_since is None:
            self._down_since = time.monotonic()
            self._last_probe = self._down_since
        return StoreUnavailable(why)

    @contextmanager
    def _tx(self) -> Iterator[Any]:
        """A pooled connection inside one transaction (see :meth:`_conn`)."""
        with self._conn() as conn, conn.transaction():
            yield conn

    @contextmanager
    def _conn(self) -> Iterator[Any]:
        """A pooled connection in autocommit: each statement is a transaction of its own,
        one round trip (a transaction block costs two more, BEGIN and COMMIT), so a
        single-statement write or read runs here, several that must commit together in
        :meth:`_tx`.  Connection trouble becomes StoreUnavailable (and later uses fail at
        once until a probe connects again), other database errors StoreError."""
        if self._closed:
            raise StoreError("store is closed")
        self._require_server()
        psycopg = self._psycopg
        try:
            with self._pool.connection() as conn:
                yield conn
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            raise self._down(f"the PostgreSQL store is not answering: {exc}") from None
        except psycopg.Error as exc:
            raise StoreError(f"PostgreSQL store error: {exc}") from None
        except Exception as exc:
            if type(exc).__name__ == "PoolTimeout":
                raise self._down(
                    f"no PostgreSQL connection free within {POOL_TIMEOUT:.0f}s"
                ) from None
            raise

    def _rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._conn() as conn:
            return list(conn.execute(sql, params).fetchall())

    def _count(self, sql: str, params: tuple[Any, ...]) -> int:
        with self._conn() as conn:
            return int(conn.execute(sql, params).rowcount)

    def _migrate(self) -> None:
        with self._tx() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            conn.execute(
                "CREATE TABLE IF NOT EXISTS wsnmom_schema ("
                "version INTEGER PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
            )
            row = conn.execute("SELECT max(version) FROM wsnmom_schema").fetchone()
            current = int(row[0]) if row and row[0] is not None else 0
            if current > SCHEMA_VERSION:
                raise StoreError(
                    f"store schema version {current} is newer than this wsnmom "
                    f"({SCHEMA_VERSION}); upgrade wsnmom"
                )
            for version in sorted(v for v in MIGRATIONS if v > current):
                for statement in MIGRATIONS[version]:
                    conn.execute(statement)
                conn.execute("INSERT INTO wsnmom_schema (version) VALUES (%s)", (version,))

    @property
    def schema_version(self) -> int:
        """The schema version recorded in the store."""
        return int(self._rows("SELECT max(version) FROM wsnmom_schema")[0][0])

    def _put(self, table: str, key: str, columns: dict[str, Any]) -> None:
        names = ", ".join(columns)
        marks = ", ".join(["%s"] * len(columns))
        updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in columns if c != key)
        sql = (
            f"INSERT INTO {table} ({names}) VALUES ({marks}) "
            f"ON CONFLICT ({key}) DO UPDATE SET {updates}"
        )
        with self._conn() as conn:
            conn.execute(sql, tuple(columns.values()))

    def _get(self, table: str, column: str, value: str, decode: Callable[..., T]) -> T | None:
        rows = self._rows(f"SELECT data FROM {table} WHERE {column} = %s", (value,))
        return decode(rows[0][0]) if rows else None

    def _list(self, table: str, decode: Callable[..., T]) -> list[T]:
        return [decode(r[0]) for r in self._rows(f"SELECT data FROM {table} ORDER BY seq")]

    def _delete(self, table: str, value: str) -> bool:
        return self._count(f"DELETE FROM {table} WHERE id = %s", (value,)) > 0

    def _retire(self, table: str, value: str) -> bool:
        # one statement: the record's delete and its intent commit together, and the
        # intent is written only when a record was deleted
        return (
            self._count(
                f"WITH gone AS (DELETE FROM {table} WHERE id = %s RETURNING id) "
                "INSERT INTO wsnmom_intents (name) SELECT id FROM gone "
                "ON CONFLICT (name) DO UPDATE SET at = EXCLUDED.at",
                (value,),
            )
            > 0
        )

    # ------------------------------------------------------------------ records

    def put_subscription(self, sub: Subscription) -> None:
        with self._conn() as conn:
            row = conn.execute(
                "INSERT INTO subscriptions (id, termination_time, data, revision) "
                "VALUES (%s, %s, %s, 1) ON CONFLICT (id) DO UPDATE SET "
                "termination_time = EXCLUDED.termination_time, data = EXCLUDED.data, "
                "revision = subscriptions.revision + 1 RETURNING revision",
                (sub.id, sub.termination_time, self._jsonb(subscription_to_json(sub))),
            ).fetchone()
        sub.revision = int(row[0])

    def add_subscription(self, sub: Subscription) -> None:
        # one statement, one round trip: the intent's delete and the insert commit together,
        # and no row is inserted when the delete found none (the sweep took it first)
        with self._conn() as conn:
            row = conn.execute(
                f"WITH claimed AS ({_CLAIM}) "
                "INSERT INTO subscriptions (id, termination_time, data, revision) "
                "SELECT %s, %s::timestamptz, %s, 1 FROM claimed RETURNING revision",
                (sub.id, sub.id, sub.termination_time, self._jsonb(subscription_to_json(sub))),
            ).fetchone()
        if row is None:
            raise IntentGone(sub.id)
        sub.revision = int(row[0])

    def update_subscription(self, sub: Subscription) -> bool:
        # under READ COMMITTED a writer that waited for the row re-checks the revision on
        # the row the other writer committed: of two writes on one revision, one wins
        with self._conn() as conn:
            row = conn.execute(
                "UPDATE subscriptions SET termination_time = %s, data = %s, "
                "revision = revision + 1 WHERE id = %s AND revision = %s RETURNING revision",
                (
                    sub.termination_time,
                    self._jsonb(subscription_to_json(sub)),
                    sub.id,
                    sub.revision,
                ),
            ).fetchone()
        if row is None:
            return False
        sub.revision = int(row[0])
        return True

    def get_subscription(self, sub_id: str) -> Subscription | None:
        rows = self._rows("SELECT data, revision FROM subscriptions WHERE id = %s", (sub_id,))
        return _revised(rows[0]) if rows else None

    def delete_subscription(self, sub_id: str, *, intent: bool = False) -> bool:
        return (
            self._retire("subscriptions", sub_id)
            if intent
            else self._delete("subscriptions", sub_id)
        )

    def list_subscriptions(self) -> list[Subscription]:
        return [
            _revised(r) for r in self._rows("SELECT data, revision FROM subscriptions ORDER BY seq")
        ]

    def put_pull_point(self, pp: PullPoint) -> None:
        self._put(
            "pull_points",
            "id",
            {
                "id": pp.id,
                "name": pp.name,
                "termination_time": pp.termination_time,
                "data": self._jsonb(pull_point_to_json(pp)),
            },
        )

    def add_pull_point(self, pp: PullPoint) -> None:
        with self._conn() as conn:
            row = conn.execute(
                f"WITH claimed AS ({_CLAIM}) "
                "INSERT INTO pull_points (id, name, termination_time, data) "
                "SELECT %s, %s::text, %s::timestamptz, %s FROM claimed RETURNING id",
                (
                    pp.id,
                    pp.id,
                    pp.name,
                    pp.termination_time,
                    self._jsonb(pull_point_to_json(pp)),
                ),
            ).fetchone()
        if row is None:
            raise IntentGone(pp.id)

    def get_pull_point(self, pp_id: str) -> PullPoint | None:
        return self._get("pull_points", "id", pp_id, pull_point_from_json)

    def find_pull_point(self, name: str) -> PullPoint | None:
        return self._get("pull_points", "name", name, pull_point_from_json)

    def delete_pull_point(self, pp_id: str, *, intent: bool = False) -> bool:
        return self._retire("pull_points", pp_id) if intent else self._delete("pull_points", pp_id)

    def list_pull_points(self) -> list[PullPoint]:
        return self._list("pull_points", pull_point_from_json)

    def put_intent(self, name: str, at: datetime | None = None) -> None:
        with self._conn() as conn:
            conn.execute(
                "INSERT INTO wsnmom_intents (name, at) "
                "VALUES (%s, coalesce(%s::timestamptz, clock_timestamp())) "
                "ON CONFLICT (name) DO UPDATE SET at = EXCLUDED.at",
                (name, at),
            )

    def delete_intent(self, name: str, older_than: float | None = None) -> bool:
        if older_than is None:
            return self._count("DELETE FROM wsnmom_intents WHERE name = %s", (name,)) > 0
        return (
            self._count(
                "DELETE FROM wsnmom_intents WHERE name = %s "
                "AND at <= clock_timestamp() - make_interval(secs => %s)",
                (name, older_than),
            )
            > 0
        )

    def list_intents(self, older_than: float = 0.0) -> list[tuple[str, datetime]]:
        rows = self._rows(
            "SELECT name, at FROM wsnmom_intents "
            "WHERE at <= clock_timestamp() - make_interval(secs => %s) ORDER BY at, name",
            (older_than,),
        )
        return [(str(r[0]), r[1]) for r in rows]

    def put_registration(self, reg: PublisherRegistration) -> None:
        self._put(
            "registrations",
            "id",
            {
                "id": reg.id,
                "termination_time": reg.termination_time,
                "data": self._jsonb(registration_to_json(reg)),
            },
        )

    def get_registration(self, reg_id: str) -> PublisherRegistration | None:
        return self._get("registrations", "id", reg_id, registration_from_json)

    def delete_registration(self, reg_id: str) -> bool:
        return self._delete("registrations", reg_id)

    def list_registrations(self) -> list[PublisherRegistration]:
        return self._list("registrations", registration_from_json)

    def put_current_message(self, message: NotificationMessage) -> None:
        if message.topic is None:
            raise ValueError("a current message needs a topic")
        with self._conn() as conn:
            conn.execute(
                "INSERT INTO current_messages (namespace, path, data) VALUES (%s, %s, %s) "
                "ON CONFLICT (namespace, path) DO UPDATE SET data = EXCLUDED.data",
                (
                    message.topic.namespace,
                    "/".join(message.topic.path),
                    self._jsonb(message_to_json(message)),
                ),
            )

    def get_current_message(self, topic: Topic) -> NotificationMessage | None:
        rows = self._rows(
            "SELECT data FROM current_messages WHERE namespace = %s AND path = %s",
            (topic.namespace, "/".join(topic.path)),
        )
        return message_from_json(rows[0][0]) if rows else None

    def list_current_messages(self) -> list[NotificationMessage]:
        """Every stored current message (``wsnmom store migrate`` copies them)."""
        rows = self._rows("SELECT data FROM current_messages ORDER BY namespace, path")
        return [message_from_json(r[0]) for r in rows]

    def put_upstream(self, name: str, data: dict[str, Any]) -> None:
        self._put("upstreams", "id", {"id": name, "data": self._jsonb(data)})

    def delete_upstream(self, name: str) -> bool:
        return self._delete("upstreams", name)

    def list_upstreams(self) -> list[dict[str, Any]]:
        return self._list("upstreams", dict)

    def get_meta(self, key: str) -> str | None:
        rows = self._rows("SELECT value FROM wsnmom_meta WHERE key = %s", (key,))
        return str(rows[0][0]) if rows else None

    def set_meta(self, key: str, value: str) -> None:
        with self._conn() as conn:
            conn.execute(
                "INSERT INTO wsnmom_meta (key, value) VALUES (%s, %s) "
                "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                (key, value),
            )

    def coordination(self, instance_id: str) -> Coordination:
        """The cluster's tables in this store (``core.coordination_postgres``)."""
        from wsnmom.core.coordination_postgres import PostgresCoordination

        return PostgresCoordination(self, self._url, instance_id)

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """A pooled connection in one transaction (for ``core.coordination_postgres``)."""
        with self._tx() as conn:
            yield conn

    @contextmanager
    def statement(self) -> Iterator[Any]:
        """A pooled connection in autocommit, for one statement (for
        ``core.coordination_postgres``): one round trip instead of three."""
        with self._conn() as conn:
            yield conn

    def ping(self) -> bool:
        try:
            self._rows("SELECT 1")
        except StoreError:
            return False
        return True

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._pool.close()


#: the intent a new record replaces, deleted in the record's statement (its first parameter)
_CLAIM = "DELETE FROM wsnmom_intents WHERE name = %s RETURNING name"


def _revised(row: tuple[Any, ...]) -> Subscription:
    """A subscription from its row's document and revision."""
    sub = subscription_from_json(row[0])
    sub.revision = int(row[1])
    return sub
