"""``wsnmom store migrate`` as operators break it, on a real PostgreSQL: a copy killed
half way (refused by a gateway's start, finished by the same command run again), a server
that stops mid-copy, a source path that names no store, a destination of another adapter or
with a pull point of the same name, a second copy of a finished one, a password with odd
characters.  A store's schema across versions is test_store_versions.py."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import quote

import pytest
from click.testing import CliRunner
from wsnmom.core.model import (
    EndpointReference,
    PublisherRegistration,
    PullPoint,
    Subscription,
)
from wsnmom.core.store import Store
from wsnmom.core.store_binding import ADAPTER_KEY
from wsnmom.core.store_migration import migration
from wsnmom.core.store_url import open_store

from tests.fixtures.postgres import PostgresNode, fresh_database
from tests.ops.serve_process import free_port, run_serve, serve_env
from wsnmom.cli import cli
from wsnmom.startup import ExitStatus

NOW = datetime(2026, 1, 1, tzinfo=UTC)
KILLPOINT = Path(__file__).parent.parent / "support" / "killpoint"


def subscription(sub_id: str) -> Subscription:
    return Subscription(
        id=sub_id,
        consumer=EndpointReference(f"http://127.0.0.1:9/{sub_id}"),
        creation_time=NOW,
        termination_time=NOW + timedelta(days=1),
    )


def fill(url: str, count: int = 40, *, adapter: str | None = None) -> list[Subscription]:
    """A gateway's store: ``count`` subscriptions (s00, s01, ...), a named pull point, a
    registration; bound to ``adapter``."""
    store = open_store(url)
    try:
        subs = [subscription(f"s{i:02d}") for i in range(count)]
        for sub in subs:
            store.put_subscription(sub)
        store.put_pull_point(PullPoint("pp-1", NOW, None, "kept"))
        store.put_registration(
            PublisherRegistration("r-1", NOW, None, EndpointReference("http://127.0.0.1:9/p"))
        )
        if adapter:
            store.set_meta(ADAPTER_KEY, adapter)
        return subs
    finally:
        store.close()


@pytest.fixture
def source_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/data/store.db"


def migrate(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "wsnmom", "store", "migrate", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def ids(url: str) -> list[str]:
    store = open_store(url)
    try:
        return [s.id for s in store.list_subscriptions()]
    finally:
        store.close()


def test_a_copy_killed_half_way_stops_gateways_and_the_same_command_finishes_it(
    tmp_path: Path, source_url: str, postgres_store_url: str
) -> None:
    """SIGKILLed at its 21st subscription, the copy leaves 20 in PostgreSQL: a gateway
    started on that store exits naming the command that finishes the copy (before, it
    served 20 of 40 subscriptions as the whole), and that command run again, without
    --merge (before, refused: 'already holds 22 records'), finishes it with nothing
    doubled."""
    subs = fill(source_url)
    path = os.pathsep.join(p for p in (str(KILLPOINT), os.environ.get("PYTHONPATH", "")) if p)
    killed = migrate(
        "--from",
        source_url,
        "--to",
        postgres_store_url,
        env={**os.environ, "PYTHONPATH": path, "KILLPOINT_PUT_SUBSCRIPTION": "s20"},
    )
    assert killed.returncode == -9, killed.stderr
    assert ids(postgres_store_url) == [f"s{i:02d}" for i in range(20)]
    info = CliRunner().invoke(cli, ["store", "info", postgres_store_url])
    assert f"migrated from: {source_url} (NOT finished: run it again" in info.output

    data = tmp_path / "gateway"
    started = run_serve(
        ["--store", postgres_store_url, "--data-dir", str(data), "--port", str(free_port())],
        serve_env(tmp_path),
    )
    assert started.returncode == ExitStatus.DATA_DIR, started.stderr
    assert f"`wsnmom store migrate` from {source_url} into this store did not finish" in (
        started.stderr
    )
    assert f"--from {source_url} --to" in started.stderr

    again = migrate("--from", source_url, "--to", postgres_store_url)
    assert again.returncode == 0, again.stderr
    assert "carried on the copy" in again.stdout
    assert "copied 40 subscriptions, 1 pull points, 1 registrations" in again.stdout
    store = open_store(postgres_store_url)
    try:
        assert store.list_subscriptions() == subs
        assert [pp.name for pp in store.list_pull_points()] == ["kept"]
        assert [r.id for r in store.list_registrations()] == ["r-1"]
        mark = migration(store)
        assert mark is not None and mark.finished
    finally:
        store.close()
    # a third run would copy the old records over what gateways changed since: refused
    third = migrate("--from", source_url, "--to", postgres_store_url)
    assert third.returncode == 1
    assert f"already holds a finished copy of {source_url}" in third.stderr
    assert "--merge" in third.stderr


@pytest.fixture
def private_postgres() -> Iterator[PostgresNode]:
    """A PostgreSQL server of this test's own, which it may stop."""
    node = PostgresNode()
    try:
        node.start()
        yield node
    finally:
        node.cleanup()


def test_a_server_stopped_mid_copy_is_named_and_the_copy_carries_on_once_it_is_back(
    source_url: str, private_postgres: PostgresNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL stopped (a fast shutdown, as ``pg_ctl stop``) while the copy writes:
    exit 1 with one line naming the failure and that the same command carries on (before:
    only the failure, and the same command then refused the half-filled store)."""
    from wsnmom.core.store_postgres import PostgresStore

    subs = fill(source_url)
    real = PostgresStore.put_subscription

    def put(self: PostgresStore, sub: Subscription) -> None:
        if sub.id == "s20":
            private_postgres.stop()
        real(self, sub)

    runner = CliRunner()
    with fresh_database(private_postgres.url) as url:
        monkeypatch.setattr(PostgresStore, "put_subscription", put)
        cut = runner.invoke(cli, ["store", "migrate", "--from", source_url, "--to", url])
        assert cut.exit_code == 1, cut.output
        assert "the store is not reachable" in cut.output
        assert "did not finish: run the same command again to carry on" in cut.output
        assert "Traceback" not in cut.output
        monkeypatch.setattr(PostgresStore, "put_subscription", real)
        private_postgres.start()
        done = runner.invoke(cli, ["store", "migrate", "--from", source_url, "--to", url])
        assert done.exit_code == 0, done.output
        assert ids(url) == [s.id for s in subs]


def test_a_source_path_that_names_no_store_is_refused(tmp_path: Path) -> None:
    """A mistyped --from: before, an empty store was made there and 'copied 0
    subscriptions' said the migration was done."""
    wrong = tmp_path / "dta" / "store.db"
    done = CliRunner().invoke(
        cli,
        ["store", "migrate", "--from", f"sqlite:///{wrong}", "--to", f"sqlite:///{tmp_path}/b.db"],
    )
    assert done.exit_code == 1
    assert f"no store at {wrong}: check --from" in done.output
    assert not wrong.parent.exists() and not (tmp_path / "b.db").exists()


def _adapter(url: str) -> str | None:
    store = open_store(url)
    try:
        return store.get_meta(ADAPTER_KEY)
    finally:
        store.close()


def test_the_copy_carries_the_adapter_and_refuses_a_store_of_another(
    tmp_path: Path, source_url: str, postgres_store_url: str
) -> None:
    """The subscriptions' messages are in the source's middleware: the copy records its
    adapter in the destination (before: none, so a cluster started with another adapter
    took the records and stranded their backlog), and a merge into a store of another
    adapter's resources is refused, nothing written."""
    fill(source_url, 3, adapter="rabbitmq")
    runner = CliRunner()
    done = runner.invoke(
        cli, ["store", "migrate", "--from", source_url, "--to", postgres_store_url]
    )
    assert done.exit_code == 0, done.output
    assert _adapter(postgres_store_url) == "rabbitmq"

    other = f"sqlite:///{tmp_path}/other/store.db"
    other_store = open_store(other)
    other_store.put_subscription(subscription("k1"))
    other_store.set_meta(ADAPTER_KEY, "kafka")
    other_store.close()
    merged = runner.invoke(
        cli, ["store", "migrate", "--from", other, "--to", postgres_store_url, "--merge"]
    )
    assert merged.exit_code == 1
    assert "of the 'rabbitmq' adapter" in merged.output and "in 'kafka'" in merged.output
    assert "k1" not in ids(postgres_store_url)


def test_a_merge_refuses_a_pull_point_name_another_one_has(
    tmp_path: Path, source_url: str, postgres_store_url: str
) -> None:
    """Re-attaching by name finds one pull point: a merge that would give the name of
    one in the destination to another is refused, naming it (before: two pull points of
    that name, a client re-attaching got either)."""
    fill(source_url, 1)
    held = open_store(postgres_store_url)
    held.put_pull_point(PullPoint("pp-other", NOW, None, "kept"))
    held.close()
    done = CliRunner().invoke(
        cli, ["store", "migrate", "--from", source_url, "--to", postgres_store_url, "--merge"]
    )
    assert done.exit_code == 1
    assert "holds other pull points named kept" in done.output
    assert ids(postgres_store_url) == []


def test_an_unfinished_copy_from_one_store_refuses_a_copy_from_another(
    tmp_path: Path, source_url: str, postgres_store_url: str
) -> None:
    from wsnmom.core.store_migration import Migration

    fill(source_url, 1)
    half = open_store(postgres_store_url)
    _mark(half, Migration("sqlite:///elsewhere/store.db", False).encode())
    done = CliRunner().invoke(
        cli, ["store", "migrate", "--from", source_url, "--to", postgres_store_url, "--merge"]
    )
    assert done.exit_code == 1
    assert "holds part of a copy from sqlite:///elsewhere/store.db that did not finish" in (
        done.output
    )
    assert "wsnmom store migrate --from sqlite:///elsewhere/store.db --to" in done.output
    assert ids(postgres_store_url) == []
    # nor is a half-copied store copied on as if it were whole
    onward = CliRunner().invoke(
        cli,
        ["store", "migrate", "--from", postgres_store_url, "--to", f"sqlite:///{tmp_path}/c.db"],
    )
    assert onward.exit_code == 1
    assert "holds part of a copy from sqlite:///elsewhere/store.db that did not finish" in (
        onward.output
    )
    assert not (tmp_path / "c.db").exists() or ids(f"sqlite:///{tmp_path}/c.db") == []


def _mark(store: Store, value: str) -> None:
    from wsnmom.core.store_migration import MIGRATION_KEY

    try:
        store.set_meta(MIGRATION_KEY, value)
    finally:
        store.close()


def test_a_password_with_odd_characters_works_encoded_and_is_never_shown(
    source_url: str, private_postgres: PostgresNode
) -> None:
    """A server that asks for passwords (scram for one role): the password ``p@ss/w:rd%?#x``
    percent-encoded opens the store; a wrong one is named by the server's refusal; written
    raw, the URL is refused before any connection, naming percent-encoding (before: libpq
    read part of the password as host and port, and the message showed ``ss/w:rd%#x``)."""
    import psycopg

    secret = "p@ss/w:rd%?#x"
    with psycopg.connect(private_postgres.url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE oddpw LOGIN PASSWORD '{secret}'")
        conn.execute("CREATE DATABASE oddpw OWNER oddpw")
        hba = Path(str(conn.execute("SHOW hba_file").fetchone()[0]))  # type: ignore[index]
        hba.write_text("host all oddpw 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
        conn.execute("SELECT pg_reload_conf()")
    fill(source_url, 2)
    base = f"127.0.0.1:{private_postgres.port}/oddpw"
    runner = CliRunner()

    def migrate_to(password: str) -> str:
        to = f"postgresql://oddpw:{password}@{base}"
        done = runner.invoke(cli, ["store", "migrate", "--from", source_url, "--to", to])
        return f"{done.exit_code} {done.output}"

    wrong = migrate_to("nope")
    assert wrong.startswith("1 ") and 'password authentication failed for user "oddpw"' in wrong
    raw = migrate_to(secret)
    assert raw.startswith("1 ") and "percent-encode the special characters" in raw, raw
    assert f"postgresql://oddpw:***@{base} cannot be read" in raw
    assert not any(piece in raw for piece in ("p@ss", "ss/w", "rd%", "#x")), raw
    encoded = migrate_to(quote(secret, safe=""))
    assert encoded.startswith("0 copied 2 subscriptions"), encoded


def test_a_merge_keeps_the_later_current_message_and_refuses_another_upstream_of_a_name(
    tmp_path: Path, source_url: str, postgres_store_url: str
) -> None:
    """Merging a gateway's store into another's: a topic's current message is the one
    published last, whichever store held it (before: the source's replaced a later one),
    and an upstream of the same name but another configuration is refused, naming it
    (before: replaced)."""
    from wsnmom.core.model import NotificationMessage
    from wsnmom.topic_mapping.model import Topic

    fill(source_url, 1)
    later, older = Topic("urn:t", ("later",)), Topic("urn:t", ("older",))
    source = open_store(source_url)
    source.put_current_message(NotificationMessage("src-1", b"<a/>", later, published_at=NOW))
    source.put_current_message(NotificationMessage("src-2", b"<b/>", older, published_at=NOW))
    source.close()
    held = open_store(postgres_store_url)
    after = NOW + timedelta(minutes=1)
    kept = NotificationMessage("dst-1", b"<c/>", later, published_at=after)
    held.put_current_message(kept)
    held.put_current_message(
        NotificationMessage("dst-2", b"<d/>", older, published_at=NOW - timedelta(minutes=1))
    )
    held.close()
    runner = CliRunner()
    args = ["store", "migrate", "--from", source_url, "--to", postgres_store_url, "--merge"]
    done = runner.invoke(cli, args)
    assert done.exit_code == 0, done.output
    store = open_store(postgres_store_url)
    try:
        assert store.get_current_message(later) == kept
        replaced = store.get_current_message(older)
        assert replaced is not None and replaced.message_id == "src-2"
        store.put_upstream("plant", {"name": "plant", "url": "http://127.0.0.1:9/a"})
    finally:
        store.close()
    source = open_store(source_url)
    source.put_upstream("plant", {"name": "plant", "url": "http://127.0.0.1:9/b"})
    source.close()
    clash = runner.invoke(cli, args)
    assert clash.exit_code == 1
    assert "holds other upstreams named plant" in clash.output


def test_a_copy_into_the_store_of_a_running_gateway_is_refused(
    tmp_path: Path, source_url: str
) -> None:
    """A SQLite destination a gateway still serves (its lock held): refused, naming it,
    nothing written (before: copied under the gateway, which restores its records only at
    start and went on without them)."""
    from wsnmom.data_lock import lock_store

    fill(source_url, 1)
    destination = f"sqlite:///{tmp_path}/serving/store.db"
    open_store(destination).close()
    held = lock_store(destination)  # what a running gateway holds
    try:
        done = CliRunner().invoke(
            cli, ["store", "migrate", "--from", source_url, "--to", destination]
        )
    finally:
        held.release()
    assert done.exit_code == 1
    assert "in use by another gateway" in done.output
    assert "stop that gateway before migrating into the store it serves" in done.output
    assert ids(destination) == []


def test_a_postgresql_source_that_instances_still_serve_is_refused(
    tmp_path: Path, postgres_store_url: str
) -> None:
    """A cluster's store has no lock file: while an instance's heartbeat is recent the copy
    is refused, naming it (before: copied while it wrote); once it left, copied."""
    fill(postgres_store_url, 2)
    serving = open_store(postgres_store_url)
    instance = serving.coordination("inst-a")
    instance.join("http://127.0.0.1:9/wsn", "test", single_instance=False)
    destination = f"sqlite:///{tmp_path}/copy/store.db"
    args = ["store", "migrate", "--from", postgres_store_url, "--to", destination]
    try:
        refused = CliRunner().invoke(cli, args)
        assert refused.exit_code == 1
        assert "is served by 1 running gateway instances" in refused.output
        assert "inst-a at http://127.0.0.1:9/wsn): stop them" in refused.output
        assert ids(destination) == []
        instance.leave()
    finally:
        serving.close()
    done = CliRunner().invoke(cli, args)
    assert done.exit_code == 0, done.output
    assert ids(destination) == ["s00", "s01"]


def test_a_copy_interrupted_by_ctrl_c_says_how_to_finish(
    source_url: str, postgres_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C mid-copy: one line saying the copy did not finish and that the same command
    carries on (before: click's bare 'Aborted!')."""
    from wsnmom.core.store_postgres import PostgresStore

    fill(source_url, 30)
    real = PostgresStore.put_subscription

    def put(self: PostgresStore, sub: Subscription) -> None:
        if sub.id == "s20":
            raise KeyboardInterrupt
        real(self, sub)

    monkeypatch.setattr(PostgresStore, "put_subscription", put)
    args = ["store", "migrate", "--from", source_url, "--to", postgres_store_url]
    cut = CliRunner().invoke(cli, args)
    assert cut.exit_code == 1
    assert "interrupted; the copy into" in cut.output
    assert "run the same command again to carry on" in cut.output
    monkeypatch.setattr(PostgresStore, "put_subscription", real)
    assert CliRunner().invoke(cli, args).exit_code == 0
    assert len(ids(postgres_store_url)) == 30
