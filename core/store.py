"""Persistent broker state: subscriptions, pull points, publisher registrations and the
current message per topic (when the adapter does not keep it).

``Store`` is the small interface core uses; ``SqliteStore`` is the default implementation
(plain ``sqlite3``, WAL journal, one connection guarded by a lock, parameterised SQL, a
``schema_version`` table), ``PostgresStore`` (``core.store_postgres``) the one several
gateway instances can share.  Records are kept as JSON documents next to the columns
queries need (id, termination time, name), the same in both.  Notifications themselves are
*not* stored here: accepted-but-undelivered messages live in the middleware's durable
subscriptions.

Store URLs: ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db``,
``sqlite:///:memory:`` (tests), ``postgresql://user:password@host:5432/database``.
"""

from __future__ import annotations

import abc
import base64
import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from wsnmom.core import errors
from wsnmom.core.coordination import Coordination, SingleInstance
from wsnmom.core.delivery_policy import DeliveryChoices
from wsnmom.core.model import (
    EndpointReference,
    ExpressionSource,
    NotificationMessage,
    PublisherRegistration,
    PullPoint,
    SoapVersion,
    Subscription,
    SubscriptionState,
    WireVersion,
)
from wsnmom.core.sqlite_space import reclaimable, vacuum_step
from wsnmom.topic_mapping.model import Topic

#: 2: subscriptions have a revision every write bumps (``Subscription.revision``);
#: 3: intents, the durable subscriptions being made (``Store.put_intent``)
SCHEMA_VERSION = 3


class StoreError(Exception):
    """The store cannot be opened or used."""


class StoreUnavailable(StoreError, errors.ResourceUnavailable):
    """The store does not answer (a server store down or out of connections): temporary,
    so an operation that needs it is answered with a Receiver fault and HTTP 503."""

    #: seconds a client should wait before retrying
    RETRY_AFTER = 5.0

    def __init__(self, description: str) -> None:
        errors.ResourceUnavailable.__init__(
            self, f"the store is not reachable: {description}", retry_after=self.RETRY_AFTER
        )


class IntentGone(StoreError):
    """A new record was not written: the intent it was to replace is gone (the orphan
    sweep took it for an orphan's, ``core.orphans``, and deleted its durable subscription)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"the intent of {name} is gone: the orphan sweep removed it")
        self.name = name


class SqliteTooOld(StoreError):
    """The Python's SQLite library is older than the embedded store needs."""

    def __init__(self, found: str) -> None:
        super().__init__(
            f"the embedded store needs SQLite {_version(SQLITE_NEEDED)} or later, this "
            f"Python has SQLite {found}; use a Python built with a newer SQLite, or a "
            "PostgreSQL store (--store postgresql://...)"
        )


#: the oldest SQLite the embedded store runs on (``INSERT ... RETURNING``: 3.35)
SQLITE_NEEDED = (3, 35, 0)


def _version(info: tuple[int, ...]) -> str:
    return ".".join(str(n) for n in info)


class Store(abc.ABC):
    """What core persists.  Every method is thread-safe."""

    # subscriptions
    @abc.abstractmethod
    def put_subscription(self, sub: Subscription) -> None:
        """Insert or replace; bumps the stored revision and sets ``sub.revision`` to it."""

    @abc.abstractmethod
    def update_subscription(self, sub: Subscription) -> bool:
        """Write ``sub`` only if the stored revision is still ``sub.revision`` (the one
        read): a conditional write, so that a change another writer made after that read
        is never overwritten.  Bumps the stored revision and sets ``sub.revision`` to it;
        False (nothing written) when the subscription changed or was deleted meanwhile."""

    @abc.abstractmethod
    def get_subscription(self, sub_id: str) -> Subscription | None:
        """The subscription, or None."""

    @abc.abstractmethod
    def delete_subscription(self, sub_id: str, *, intent: bool = False) -> bool:
        """Remove; False when it was not there.  ``intent``: in the same write, store an
        intent of ``sub_id`` when a record was removed, so that the orphan sweep deletes
        the durable subscription if this instance dies (or its middleware refuses) before
        it does; the caller removes the intent once the durable subscription is gone."""

    @abc.abstractmethod
    def list_subscriptions(self) -> list[Subscription]:
        """Every subscription."""

    # pull points
    @abc.abstractmethod
    def put_pull_point(self, pp: PullPoint) -> None:
        """Insert or replace."""

    # intents: durable subscriptions being made, before their record exists (core.orphans)
    @abc.abstractmethod
    def put_intent(self, name: str, at: datetime | None = None) -> None:
        """Record that the durable subscription ``name`` is about to be made, at ``at``
        (None: now, by the store's clock, which every instance of a cluster shares)."""

    @abc.abstractmethod
    def add_subscription(self, sub: Subscription) -> None:
        """Store a new subscription's record and remove its intent in one write (as
        :meth:`put_subscription`); :class:`IntentGone`, nothing written, when there is no
        intent of its id (the orphan sweep removed it)."""

    @abc.abstractmethod
    def add_pull_point(self, pp: PullPoint) -> None:
        """:meth:`add_subscription` for a new pull point."""

    @abc.abstractmethod
    def delete_intent(self, name: str, older_than: float | None = None) -> bool:
        """Remove the intent ``name`` (only if recorded at least ``older_than`` seconds
        ago); False when none was removed."""

    @abc.abstractmethod
    def list_intents(self, older_than: float = 0.0) -> list[tuple[str, datetime]]:
        """The intents recorded at least ``older_than`` seconds ago, oldest first."""

    @abc.abstractmethod
    def get_pull_point(self, pp_id: str) -> PullPoint | None:
        """The pull point, or None."""

    @abc.abstractmethod
    def find_pull_point(self, name: str) -> PullPoint | None:
        """The pull point created with ``name``, or None."""

    @abc.abstractmethod
    def delete_pull_point(self, pp_id: str, *, intent: bool = False) -> bool:
        """Remove; False when it was not there (``intent``: as for
        :meth:`delete_subscription`)."""

    @abc.abstractmethod
    def list_pull_points(self) -> list[PullPoint]:
        """Every pull point."""

    # registrations
    @abc.abstractmethod
    def put_registration(self, reg: PublisherRegistration) -> None:
        """Insert or replace."""

    @abc.abstractmethod
    def get_registration(self, reg_id: str) -> PublisherRegistration | None:
        """The registration, or None."""

    @abc.abstractmethod
    def delete_registration(self, reg_id: str) -> bool:
        """Remove; False when it was not there."""

    @abc.abstractmethod
    def list_registrations(self) -> list[PublisherRegistration]:
        """Every registration."""

    # current messages
    @abc.abstractmethod
    def put_current_message(self, message: NotificationMessage) -> None:
        """Remember ``message`` as the last one on its topic (topic must be set)."""

    @abc.abstractmethod
    def get_current_message(self, topic: Topic) -> NotificationMessage | None:
        """The last message on ``topic``, or None."""

    @abc.abstractmethod
    def list_current_messages(self) -> list[NotificationMessage]:
        """Every stored current message."""

    # upstreams (``[[upstream]]`` added at run time): JSON documents by name
    @abc.abstractmethod
    def put_upstream(self, name: str, data: dict[str, Any]) -> None:
        """Insert or replace the upstream ``name``."""

    @abc.abstractmethod
    def delete_upstream(self, name: str) -> bool:
        """Remove the upstream ``name``; False when there was none."""

    @abc.abstractmethod
    def list_upstreams(self) -> list[dict[str, Any]]:
        """Every stored upstream, in the order they were added."""

    # facts about the store itself (which adapter its resources belong to, ...)
    @abc.abstractmethod
    def get_meta(self, key: str) -> str | None:
        """The value recorded under ``key``, or None."""

    @abc.abstractmethod
    def set_meta(self, key: str, value: str) -> None:
        """Record ``value`` under ``key`` (replacing)."""

    def coordination(self, instance_id: str) -> Coordination:
        """How instances sharing this store coordinate; a store one instance opens
        (SQLite) gives :class:`~wsnmom.core.coordination.SingleInstance`."""
        return SingleInstance(instance_id)

    @abc.abstractmethod
    def ping(self) -> bool:
        """True when the store answers."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the store; idempotent."""


# --------------------------------------------------------------------------------------------
# JSON (de)serialisation of the domain records
# --------------------------------------------------------------------------------------------


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def _dt(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _undt(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def epr_to_json(epr: EndpointReference | None) -> dict[str, Any] | None:
    """JSON form of an endpoint reference."""
    if epr is None:
        return None
    return {
        "address": epr.address,
        "reference_parameters": [_b64(p) for p in epr.reference_parameters],
        "metadata": _b64(epr.metadata),
    }


def epr_from_json(data: dict[str, Any] | None) -> EndpointReference | None:
    """Inverse of :func:`epr_to_json`."""
    if data is None:
        return None
    params = tuple(base64.b64decode(p) for p in data.get("reference_parameters", ()))
    return EndpointReference(data["address"], params, _unb64(data.get("metadata")))


def expr_to_json(expr: ExpressionSource | None) -> dict[str, Any] | None:
    """JSON form of an expression source (the None prefix is the default namespace)."""
    if expr is None:
        return None
    return {
        "dialect": expr.dialect,
        "text": expr.text,
        "namespaces": [[p, uri] for p, uri in expr.namespaces.items()],
    }


def expr_from_json(data: dict[str, Any] | None) -> ExpressionSource | None:
    """Inverse of :func:`expr_to_json`."""
    if data is None:
        return None
    return ExpressionSource(data["dialect"], data["text"], {p: u for p, u in data["namespaces"]})


def topic_to_json(topic: Topic | None) -> dict[str, Any] | None:
    """JSON form of a topic."""
    return None if topic is None else {"namespace": topic.namespace, "path": list(topic.path)}


def topic_from_json(data: dict[str, Any] | None) -> Topic | None:
    """Inverse of :func:`topic_to_json`."""
    return None if data is None else Topic(data["namespace"], tuple(data["path"]))


def subscription_to_json(sub: Subscription) -> dict[str, Any]:
    """JSON document of a subscription."""
    return {
        "id": sub.id,
        "consumer": epr_to_json(sub.consumer),
        "creation_time": _dt(sub.creation_time),
        "termination_time": _dt(sub.termination_time),
        "topic": expr_to_json(sub.topic),
        "message_content": expr_to_json(sub.message_content),
        "producer_properties": expr_to_json(sub.producer_properties),
        "filter_xml": _b64(sub.filter_xml),
        "policy_xml": _b64(sub.policy_xml),
        "use_raw": sub.use_raw,
        "subscription_end_topic": expr_to_json(sub.subscription_end_topic),
        "dead_letters": sub.dead_letters,
        "delivery_policy": (None if sub.delivery_policy is None else sub.delivery_policy.to_json()),
        "state": sub.state.value,
        "soap_version": sub.soap_version.value,
        "wire_version": sub.wire_version.value,
        "pull_point_id": sub.pull_point_id,
        "owner": sub.owner,
        "queued": sub.queued,
    }


def subscription_from_json(d: dict[str, Any]) -> Subscription:
    """Inverse of :func:`subscription_to_json`."""
    consumer = epr_from_json(d["consumer"])
    created = _undt(d["creation_time"])
    assert consumer is not None and created is not None
    return Subscription(
        id=d["id"],
        consumer=consumer,
        creation_time=created,
        termination_time=_undt(d["termination_time"]),
        topic=expr_from_json(d["topic"]),
        message_content=expr_from_json(d["message_content"]),
        producer_properties=expr_from_json(d["producer_properties"]),
        filter_xml=_unb64(d["filter_xml"]),
        policy_xml=_unb64(d["policy_xml"]),
        use_raw=d["use_raw"],
        subscription_end_topic=expr_from_json(d["subscription_end_topic"]),
        dead_letters=d.get("dead_letters"),
        delivery_policy=DeliveryChoices.from_json(d.get("delivery_policy")),
        state=SubscriptionState(d["state"]),
        soap_version=SoapVersion(d["soap_version"]),
        # records written before wire versions were kept are WS-N 1.3 ones
        wire_version=WireVersion(d.get("wire_version", WireVersion.WSN_13.value)),
        pull_point_id=d["pull_point_id"],
        owner=d.get("owner"),
        queued=d.get("queued", False),
    )


def pull_point_to_json(pp: PullPoint) -> dict[str, Any]:
    """JSON document of a pull point."""
    return {
        "id": pp.id,
        "creation_time": _dt(pp.creation_time),
        "termination_time": _dt(pp.termination_time),
        "name": pp.name,
        "owner": pp.owner,
    }


def pull_point_from_json(d: dict[str, Any]) -> PullPoint:
    """Inverse of :func:`pull_point_to_json`."""
    created = _undt(d["creation_time"])
    assert created is not None
    # records written before owners were recorded have none: anonymous-owned
    return PullPoint(d["id"], created, _undt(d["termination_time"]), d["name"], d.get("owner"))


def registration_to_json(reg: PublisherRegistration) -> dict[str, Any]:
    """JSON document of a publisher registration."""
    return {
        "id": reg.id,
        "creation_time": _dt(reg.creation_time),
        "termination_time": _dt(reg.termination_time),
        "publisher_reference": epr_to_json(reg.publisher_reference),
        "topics": [expr_to_json(t) for t in reg.topics],
        "demand": reg.demand,
        "demand_subscription": epr_to_json(reg.demand_subscription),
        "demand_paused": reg.demand_paused,
        "owner": reg.owner,
    }


def registration_from_json(d: dict[str, Any]) -> PublisherRegistration:
    """Inverse of :func:`registration_to_json`."""
    created = _undt(d["creation_time"])
    assert created is not None
    topics = tuple(t for t in (expr_from_json(x) for x in d["topics"]) if t is not None)
    return PublisherRegistration(
        id=d["id"],
        creation_time=created,
        termination_time=_undt(d["termination_time"]),
        publisher_reference=epr_from_json(d["publisher_reference"]),
        topics=topics,
        demand=d["demand"],
        demand_subscription=epr_from_json(d["demand_subscription"]),
        demand_paused=d["demand_paused"],
        owner=d.get("owner"),
    )


def message_to_json(msg: NotificationMessage) -> dict[str, Any]:
    """JSON document of a notification message."""
    return {
        "message_id": msg.message_id,
        "payload": _b64(msg.payload),
        "topic": topic_to_json(msg.topic),
        "topic_dialect": msg.topic_dialect,
        "producer_reference": epr_to_json(msg.producer_reference),
        "content_type": msg.content_type,
        "published_at": _dt(msg.published_at),
        "subscription_reference": epr_to_json(msg.subscription_reference),
        "headers": [list(pair) for pair in msg.headers],
    }


def message_from_json(d: dict[str, Any]) -> NotificationMessage:
    """Inverse of :func:`message_to_json`."""
    payload = _unb64(d["payload"])
    assert payload is not None
    return NotificationMessage(
        message_id=d["message_id"],
        payload=payload,
        topic=topic_from_json(d["topic"]),
        topic_dialect=d["topic_dialect"],
        producer_reference=epr_from_json(d["producer_reference"]),
        content_type=d["content_type"],
        published_at=_undt(d["published_at"]),
        subscription_reference=epr_from_json(d.get("subscription_reference")),
        headers=tuple((str(n), str(v)) for n, v in d.get("headers") or ()),
    )


# --------------------------------------------------------------------------------------------
# SQLite
# --------------------------------------------------------------------------------------------

_SCHEMA = [
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
]


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
            for stmt in _SCHEMA:
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
                    conn.execute(
                        "ALTER TABLE subscriptions ADD COLUMN revision INTEGER NOT NULL DEFAULT 0"
                    )
                conn.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))

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
            (sub.id, _dt(sub.termination_time), json.dumps(subscription_to_json(sub))),
        ).fetchone()
        sub.revision = int(row[0])

    def update_subscription(self, sub: Subscription) -> bool:
        with self._tx() as conn:
            row = conn.execute(
                "UPDATE subscriptions SET termination_time = ?, data = ?, "
                "revision = revision + 1 WHERE id = ? AND revision = ? RETURNING revision",
                (
                    _dt(sub.termination_time),
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
            (pp.id, pp.name, _dt(pp.termination_time), json.dumps(pull_point_to_json(pp))),
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

    def list_pull_points(self) -> list[PullPoint]:
        rows = self._query("SELECT data FROM pull_points ORDER BY rowid")
        return [pull_point_from_json(json.loads(r[0])) for r in rows]

    # registrations
    def put_registration(self, reg: PublisherRegistration) -> None:
        with self._tx() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO registrations (id, termination_time, data) "
                "VALUES (?, ?, ?)",
                (reg.id, _dt(reg.termination_time), json.dumps(registration_to_json(reg))),
            )

    def get_registration(self, reg_id: str) -> PublisherRegistration | None:
        rows = self._query("SELECT data FROM registrations WHERE id = ?", (reg_id,))
        return registration_from_json(json.loads(rows[0][0])) if rows else None

    def delete_registration(self, reg_id: str) -> bool:
        with self._tx() as conn:
            gone = conn.execute("DELETE FROM registrations WHERE id = ?", (reg_id,)).rowcount
        self._reclaim()
        return gone > 0

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

    def set_meta(self, key: str, value: str) -> None:
        with self._tx() as conn:
            conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

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
