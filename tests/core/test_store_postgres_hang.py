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
