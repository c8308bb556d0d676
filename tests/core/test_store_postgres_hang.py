"""A PostgreSQL store whose server stops answering with its connections open (the
backends stopped: a server stuck on its disk, or a host that still acknowledges the
packets) answers StoreUnavailable within the call timeout, and ``ping`` (``/readyz``) says
False, instead of holding the request until the server comes back
(``core.store_postgres_deadline``).  The backends of the test's own connections are
stopped with SIGSTOP (the server's other sessions go on), and always continued."""

from __future__ import annotations

import time
import uuid

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
    before (the one call was cut: StoreUnavailable "did not answer within 1 s")."""
    from wsnmom.core import store_postgres_pool

    timeout, rows, page, per_row = 1.0, 150, 5, 0.01
    name = f"list-{uuid.uuid4().hex[:8]}"
    store = PostgresStore(postgres_store_url, instance_id=name, call_timeout=timeout)
    try:
        for n in range(rows):
            store.put_subscription(subscription(f"s{n:04d}"))
        with store.statement() as conn:
            conn.execute("ALTER TABLE subscriptions RENAME TO subscription_rows")
            # stable and costly: the planner evaluates it above the sort, per row given
            # out (a volatile one is evaluated below it, for every row at the first page)
            conn.execute(
                "CREATE FUNCTION slowly(doc jsonb) RETURNS jsonb STABLE COST 100000 "
                f"LANGUAGE sql AS $$ SELECT pg_sleep({per_row}); SELECT doc $$"
            )
            conn.execute(
                "CREATE VIEW subscriptions AS SELECT id, seq, termination_time, "
                "slowly(data) AS data, revision FROM subscription_rows"
            )
        monkeypatch.setattr(store_postgres_pool, "LIST_PAGE", page)
        started = time.monotonic()
        listed = store.list_subscriptions()
        assert time.monotonic() - started >= rows * per_row > timeout  # it was slow
        assert [s.id for s in listed] == [f"s{n:04d}" for n in range(rows)]
    finally:
        store.close()
