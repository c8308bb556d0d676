"""Delivery positions kept in a PostgreSQL store, fenced by shard epochs
(``core.position_fence``, ``core.positions_postgres``), with two instances'
coordinations on one fresh database: the new owner's positions are never overwritten by
a write carrying the epoch an instance held the shard with before it was taken over (a
zombie), also when that write was already waiting at the store while the takeover
committed; the final positions of a shard handed back cleanly land until another
instance takes it."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from wsnmom.core.coordination import Coordination
from wsnmom.core.position_fence import NOT_HELD, TAKEN_OVER, FencedPositions
from wsnmom.core.store import Store
from wsnmom.core.store_url import open_store

from tests.core.test_coordination import waiting_for_a_lock
from tests.support.waiting import wait_until

SHARDS = 1  # every name in shard 0
LEASE = 30.0
STREAM = ("wsnmom.t", 0)


@pytest.fixture
def stores(postgres_store_url: str) -> Iterator[tuple[Store, Store]]:
    a = open_store(postgres_store_url, instance_id="a")
    b = open_store(postgres_store_url, instance_id="b")
    yield a, b
    a.close()
    b.close()


def keeper(coordination: Coordination, token: tuple[int, int]) -> FencedPositions:
    """A keeper whose every name is fenced by ``token`` (the lease check is not asked:
    what a write that passed it before the process was stopped carries)."""
    table = coordination.positions()
    assert table is not None
    return FencedPositions(table, lambda name: token)


def taken_over(store: Store, ca: Coordination, cb: Coordination) -> tuple[int, int]:
    """A holds shard 0, then its lease lapses and B takes it over: both epochs."""
    ca.join("http://a", "1", single_instance=False)
    cb.join("http://b", "1", single_instance=False)
    epoch_a = ca.heartbeat(SHARDS, LEASE).held[0]
    with store.transaction() as conn:  # type: ignore[attr-defined]
        conn.execute("UPDATE wsnmom_shards SET expires_at = now() - interval '1 s'")
        conn.execute(
            "UPDATE wsnmom_instances SET heartbeat = now() - interval '1 h' WHERE id = 'a'"
        )
    epoch_b = cb.heartbeat(SHARDS, LEASE).held[0]
    assert epoch_b == epoch_a + 1
    return epoch_a, epoch_b


def test_a_zombies_write_is_refused_and_the_new_owners_position_stays(
    stores: tuple[Store, Store],
) -> None:
    a, b = stores
    ca, cb = a.coordination("a"), b.coordination("b")
    ca.join("http://a", "1", single_instance=False)
    epoch_a = ca.heartbeat(SHARDS, LEASE).held[0]
    zombie = keeper(ca, (0, epoch_a))
    assert zombie.save({"s": {STREAM: 5}, "w": {STREAM: 1}}) == {}
    epoch_a, epoch_b = taken_over(a, ca, cb)
    owner = keeper(cb, (0, epoch_b))
    assert owner.load(["s"]) == {"s": {STREAM: 5}}  # what A saved while it held it
    assert owner.save({"s": {STREAM: 9}}) == {}
    # A runs again: its write carries the epoch it held the shard with
    assert zombie.save({"s": {STREAM: 6}, "w": {STREAM: 2}}) == {"s": TAKEN_OVER, "w": TAKEN_OVER}
    assert owner.load(["s", "w"]) == {"s": {STREAM: 9}, "w": {STREAM: 1}}
    assert owner.load_all() == {"s": {STREAM: 9}, "w": {STREAM: 1}}
    # a name without a token is refused without a write (``may_save`` says no), and
    # says so: not as a takeover the store found
    refusing = FencedPositions(zombie._table, lambda name: None)
    assert refusing.save({"s": {STREAM: 1}, "w": {STREAM: 3}}) == {"s": NOT_HELD, "w": NOT_HELD}
    assert NOT_HELD != TAKEN_OVER
    owner.delete(["s"])
    assert owner.load(["s", "w"]) == {"w": {STREAM: 1}}


def test_a_write_waiting_behind_a_takeover_is_refused_once_it_commits(
    stores: tuple[Store, Store], postgres_store_url: str
) -> None:
    """A's save reached the store while a takeover of its shard held the shard's row:
    it waits, the takeover bumps the epoch and commits, and A's write is refused (it
    re-checks the new row version).  Without the row lock in the write's statement it
    did not wait and landed after the takeover, over the new owner's positions."""
    import psycopg

    a, b = stores
    ca, cb = a.coordination("a"), b.coordination("b")
    ca.join("http://a", "1", single_instance=False)
    epoch = ca.heartbeat(SHARDS, LEASE).held[0]
    zombie = keeper(ca, (0, epoch))
    assert zombie.save({"s": {STREAM: 5}}) == {}
    refused: list[dict[str, str]] = []
    with psycopg.connect(postgres_store_url, application_name="taker") as taker:
        taker.execute("SELECT 1 FROM wsnmom_shards WHERE shard = 0 FOR UPDATE")
        saving = threading.Thread(target=lambda: refused.append(zombie.save({"s": {STREAM: 3}})))
        saving.start()
        # a's pool connections are named after its instance: a session of "a" waits
        wait_until(lambda: waiting_for_a_lock(b, "a"), 10, what="A's save waiting for the row")
        taker.execute("UPDATE wsnmom_shards SET owner = 'b', epoch = epoch + 1 WHERE shard = 0")
        taker.commit()
        saving.join(10)
    assert refused == [{"s": TAKEN_OVER}]
    assert keeper(cb, (0, epoch + 1)).load(["s"]) == {"s": {STREAM: 5}}


def test_a_clean_hand_backs_final_positions_land_until_another_instance_takes_the_shard(
    stores: tuple[Store, Store],
) -> None:
    a, b = stores
    ca, cb = a.coordination("a"), b.coordination("b")
    ca.join("http://a", "1", single_instance=False)
    epoch = ca.heartbeat(SHARDS, LEASE).held[0]
    handing = keeper(ca, (0, epoch))
    ca.release([0])  # handed back before the final position is saved
    assert handing.save({"s": {STREAM: 7}}) == {}
    cb.join("http://b", "1", single_instance=False)
    taken = cb.heartbeat(SHARDS, LEASE).held[0]
    assert taken == epoch + 1
    assert handing.save({"s": {STREAM: 4}}) == {"s": TAKEN_OVER}
    assert keeper(cb, (0, taken)).load(["s"]) == {"s": {STREAM: 7}}
