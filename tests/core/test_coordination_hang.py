"""The cluster coordination's connections against a PostgreSQL server that stops answering
one of them (``core.coordination_postgres``): each connection's backend alone is stopped
with SIGSTOP (the server's other sessions go on), and always continued.

* the heartbeat's transaction (a pooled connection) is cut within half a lease, not the
  store's call timeout, and the next heartbeat renews on another connection;
* the leadership's connection: the heartbeat thread no longer waits on the leader's
  ``SELECT 1``; the instance gives the leadership up, goes on renewing its leases, and
  leads again once the stopped session ended (its lock with it);
* the LISTEN connection: a LISTEN without its answer is cut within the store's call
  timeout, and the next wait listens on a new connection."""

from __future__ import annotations

import threading
import time
import uuid
from contextlib import ExitStack
from datetime import timedelta
from typing import Any

import pytest

pytest.importorskip("psycopg")

from wsnmom.core.cluster import ClusterMember
from wsnmom.core.config import ClusterSettings
from wsnmom.core.store import StoreUnavailable
from wsnmom.core.store_postgres import PostgresStore

from tests.core.test_store_conformance import subscription
from tests.support.stopped_backends import stopped_backends, stopped_pids
from tests.support.waiting import wait_until

SHARDS = 8
#: the lease in these tests: the heartbeat thread's calls are cut after half of it
LEASE = 2.0
#: what a cut call may take beyond its bound (the watcher's turn, the error's way back, load)
SLACK = 5.0


def _name(role: str) -> str:
    return f"{role}-{uuid.uuid4().hex[:8]}"


def test_a_heartbeat_the_server_does_not_answer_is_cut_within_half_a_lease(
    postgres_store_url: str,
) -> None:
    """Before, the heartbeat's transaction was bounded by the store's call timeout (15 s,
    longer than the lease): its thread neither renewed nor gave up meanwhile (checked to
    fail before: cut by the store's 15 s deadline)."""
    name = _name("beat")
    a = PostgresStore(postgres_store_url, max_size=1, instance_id=name)
    try:
        ca = a.coordination(name)
        ca.join("http://a", "1", single_instance=False)
        assert sorted(ca.heartbeat(SHARDS, LEASE).held) == list(range(SHARDS))
        with stopped_backends(postgres_store_url, name):  # a's one pooled connection
            started = time.monotonic()
            with pytest.raises(StoreUnavailable, match=f"did not answer within {LEASE / 2:g} s"):
                ca.heartbeat(SHARDS, LEASE)
            took = time.monotonic() - started
            assert LEASE / 2 <= took < LEASE / 2 + SLACK, took
            # the store counted down finds the server again (only the old backend is
            # stopped): the next heartbeat renews, on a new connection
            renewed = wait_until(
                lambda: ca.heartbeat(SHARDS, LEASE).held,
                30,
                what="a heartbeat renewing on a new connection",
                errors=(StoreUnavailable,),
            )
            assert sorted(renewed) == list(range(SHARDS))
        ca.leave()
    finally:
        a.close()


def test_a_leader_whose_connection_stops_answering_gives_it_up_and_leads_again(
    postgres_store_url: str,
) -> None:
    """Before, the heartbeat thread waited on the leader's ``SELECT 1`` for as long as the
    backend stayed stopped: no renewal, and the instance went on calling itself the
    leader (checked to fail before: still leading after the wait below)."""
    name = _name("lead")
    a = PostgresStore(postgres_store_url, instance_id=name)
    settings = ClusterSettings(shards=SHARDS, lease=timedelta(seconds=3), heartbeat=0.2, poll=0.5)
    member = ClusterMember(
        a.coordination(name),
        settings,
        follower=None,  # type: ignore[arg-type]  # alone on its store: nothing to follow
        gained=lambda shards: None,
        lost=lambda shards: None,
        became_leader=lambda: None,
    )
    try:
        member.join("http://a", "1", single_instance=False)
        assert member.leads() and member.leader_epoch() == 1
        member.start()
        with stopped_backends(postgres_store_url, f"{name}/leader"):
            wait_until(lambda: not member.leads(), 1.5 + SLACK, what="a giving the leadership up")
            renewals = member.status().counts.renewals
            wait_until(
                lambda: member.status().counts.renewals >= renewals + 3,
                30,
                what="a's heartbeats renewing its leases meanwhile",
            )
            assert member.held()
        # the stopped session, continued, finds its client gone and ends, the lock with it
        wait_until(member.leads, 30, what="a leading again")
        assert (member.leader_epoch() or 0) > 1
    finally:
        member.stop()
        a.close()


def test_a_listen_the_server_does_not_answer_is_cut_and_the_next_wait_listens_again(
    postgres_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backend of a's first LISTEN connection is stopped as soon as it connected (the
    server stopped answering then).  Before, the LISTEN waited for as long as it stayed
    stopped: the follow thread neither read the change log nor woke (checked: still
    waiting after the test's bound, and returned once continued)."""
    timeout = 1.0
    name = _name("listen")
    a = PostgresStore(postgres_store_url, instance_id=name, call_timeout=timeout)
    b = PostgresStore(postgres_store_url, instance_id=_name("writer"))
    ca = a.coordination(name)
    connect = ca._connect
    outcome: list[BaseException | None] = []
    stopped: list[int] = []
    with ExitStack() as stops:

        def connect_and_stop_the_first_listen(role: str) -> Any:
            connection = connect(role)
            if role == "listen" and not stopped:
                stopped.append(connection.info.backend_pid)
                stops.enter_context(stopped_pids(list(stopped)))
            return connection

        def wait() -> None:
            try:
                ca.wait(0.1)
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        monkeypatch.setattr(ca, "_connect", connect_and_stop_the_first_listen)
        try:
            waiting = threading.Thread(target=wait)
            started = time.monotonic()
            waiting.start()
            waiting.join(timeout + SLACK)
            assert not waiting.is_alive(), "the LISTEN was not cut"
            assert time.monotonic() - started < timeout + SLACK
            assert len(outcome) == 1 and isinstance(outcome[0], Exception), outcome
            # the next wait listens on a new connection (the old backend still stopped):
            # another instance's write wakes it
            ca.wait(0)
            b.put_subscription(subscription("s-after"))
            started = time.monotonic()
            ca.wait(60)
            assert time.monotonic() - started < 60
        finally:
            stops.close()
            waiting.join(30)
            ca.leave()
            a.close()
            b.close()
