"""A store's schema across versions, on SQLite and PostgreSQL: a store of every earlier
version is upgraded at open, instances starting together on one PostgreSQL database migrate
it once (on an older schema, the others seen waiting for the one migrating), a store newer
(PostgreSQL) or older (SQLite) than this release reads is refused by name, a missing driver
names its extra; and ``wsnmom store migrate``, which copies a store into another, refusing
one a gateway holds (its failure modes: test_store_migrate.py).  The records' contract on
both stores is test_store_conformance.py.
"""

from __future__ import annotations

import concurrent.futures
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from wsnmom.core.model import (
    EndpointReference,
    NotificationMessage,
    PublisherRegistration,
    PullPoint,
)
from wsnmom.core.store import StoreError
from wsnmom.core.store_documents import subscription_to_json
from wsnmom.core.store_sqlite import SqliteStore, SqliteTooOld
from wsnmom.core.store_url import open_store
from wsnmom.topic_mapping.model import Topic

from tests.core.test_store_conformance import NOW, subscription
from tests.support.waiting import wait_until


@pytest.mark.parametrize("version", [1, 2, 3])
def test_a_sqlite_store_of_every_earlier_version_is_upgraded(tmp_path: Path, version: int) -> None:
    """A SQLite store of each earlier schema version (1: before subscriptions had a
    revision; 2: before intents; 3: before recorded topics) opens, upgrades and keeps its
    subscriptions (revision 0 until their next write); its intents and topics work."""
    import json
    import sqlite3

    from wsnmom.core.store_sqlite import SCHEMA_VERSION

    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    conn.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))
    revision = ", revision INTEGER NOT NULL DEFAULT 0" if version >= 2 else ""
    conn.execute(
        "CREATE TABLE subscriptions (id TEXT PRIMARY KEY, termination_time TEXT, "
        f"data TEXT NOT NULL{revision})"
    )
    old = subscription("old")
    conn.execute(
        "INSERT INTO subscriptions (id, termination_time, data) VALUES (?, ?, ?)",
        ("old", None, json.dumps(subscription_to_json(old))),
    )
    conn.commit()
    conn.close()
    upgraded = open_store(f"sqlite:///{path}")
    try:
        assert upgraded.schema_version == SCHEMA_VERSION == 4  # type: ignore[attr-defined]
        kept = upgraded.get_subscription("old")
        assert kept == old and kept is not None and kept.revision == 0
        upgraded.put_subscription(kept)
        assert kept.revision == 1
        upgraded.put_intent("new")
        upgraded.add_subscription(subscription("new"))
        assert upgraded.list_intents() == [] and upgraded.get_subscription("new") is not None
        upgraded.record_topics([Topic("urn:t", ("up",))])
        assert upgraded.list_topics() == [Topic("urn:t", ("up",))]
    finally:
        upgraded.close()


def test_postgres_instances_starting_together_migrate_once(postgres_store_url: str) -> None:
    from wsnmom.core.store_postgres_schema import SCHEMA_VERSION

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        stores = list(pool.map(lambda _: open_store(postgres_store_url), range(4)))
    try:
        assert {s.schema_version for s in stores} == {SCHEMA_VERSION}  # type: ignore[attr-defined]
        stores[0].put_subscription(subscription("shared"))
        assert all(s.get_subscription("shared") is not None for s in stores)
    finally:
        for s in stores:
            s.close()


def test_sqlite_older_than_the_store_needs_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # INSERT ... ON CONFLICT ... RETURNING (put_subscription) needs SQLite 3.35; Ubuntu
    # 20.04 has 3.31: refused on opening, naming both versions, not at the first Subscribe
    import sqlite3

    monkeypatch.setattr(sqlite3, "sqlite_version_info", (3, 31, 1))
    monkeypatch.setattr(sqlite3, "sqlite_version", "3.31.1")
    with pytest.raises(SqliteTooOld, match=r"needs SQLite 3\.35\.0 or later.*SQLite 3\.31\.1"):
        SqliteStore(str(tmp_path / "old.db"))
    assert not (tmp_path / "old.db").exists()


def test_postgres_newer_schema_is_refused(postgres_store_url: str) -> None:
    import psycopg

    open_store(postgres_store_url).close()
    with psycopg.connect(postgres_store_url, autocommit=True) as conn:
        conn.execute("INSERT INTO wsnmom_schema (version) VALUES (999)")
    with pytest.raises(StoreError, match="newer than this wsnmom"):
        open_store(postgres_store_url)


def test_missing_driver_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "psycopg_pool", None)
    with pytest.raises(StoreError, match=r"wsnmom\[postgres\]"):
        open_store("postgresql://wsnmom@127.0.0.1:1/postgres")


def test_store_migrate_sqlite_to_postgres(tmp_path: Path, postgres_store_url: str) -> None:
    from click.testing import CliRunner

    from wsnmom.cli import cli

    source_url = f"sqlite:///{tmp_path}/store.db"
    source = open_store(source_url)
    subs = [subscription(f"s{i}", owner=f"u{i % 3}") for i in range(25)]
    for sub in subs:
        source.put_subscription(sub)
    pp = PullPoint("pp", NOW, None, "named")
    source.put_pull_point(pp)
    reg = PublisherRegistration("r", NOW, None, EndpointReference("http://127.0.0.1:9/p"))
    source.put_registration(reg)
    current = NotificationMessage("m", b"<x/>", Topic("urn:t", ("a",)), published_at=NOW)
    source.put_current_message(current)
    upstream = {"name": "plant", "url": "http://127.0.0.1:9/wsn/broker", "lifetime": 600.0}
    source.put_upstream("plant", upstream)
    made = datetime(2025, 1, 1, tzinfo=UTC)  # intents of the past are listed
    source.put_intent("made-never-stored", made)
    recorded = [Topic("urn:t", ("a",)), Topic("urn:t", ("a", "b"))]
    source.record_topics(recorded)
    source.close()

    runner = CliRunner()
    done = runner.invoke(
        cli, ["store", "migrate", "--from", source_url, "--to", postgres_store_url]
    )
    assert done.exit_code == 0, done.output
    assert "copied 25 subscriptions, 1 pull points, 1 registrations and 1 current" in done.output
    assert "plus 1 upstreams, plus 1 intents, plus 2 topics" in done.output
    copied = open_store(postgres_store_url)
    try:
        assert copied.list_intents() == [("made-never-stored", made)]
        assert copied.list_topics() == recorded
        assert copied.list_upstreams() == [upstream]
        assert copied.list_subscriptions() == subs
        assert copied.get_pull_point("pp") == pp and copied.get_registration("r") == reg
        assert copied.get_current_message(Topic("urn:t", ("a",))) == current
    finally:
        copied.close()
    # a second run finds the destination in use and says how to go on
    again = runner.invoke(
        cli, ["store", "migrate", "--from", source_url, "--to", postgres_store_url]
    )
    assert again.exit_code == 1 and "--merge" in again.output
    merged = runner.invoke(
        cli, ["store", "migrate", "--from", source_url, "--to", postgres_store_url, "--merge"]
    )
    assert merged.exit_code == 0, merged.output
    info = runner.invoke(cli, ["store", "info", "--json", postgres_store_url])
    assert '"subscriptions": 25' in info.output and '"pull_points": 1' in info.output


def test_store_migrate_refuses_a_store_a_gateway_holds(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from wsnmom.cli import cli
    from wsnmom.data_lock import lock_store

    source_url = f"sqlite:///{tmp_path}/store.db"
    open_store(source_url).close()
    held = lock_store(source_url)  # what a running gateway holds
    try:
        done = CliRunner().invoke(
            cli, ["store", "migrate", "--from", source_url, "--to", f"sqlite:///{tmp_path}/b.db"]
        )
    finally:
        held.release()
    assert done.exit_code == 1 and "stop that gateway" in done.output


def test_postgres_store_of_every_earlier_version_is_upgraded(postgres_store_url: str) -> None:
    """A store left at each earlier schema version (its tables made by exactly the
    migrations up to it, with a record in it) opens, upgrades and keeps its records."""
    import psycopg
    from psycopg.types.json import Jsonb
    from wsnmom.core.store_documents import pull_point_to_json
    from wsnmom.core.store_postgres import PostgresStore
    from wsnmom.core.store_postgres_schema import MIGRATIONS, SCHEMA_VERSION

    from tests.fixtures.postgres import fresh_database

    server_url = postgres_store_url.rsplit("/", 1)[0] + "/postgres"
    for version in range(1, SCHEMA_VERSION):
        with fresh_database(server_url) as url:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(
                    "CREATE TABLE wsnmom_schema (version INTEGER PRIMARY KEY, "
                    "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
                )
                for step in range(1, version + 1):
                    for statement in MIGRATIONS[step]:
                        conn.execute(statement)
                    conn.execute("INSERT INTO wsnmom_schema (version) VALUES (%s)", (step,))
                conn.execute(
                    "INSERT INTO pull_points (id, name, data) VALUES ('pp', 'n', %s)",
                    (Jsonb(pull_point_to_json(PullPoint("pp", NOW, None, "n"))),),
                )
            upgraded = open_store(url)
            try:
                assert isinstance(upgraded, PostgresStore)
                assert upgraded.schema_version == SCHEMA_VERSION
                assert upgraded.find_pull_point("n") == PullPoint("pp", NOW, None, "n")
                upgraded.set_meta("adapter", "embedded")
                # schema 6: forwarded requests' nonces are recorded once
                coordination = upgraded.coordination("upgraded")
                assert coordination.first_use(f"nonce-{version}", time.time() + 60) is True
                assert coordination.first_use(f"nonce-{version}", time.time() + 60) is False
                # schema 8: intents, replaced by their record
                upgraded.put_intent("pp-new")
                upgraded.add_pull_point(PullPoint("pp-new", NOW, None, "m"))
                assert upgraded.list_intents() == []
                # schema 10: recorded topics
                upgraded.record_topics([Topic("urn:t", ("up",))])
                assert upgraded.list_topics() == [Topic("urn:t", ("up",))]
                # schema 11: positions, each write fenced by its shard's epoch
                coordination.join("http://u", "1", single_instance=False)
                epoch = coordination.heartbeat(1, 30.0).held[0]
                table = coordination.positions()
                assert table is not None
                rows = [("s", "t", 0, 5, 0, epoch), ("z", "t", 0, 5, 0, epoch - 1)]
                assert table.save(rows) == {"z"}
                assert table.load_all() == {"s": {("t", 0): 5}}
                coordination.leave()
            finally:
                upgraded.close()


def test_instances_starting_together_on_an_old_schema_wait_for_the_one_that_migrates(
    postgres_store_url: str,
) -> None:
    """A store a previous version left at schema 5, with a subscription in it; an instance
    migrating it (here a session holding the migration's advisory lock) while two more
    start: both wait for the lock (seen waiting in pg_stat_activity), then one applies
    versions 6 and up once and the other finds nothing left; both serve the old record
    and each other's writes."""
    import concurrent.futures

    import psycopg
    from psycopg.types.json import Jsonb
    from wsnmom.core.store_documents import subscription_to_json
    from wsnmom.core.store_postgres_schema import MIGRATION_LOCK, MIGRATIONS, SCHEMA_VERSION

    old = subscription("old")
    with psycopg.connect(postgres_store_url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE wsnmom_schema (version INTEGER PRIMARY KEY, "
            "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        for version in range(1, 6):
            for statement in MIGRATIONS[version]:
                conn.execute(statement)
            conn.execute("INSERT INTO wsnmom_schema (version) VALUES (%s)", (version,))
        conn.execute(
            "INSERT INTO subscriptions (id, termination_time, data, revision) "
            "VALUES (%s, %s, %s, 1)",
            (old.id, old.termination_time, Jsonb(subscription_to_json(old))),
        )
    with (
        psycopg.connect(postgres_store_url) as holder,
        psycopg.connect(postgres_store_url, autocommit=True) as watcher,
        concurrent.futures.ThreadPoolExecutor(2) as pool,
    ):
        holder.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        opening = [pool.submit(open_store, postgres_store_url) for _ in range(2)]

        def waiting() -> int:
            row = watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND wait_event = 'advisory'"
            ).fetchone()
            return int(row[0]) if row else 0

        wait_until(lambda: waiting() == 2, timeout=30, what="both instances waiting")
        assert not any(f.done() for f in opening)
        holder.rollback()
        stores = [f.result(timeout=60) for f in opening]
    try:
        with psycopg.connect(postgres_store_url, autocommit=True) as conn:
            versions = [r[0] for r in conn.execute("SELECT version FROM wsnmom_schema ORDER BY 1")]
        assert versions == list(range(1, SCHEMA_VERSION + 1))
        got = stores[1].get_subscription("old")
        assert got is not None and got.consumer == old.consumer and got.revision == 1
        stores[0].put_subscription(subscription("new"))
        assert stores[1].get_subscription("new") is not None
    finally:
        for store in stores:
            store.close()
