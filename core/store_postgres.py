"""The PostgreSQL store: the same records as the SQLite store, in a server several gateway
instances can share.

Opened for ``postgresql://user:password@host:port/database`` (``postgres://`` too) through
psycopg 3 with a connection pool (extra ``postgres``).  Records are JSON documents (jsonb)
next to the columns queries need, as in SQLite, so ``wsnmom store migrate`` copies them
one to one.

Its parts: the schema's numbered migrations (``core.store_postgres_schema``), the pooled
connections, their recovery and the migration at start (``core.store_postgres_pool``,
:class:`~wsnmom.core.store_postgres_pool.PostgresConnections`), the leader's writes fenced
by its epoch (``core.store_postgres_fenced``: ``FencedWrites``, over those connections and
the base class of :class:`PostgresStore`), and here the records' other reads and writes.

Connection trouble surfaces as :class:`~wsnmom.core.store.StoreUnavailable` (a
:class:`~wsnmom.core.store.StoreError`): the frontend answers it with a Receiver fault
and HTTP 503, and ``ping`` (``/readyz``) says the store is not answering.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, TypeVar

from wsnmom.core.coordination import Coordination
from wsnmom.core.model import (
    NotificationMessage,
    PublisherRegistration,
    PullPoint,
    Subscription,
)
from wsnmom.core.store import IntentGone, Store, StoreError
from wsnmom.core.store_documents import (
    message_from_json,
    message_to_json,
    pull_point_from_json,
    pull_point_to_json,
    registration_from_json,
    registration_termination_to_json,
    registration_to_json,
    subscription_from_json,
    subscription_to_json,
    topic_from_key,
    topic_key,
)
from wsnmom.core.store_postgres_fenced import FencedWrites
from wsnmom.core.store_postgres_pool import PING_TIMEOUT
from wsnmom.topic_mapping.model import Topic

T = TypeVar("T")


class PostgresStore(FencedWrites, Store):
    """PostgreSQL implementation of :class:`~wsnmom.core.store.Store`."""

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
        return [decode(r[0]) for r in self._listing(f"SELECT data FROM {table} ORDER BY seq")]

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
            _revised(r)
            for r in self._listing("SELECT data, revision FROM subscriptions ORDER BY seq")
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

    def held(self, ids: Collection[str]) -> set[str]:
        wanted = sorted(set(ids))
        if not wanted:
            return set()
        rows = self._rows(
            "SELECT id FROM subscriptions WHERE id = ANY(%s) "
            "UNION SELECT id FROM pull_points WHERE id = ANY(%s)",
            (wanted, wanted),
        )
        return {str(row[0]) for row in rows}

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

    def renew_registration(self, reg_id: str, termination_time: datetime | None) -> bool:
        part = self._jsonb(registration_termination_to_json(termination_time))
        return (
            self._count(
                "UPDATE registrations SET termination_time = %s, data = data || %s WHERE id = %s",
                (termination_time, part, reg_id),
            )
            > 0
        )

    def delete_registration(self, reg_id: str) -> PublisherRegistration | None:
        rows = self._rows("DELETE FROM registrations WHERE id = %s RETURNING data", (reg_id,))
        return registration_from_json(rows[0][0]) if rows else None

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
        rows = self._listing("SELECT data FROM current_messages ORDER BY namespace, path")
        return [message_from_json(r[0]) for r in rows]

    def record_topics(self, topics: Sequence[Topic], within: int | None = None) -> list[Topic]:
        if not topics:
            return []
        columns = (
            [topic_key(t) for t in topics],
            [t.namespace for t in topics],
            ["/".join(t.path) for t in topics],
        )
        if within is None:
            # one round trip for the lot; a topic recorded already inserts no row (and so
            # leaves no change for the other instances)
            with self._conn() as conn:
                conn.execute(
                    "INSERT INTO wsnmom_topics (id, namespace, path) "
                    "SELECT * FROM unnest(%s::text[], %s::text[], %s::text[]) "
                    "ON CONFLICT (id) DO NOTHING",
                    columns,
                )
            return []
        # the count and the insert under one lock, so instances recording at once never
        # take the table past ``within``; the insert's statement sees what the last holder
        # of the lock committed (READ COMMITTED takes a snapshot per statement)
        with self._tx() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (TOPICS_LOCK,))
            rows = conn.execute(_RECORD_WITHIN, (*columns, within)).fetchall()
        refused = {str(r[0]) for r in rows}
        return [t for t in topics if topic_key(t) in refused]

    def list_topics(self) -> list[Topic]:
        rows = self._listing("SELECT id FROM wsnmom_topics ORDER BY seq")
        return [topic_from_key(str(r[0])) for r in rows]

    def put_upstream(self, name: str, data: dict[str, Any]) -> None:
        self._put("upstreams", "id", {"id": name, "data": self._jsonb(data)})

    def delete_upstream(self, name: str) -> bool:
        return self._delete("upstreams", name)

    def list_upstreams(self) -> list[dict[str, Any]]:
        return self._list("upstreams", dict)

    def get_meta(self, key: str) -> str | None:
        rows = self._rows("SELECT value FROM wsnmom_meta WHERE key = %s", (key,))
        return str(rows[0][0]) if rows else None

    def set_meta(self, key: str, value: str, *, epoch: int | None = None) -> None:
        if epoch is None:
            with self._conn() as conn:
                conn.execute(
                    "INSERT INTO wsnmom_meta (key, value) VALUES (%s, %s) "
                    "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                    (key, value),
                )
            return
        self._set_meta_fenced(key, value, epoch)

    def coordination(self, instance_id: str) -> Coordination:
        """The cluster's tables in this store (``core.coordination_postgres``)."""
        from wsnmom.core.coordination_postgres import PostgresCoordination

        return PostgresCoordination(self, self._url, instance_id)

    @contextmanager
    def transaction(self, timeout: float = -1.0) -> Iterator[Any]:
        """A pooled connection in one transaction (for ``core.coordination_postgres``),
        cut after ``timeout`` seconds (negative: the store's call timeout)."""
        with self._tx(timeout) as conn:
            yield conn

    @contextmanager
    def statement(self, timeout: float = -1.0) -> Iterator[Any]:
        """A pooled connection in autocommit, for one statement (for
        ``core.coordination_postgres``): one round trip instead of three.  Cut after
        ``timeout`` seconds (negative: the store's call timeout)."""
        with self._conn(timeout) as conn:
            yield conn

    def ping(self) -> bool:
        try:
            self._rows("SELECT 1", timeout=min(PING_TIMEOUT, self._call_timeout))
        except StoreError:
            return False
        return True

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._pool.close()
        self._deadlines.close()


#: the advisory-lock key recordings of topics within a bound serialise on ("wsnt")
TOPICS_LOCK = 0x77736E74

#: record the new topics of a batch (in its order) while the table holds fewer than the
#: bound; the new ones that did not fit are returned
_RECORD_WITHIN = """
WITH batch AS (
    SELECT * FROM unnest(%s::text[], %s::text[], %s::text[]) WITH ORDINALITY
        AS b(id, namespace, path, i)),
fresh AS (
    SELECT * FROM batch WHERE NOT EXISTS (SELECT 1 FROM wsnmom_topics t WHERE t.id = batch.id)),
kept AS (
    SELECT * FROM fresh ORDER BY i
    LIMIT GREATEST(0, %s - (SELECT count(*) FROM wsnmom_topics))),
recorded AS (
    INSERT INTO wsnmom_topics (id, namespace, path)
    SELECT id, namespace, path FROM kept ORDER BY i
    ON CONFLICT (id) DO NOTHING)
SELECT id FROM fresh WHERE id NOT IN (SELECT id FROM kept)
"""

#: the intent a new record replaces, deleted in the record's statement (its first parameter)
_CLAIM = "DELETE FROM wsnmom_intents WHERE name = %s RETURNING name"


def _revised(row: tuple[Any, ...]) -> Subscription:
    """A subscription from its row's document and revision."""
    sub = subscription_from_json(row[0])
    sub.revision = int(row[1])
    return sub
