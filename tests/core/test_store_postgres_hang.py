"""A PostgreSQL store whose server stops answering with its connections open (the
backends stopped: a server stuck on its disk, or a host that still acknowledges the
packets) answers StoreUnavailable within the call timeout, and ``ping`` (``/readyz``) says
False, instead of holding the request until the server comes back
(``core.store_postgres_deadline``).  The backends of the test's own connections are
stopped with SIGSTOP (the server's other sessions go on), and always continued.  The
connections run without JIT compilation, which would compile inside a call's timeout."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

pytest.importorskip("psycopg")

from wsnmom.core.store import StoreUnavailable
from wsnmom.core.store_postgres import PostgresStore

from tests.core.test_store_conformance import subscription
from tests.support.stopped_backends import stopped_backends
from tests.support.waiting import wait_until

#: the store's call timeout in these tests
TIMEOUT = 1.0
#: what a cut call may take beyond it (the watcher's turn, the error's way back, load)
SLACK = 5.0


def test_a_call_the_server_does_not_answer_is_cut_and_the_store_recovers(
    postgres_store_url: str,
) -> None:
    """Before, the read waited as long as the backend was stopped (checked: a read with
    no bound was still waiting 15 s later, and returned once the backend continued)."""
    name = f"hang-{uuid.uuid4().hex[:8]}"
    store = PostgresStore(postgres_store_url, max_size=1, instance_id=name, call_timeout=TIMEOUT)
    try:
        store.set_meta("k", "v")
        with stopped_backends(postgres_store_url, name):
            started = time.monotonic()
            with pytest.raises(StoreUnavailable, match=f"did not answer within {TIMEOUT:g} s"):
                store.get_meta("k")
            took = time.monotonic() - started
            assert TIMEOUT <= took < TIMEOUT + SLACK, took
            # new connections reach the server (only the old backend is stopped): the
            # store's probe finds it, and reads work again while that backend still hangs
            assert wait_until(lambda: store.get_meta("k"), 30, errors=(StoreUnavailable,)) == "v"
    finally:
        store.close()


def test_ping_says_false_within_the_call_timeout_when_the_server_hangs(
    postgres_store_url: str,
) -> None:
    name = f"hang-{uuid.uuid4().hex[:8]}"
    store = PostgresStore(postgres_store_url, max_size=1, instance_id=name, call_timeout=TIMEOUT)
    try:
        assert store.ping()
        with stopped_backends(postgres_store_url, name):
            started = time.monotonic()
            assert not store.ping()
            assert time.monotonic() - started < TIMEOUT + SLACK
            assert "did not answer" in (store.unavailable_reason() or "")
        assert wait_until(store.ping, 30)
    finally:
        store.close()


def test_a_listing_longer_than_the_call_timeout_is_read_in_pages_each_within_it(
    postgres_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start lists every subscription: its time grows with the store (100,000 took up to
    11 s in one call at load 5, bench/store_listing.py), and a listing cut by the call
    timeout failed the start.  Here the server gives each row after 10 ms (the table read
    through a view that sleeps per row, in output order), so the whole listing takes
    1.5 times the call timeout, each page of 5 rows a twentieth of it (a margin for a
    loaded machine, whose sleeps wake late).  Checked to fail
    before (the one call was cut: StoreUnavailable "did not answer within 1 s").

    The plan is asserted (:func:`_listing_plan`), and kept off the table's statistics:
    without them the planner assumed 1,050 rows, which at the function's former cost
    (100,000) made the query's cost 262,591, above ``jit_above_cost`` (100,000), so the
    first page compiled the plan with LLVM (the first use in a backend also loads LLVM:
    50-120 ms at load 10 here) until autovacuum's ANALYZE, whenever it came, turned that
    off.  A run of the suite on three workers had a page cut at 1 s (not reproduced at
    load 20, where a first page took 60-110 ms; the plan above the sort was the same
    with and without statistics, JIT the one difference found)."""
    from wsnmom.core import store_postgres_pool

    timeout, rows, page, per_row = 1.0, 150, 5, 0.01
    name = f"list-{uuid.uuid4().hex[:8]}"
    store = PostgresStore(postgres_store_url, instance_id=name, call_timeout=timeout)
    try:
        for n in range(rows):
            store.put_subscription(subscription(f"s{n:04d}"))
        with store.statement() as conn:
            conn.execute("ALTER TABLE subscriptions RENAME TO subscription_rows")
            # statistics of its own now, not whenever autovacuum comes
            conn.execute("ANALYZE subscription_rows")
            # stable and costly (above 10 times cpu_operator_cost): the planner evaluates
            # it above the sort, per row given out (a volatile one is evaluated below it,
            # for every row at the first page); COST 100 keeps the plan below JIT's cost
            conn.execute(
                "CREATE FUNCTION slowly(doc jsonb) RETURNS jsonb STABLE COST 100 "
                f"LANGUAGE sql AS $$ SELECT pg_sleep({per_row}); SELECT doc $$"
            )
            conn.execute(
                "CREATE VIEW subscriptions AS SELECT id, seq, termination_time, "
                "slowly(data) AS data, revision FROM subscription_rows"
            )
            plan = _listing_plan(conn, "SELECT data, revision FROM subscriptions ORDER BY seq")
        monkeypatch.setattr(store_postgres_pool, "LIST_PAGE", page)
        started = time.monotonic()
        listed = store.list_subscriptions()
        assert time.monotonic() - started >= rows * per_row > timeout, plan  # it was slow
        assert [s.id for s in listed] == [f"s{n:04d}" for n in range(rows)]
    finally:
        store.close()


def _listing_plan(conn: Any, sql: str) -> str:
    """The plan of ``sql`` in the listing's cursor, asserted to evaluate ``slowly`` above
    the sort (per row fetched: each page waits for its own rows only) and without JIT
    (whose compilation would count in the first page)."""
    plan = "\n".join(r[0] for r in conn.execute(f"EXPLAIN (VERBOSE) DECLARE c CURSOR FOR {sql}"))
    top, *below = plan.splitlines()
    assert top.startswith("Result") and "slowly(" in below[0], plan
    assert any("->  Sort" in line for line in below) and "JIT" not in plan, plan
    return plan


def test_the_stores_connections_run_without_jit_unless_its_url_says_otherwise(
    postgres_store_url: str,
) -> None:
    """JIT compilation is off on the store's connections (a first JIT in a server process
    took 53-121 ms inside a listing page's call timeout, at load 10); options the URL
    gives are kept, and a ``jit`` it sets wins."""
    plain = PostgresStore(postgres_store_url, instance_id=f"jit-{uuid.uuid4().hex[:8]}")
    try:
        with plain.statement() as conn:
            assert conn.execute("SHOW jit").fetchone() == ("off",)
    finally:
        plain.close()
    joiner = "&" if "?" in postgres_store_url else "?"
    url = f"{postgres_store_url}{joiner}options=-c%20jit%3Don%20-c%20work_mem%3D8MB"
    told = PostgresStore(url, instance_id=f"jit-{uuid.uuid4().hex[:8]}")
    try:
        with told.statement() as conn:
            assert conn.execute("SHOW jit").fetchone() == ("on",)
            assert conn.execute("SHOW work_mem").fetchone() == ("8MB",)
    finally:
        told.close()
