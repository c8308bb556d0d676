"""The heartbeat does not wait for following (docs/scale-out.md, "Delivery ownership").

A test connection locks the change log (``LOCK TABLE wsnmom_changes IN ACCESS EXCLUSIVE
MODE``): every instance's following blocks on its next read of it, as a long round of
following would keep it busy.  The leases must go on being renewed meanwhile, for longer
than a lease: no shard is lost as "not renewed in time", none is taken over.  When one
thread did both, the heartbeat waited behind the blocked read and every instance gave its
shards up once its lease ran out.  The leader's pruning of the change log, done in the
heartbeat's transaction, must not wait for the lock either (it is postponed)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
import requests

from tests.cluster.conftest import Cluster
from tests.support.waiting import wait_until
from wsnmom.testing.gateway import Gateway, free_port

pytestmark = [pytest.mark.rabbitmq, pytest.mark.e2e]

LEASE = 3.0
HEARTBEAT = 0.5
#: renewals each instance must make while its following is blocked: more than a lease's worth
RENEWALS = math.ceil((LEASE + 1.0) / HEARTBEAT)


def cluster_view(gateway: Gateway) -> dict[str, Any]:
    """``GET /wsn/admin/api/cluster`` of one instance."""
    answer = requests.get(gateway.base_url + "/wsn/admin/api/cluster", timeout=10)
    answer.raise_for_status()
    data: dict[str, Any] = answer.json()
    return data


def known(gateway: Gateway) -> int:
    """How many subscriptions the instance knows (admin API)."""
    answer = requests.get(gateway.base_url + "/wsn/admin/api/subscriptions?limit=1", timeout=10)
    answer.raise_for_status()
    return int(answer.json()["count"])


def waiting_for_the_change_log(conn: psycopg.Connection[Any]) -> int:
    """Backends waiting for a lock on ``wsnmom_changes``."""
    row = conn.execute(
        "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
        "WHERE c.relname = 'wsnmom_changes' AND NOT l.granted"
    ).fetchone()
    return int(row[0]) if row else 0


@contextmanager
def change_log_locked(store_url: str) -> Iterator[psycopg.Connection[Any]]:
    """Hold an exclusive lock on the change log; yield a second connection to look with."""
    with (
        psycopg.connect(store_url) as locker,
        psycopg.connect(store_url, autocommit=True) as look,
        locker.transaction(),
    ):
        locker.execute("LOCK TABLE wsnmom_changes IN ACCESS EXCLUSIVE MODE")
        yield look


def test_leases_are_renewed_while_following_is_blocked(
    cluster: Callable[..., Cluster],
) -> None:
    c = cluster(2, WSNMOM_CLUSTER__LEASE=f"{LEASE:g}", WSNMOM_CLUSTER__HEARTBEAT=f"{HEARTBEAT:g}")
    a, b = c.gateways

    def spread() -> bool:
        held = [len(cluster_view(g)["held"]) for g in c.gateways]
        return sum(held) == 64 and min(held) == 32

    wait_until(spread, 30, what="the 64 shards spread over the two instances")
    before = [cluster_view(g)["counts"] for g in c.gateways]
    with change_log_locked(c.store_url) as look:
        # both followers poll the change log every 0.5 s: each blocks on its next read
        wait_until(
            lambda: waiting_for_the_change_log(look) >= 2,
            10,
            what="both instances' following waiting for the locked change log",
        )
        blocked = [cluster_view(g)["counts"]["renewals"] for g in c.gateways]
        # the outcome: more than a lease's worth of renewals by each while blocked
        wait_until(
            lambda: all(
                cluster_view(g)["counts"]["renewals"] >= blocked[i] + RENEWALS
                for i, g in enumerate(c.gateways)
            ),
            (LEASE + 1.0) * 4,
            what=f"{RENEWALS} lease renewals by each instance while its following is blocked",
        )
        assert waiting_for_the_change_log(look) >= 2, "the followers were not kept waiting"
        after = [cluster_view(g)["counts"] for g in c.gateways]
        for i, name in enumerate("ab"):
            lost = after[i]["expired"] - before[i]["expired"]
            moved = after[i]["failovers"] - before[i]["failovers"]
            assert (lost, moved) == (0, 0), (
                f"{name} lost {lost} shards as expired and took {moved} over while its "
                "following was blocked"
            )
        assert sum(len(cluster_view(g)["held"]) for g in c.gateways) == 64
    # following resumes once the lock is gone: a Subscribe through a is known to b
    count = known(b)
    with c.client(a) as client:
        client.subscribe(f"http://127.0.0.1:{free_port()}/apart", "{urn:cluster}apart")
    wait_until(lambda: known(b) > count, 10, what="b following a Subscribe made through a")
