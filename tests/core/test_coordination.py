"""The cluster's tables in a PostgreSQL store (``core.coordination_postgres``), driven
directly with two instances' coordinations on one fresh database: the change log shows
each instance what the other wrote (once, never its own writes), shards are shared fairly
and handed back when an instance joins, a taken-over lease bumps its epoch, the
leadership is one session's advisory lock whose every taking bumps its epoch (and a
leader's save in progress under the old epoch is ordered before the bump), and a
single-instance adapter is refused next to a live instance.  ``SingleInstance`` (SQLite)
leads and holds every shard."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from wsnmom.core import coordination, errors
from wsnmom.core.coordination import (
    NONCE_LIMIT,
    Change,
    Coordination,
    InstanceRefused,
    SingleInstance,
    shard_of,
)
from wsnmom.core.model import EndpointReference, ExpressionSource, PublisherRegistration
from wsnmom.core.store import Deposed, Store
from wsnmom.core.store_postgres import PostgresStore
from wsnmom.core.store_url import open_store

from tests.core.test_store_conformance import subscription
from tests.support.clock import later
from tests.support.waiting import wait_until

SHARDS = 8
LEASE = 30.0


@pytest.fixture
def stores(postgres_store_url: str) -> Iterator[tuple[Store, Store]]:
    a = open_store(postgres_store_url, instance_id="a")
    b = open_store(postgres_store_url, instance_id="b")
    yield a, b
    a.close()
    b.close()


def test_each_instance_sees_the_others_writes_once_and_never_its_own(
    stores: tuple[Store, Store],
) -> None:
    a, b = stores
    ca, cb = a.coordination("a"), b.coordination("b")
    cursor_a, cursor_b = ca.cursor(), cb.cursor()
    a.put_subscription(subscription("s1"))
    b.put_subscription(subscription("s2"))
    a.delete_subscription("s1")
    cursor_a, seen_a = ca.changes(cursor_a)
    cursor_b, seen_b = cb.changes(cursor_b)
    assert seen_a == [Change("subscription", "s2")]
    assert seen_b == [Change("subscription", "s1")]  # two writes of s1: one change
    # read again (the rows are younger than the settling time): nothing twice
    assert ca.changes(cursor_a)[1] == [] and cb.changes(cursor_b)[1] == []


def test_shards_are_shared_fairly_and_a_takeover_bumps_the_epoch(
    stores: tuple[Store, Store],
) -> None:
    a, b = stores
    ca, cb = a.coordination("a"), b.coordination("b")
    ca.join("http://a", "1", single_instance=False)
    alone = ca.heartbeat(SHARDS, LEASE)
    assert sorted(alone.held) == list(range(SHARDS)) and alone.released == ()
    cb.join("http://b", "1", single_instance=False)
    assert cb.heartbeat(SHARDS, LEASE).held == {}  # every shard is leased to a
    # a is above its fair share now: it hands half back, b takes them
    shared = ca.heartbeat(SHARDS, LEASE)
    assert len(shared.held) == SHARDS // 2 and len(shared.released) == SHARDS // 2
    ca.release(shared.released)
    taken = cb.heartbeat(SHARDS, LEASE)
    assert sorted(taken.held) == sorted(shared.released)
    assert set(taken.held.values()) == {2}  # a's epoch was 1: b's lease is the next one
    instances = {i.id: i for i in ca.instances()}
    assert {s for s, _ in instances["b"].shards} == set(taken.held)
    # b dies: its heartbeat and its leases lapse (as a lease's time passing would do)
    with b.transaction() as conn:  # type: ignore[attr-defined]
        conn.execute("UPDATE wsnmom_shards SET expires_at = now() - interval '1 s'")
        conn.execute("UPDATE wsnmom_instances SET heartbeat = now() - interval '1 h'")
    # a takes them over with the next epoch (its own leases lapsed too: renewed with 2)
    after = ca.heartbeat(SHARDS, LEASE)
    assert sorted(after.held) == list(range(SHARDS))
    assert all(after.held[s] == 3 for s in taken.held)
    assert all(after.held[s] == 2 for s in shared.held)


def test_a_heartbeat_stopped_inside_its_transaction_does_not_keep_its_shards(
    postgres_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An instance stopped (SIGSTOP, a frozen host) inside its heartbeat's transaction,
    after renewing its leases, held its shard rows locked, and the others' take-over skips
    locked rows: nobody took its shards for as long as it stayed stopped (the HA suite on
    Kafka, at load 20-30: none within lease + 20 s).  The server now ends such a session
    after half a lease.  The stop is a's leader pruning held inside the transaction, with
    a's own call deadline out of reach (a stopped process's deadline thread is stopped
    too); checked to fail before (b took none in 30 s)."""
    a = PostgresStore(postgres_store_url, instance_id="a", call_timeout=600)
    b = open_store(postgres_store_url, instance_id="b")
    try:
        _stopped_inside_its_heartbeat(a.coordination("a"), b.coordination("b"), monkeypatch)
    finally:
        a.close()
        b.close()


def _stopped_inside_its_heartbeat(
    ca: Coordination, cb: Coordination, monkeypatch: pytest.MonkeyPatch
) -> None:
    lease = 2.0
    ca.join("http://a", "1", single_instance=False)
    assert sorted(ca.heartbeat(SHARDS, lease).held) == list(range(SHARDS))
    cb.join("http://b", "1", single_instance=False)
    assert cb.heartbeat(SHARDS, lease).held == {}  # every shard is leased to a
    assert ca.lead()  # its next heartbeat prunes, inside the transaction
    stopped, resumed = threading.Event(), threading.Event()

    def held_in_pruning(conn: object) -> None:
        stopped.set()
        resumed.wait(60)

    monkeypatch.setattr(ca, "_prune", held_in_pruning)
    outcome: list[BaseException | object] = []

    def beat() -> None:
        try:
            outcome.append(ca.heartbeat(SHARDS, lease))
        except BaseException as exc:
            outcome.append(exc)

    beating = threading.Thread(target=beat)
    beating.start()
    try:
        assert stopped.wait(30)  # a renewed its leases and stopped in the transaction
        taken = wait_until(
            lambda: cb.heartbeat(SHARDS, lease).held, 30, what="b taking a's lapsed shards"
        )
        assert taken
    finally:
        resumed.set()
        beating.join(timeout=60)
    assert not beating.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], Exception), outcome  # session ended
    ca.leave()


def test_a_leader_stopped_for_a_lease_loses_the_leadership(stores: tuple[Store, Store]) -> None:
    """A stopped leader (SIGSTOP, a frozen host) keeps its session, and so the lock, on the
    server: nobody did the periodic work while it stayed stopped.  Its leadership
    connection, which a running leader uses at every heartbeat, is ended by the server
    once idle for a lease, and another instance leads.  The stop: a's heartbeat thread
    no longer calls ``lead``.  Checked to fail before (b did not lead within 30 s)."""
    a, b = stores
    ca, cb = a.coordination("a"), b.coordination("b")
    ca.join("http://a", "1", single_instance=False)
    cb.join("http://b", "1", single_instance=False)
    ca.heartbeat(SHARDS, 2.0)  # the lease a's leadership connection is bounded by
    assert ca.lead() is True and cb.lead() is False
    wait_until(cb.lead, 30, what="b leading once a's stopped session was ended")
    assert cb.epoch() == 2
    assert ca.lead() is False  # a, back: its connection is gone, and the lock with it
    cb.leave()
    ca.leave()


def test_the_leadership_is_one_sessions_lock(stores: tuple[Store, Store]) -> None:
    a, b = stores
    ca, cb = a.coordination("a"), b.coordination("b")
    assert ca.lead() is True
    assert cb.lead() is False
    assert (ca.epoch(), cb.epoch()) == (1, None)  # each taking of the leadership: the next
    ca.leave()  # closes a's session: the lock goes once the server ended that session
    wait_until(cb.lead, 10, what="b taking the leadership a's closed session held")
    assert (ca.epoch(), cb.epoch()) == (None, 2)
    cb.leave()


def test_a_leader_whose_connection_the_store_dropped_knows_it_at_its_next_lead(
    stores: tuple[Store, Store],
) -> None:
    """The leadership's connection is used by nothing else (the follow thread waits on
    another): ``lead`` itself notices that the store ended it, and the other instance
    takes the leadership."""
    a, b = stores
    ca, cb = a.coordination("a"), b.coordination("b")
    assert ca.lead() is True
    with b.transaction() as conn:  # type: ignore[attr-defined]
        ended = conn.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = 'a/leader'"
        ).fetchone()[0]
    assert ended == 1
    wait_until(cb.lead, 10, what="b taking the leadership a's ended connection held")
    assert ca.lead() is False
    ca.leave()
    cb.leave()


def waiting_for_a_lock(store: Store, application_name: str) -> bool:
    """Whether the session named ``application_name`` waits for a lock now."""
    with store.transaction() as conn:  # type: ignore[attr-defined]
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE application_name = %s AND wait_event_type = 'Lock'",
            (application_name,),
        ).fetchone()
    return bool(row[0])


def test_a_new_leader_s_epoch_waits_for_a_save_in_progress_under_the_old_one(
    stores: tuple[Store, Store], postgres_store_url: str
) -> None:
    """A's demand save has checked its epoch and waits (the registration's row is locked
    elsewhere) when A is deposed and B takes the leadership: B's bump of the epoch waits
    for that save, which is then written under the old epoch, and B, leading after it,
    would read it (its first pass reads the store).  Without the fence's row lock B's bump
    came first and the old epoch's save landed after it, unseen by B's first read."""
    import psycopg

    a, b = stores
    registration = PublisherRegistration(
        "r-fence",
        datetime(2030, 1, 1, tzinfo=UTC),
        None,
        EndpointReference("http://127.0.0.1:9/p"),
        (ExpressionSource("urn:dialect", "t:a", {"t": "urn:t"}),),
        demand=True,
    )
    a.put_registration(registration)
    ca, cb = a.coordination("a"), b.coordination("b")
    assert ca.lead() and cb.lead() is False
    epoch = ca.epoch()
    assert epoch is not None
    ours = EndpointReference("http://127.0.0.1:9/p/subscriptions/1")
    saves: list[bool] = []
    with psycopg.connect(postgres_store_url, application_name="holder") as holder:
        holder.execute("SELECT 1 FROM registrations WHERE id = 'r-fence' FOR UPDATE")
        saving = threading.Thread(
            target=lambda: saves.append(
                a.save_registration_demand("r-fence", ours, False, epoch=epoch)
            )
        )
        saving.start()
        # a's pool connection is named after its instance: a session of "a" waits
        wait_until(lambda: waiting_for_a_lock(a, "a"), 10, what="a's save waiting for the row")
        with b.transaction() as conn:  # type: ignore[attr-defined]
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = 'a/leader'"
            )
        taking = threading.Thread(target=lambda: wait_until(cb.lead, 10, what="b leading"))
        taking.start()
        wait_until(
            lambda: waiting_for_a_lock(b, "b/leader"),
            10,
            what="b's bump of the epoch waiting for a's save in progress",
        )
        holder.rollback()  # the row free: a's save goes on, then b's bump
        saving.join(10)
        taking.join(20)
    assert saves == [True]
    assert cb.epoch() == epoch + 1
    stored = b.get_registration("r-fence")
    assert stored is not None and stored.demand_subscription == ours
    with pytest.raises(Deposed):
        a.save_registration_demand("r-fence", None, False, epoch=epoch)
    ca.leave()
    cb.leave()


def test_a_single_instance_adapter_is_refused_next_to_a_live_instance(
    stores: tuple[Store, Store],
) -> None:
    a, b = stores
    a.coordination("a").join("http://a", "1", single_instance=True)
    with pytest.raises(InstanceRefused, match="serves one instance only"):
        b.coordination("b").join("http://b", "1", single_instance=True)


def test_one_instance_on_sqlite_leads_and_holds_every_shard() -> None:
    single = SingleInstance("only")
    assert single.lead() and not single.shared
    assert single.epoch() == coordination.SINGLE_EPOCH
    assert sorted(single.heartbeat(SHARDS, LEASE).held) == list(range(SHARDS))
    assert single.changes(0) == (0, [])
    assert 0 <= shard_of("some-id", SHARDS) < SHARDS
    assert shard_of("some-id", SHARDS) == shard_of("some-id", SHARDS)


def _nonce_rows(store: Store) -> list[str]:
    with store.transaction() as conn:  # type: ignore[attr-defined]
        rows = conn.execute("SELECT nonce FROM wsnmom_nonces ORDER BY nonce").fetchall()
    return [str(r[0]) for r in rows]


def test_a_forwarded_requests_nonce_is_taken_once_across_instances_and_the_leader_purges_it(
    stores: tuple[Store, Store],
) -> None:
    """``first_use``: one insert; the second use of a nonce, through the same instance or
    another, is refused; the leader's heartbeat deletes nonces past their expiry (with the
    margin for clocks), and only those."""
    a, b = stores
    ca, cb = a.coordination("a"), b.coordination("b")
    now = time.time()
    assert ca.first_use("n-live", now + 60) is True
    assert ca.first_use("n-live", now + 60) is False  # a replay to the same instance
    assert cb.first_use("n-live", now + 60) is False  # and to another
    with a.transaction() as conn:  # type: ignore[attr-defined]
        # a nonce recorded long ago (expired beyond the margin)
        conn.execute("INSERT INTO wsnmom_nonces VALUES ('n-old', to_timestamp(%s))", (now - 300,))
    assert cb.first_use("n-recent", now - 1) is True  # expired within the margin: kept
    assert _nonce_rows(a) == ["n-live", "n-old", "n-recent"]
    cb.heartbeat(SHARDS, LEASE)  # not the leader: purges nothing
    assert _nonce_rows(a) == ["n-live", "n-old", "n-recent"]
    assert ca.lead()
    ca.heartbeat(SHARDS, LEASE)
    assert _nonce_rows(a) == ["n-live", "n-recent"]
    ca.leave()
    cb.leave()


def _old_nonce(store: Store, nonce: str) -> None:
    """Record ``nonce`` as expired long ago (beyond the margin: the leader deletes it)."""
    with store.transaction() as conn:  # type: ignore[attr-defined]
        conn.execute(
            "INSERT INTO wsnmom_nonces VALUES (%s, to_timestamp(%s))", (nonce, time.time() - 300)
        )


def test_the_leader_prunes_at_its_first_heartbeat_then_every_prune_every_seconds(
    stores: tuple[Store, Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pruning is five round trips: at every heartbeat (each second) they were half of an
    idle leader's wake-ups.  The first heartbeat as leader prunes, the next ones only
    once :data:`PRUNE_EVERY` seconds passed (made 0 here to see it happen)."""
    from wsnmom.core import coordination_postgres

    a, _ = stores
    ca = a.coordination("a")
    assert ca.lead()
    _old_nonce(a, "n-first")
    ca.heartbeat(SHARDS, LEASE)
    assert _nonce_rows(a) == []
    _old_nonce(a, "n-next")
    ca.heartbeat(SHARDS, LEASE)  # within PRUNE_EVERY of the last pruning
    assert _nonce_rows(a) == ["n-next"]
    monkeypatch.setattr(coordination_postgres, "PRUNE_EVERY", 0.0)
    ca.heartbeat(SHARDS, LEASE)
    assert _nonce_rows(a) == []
    ca.leave()


def test_a_pruning_the_locked_change_log_postpones_renews_the_leases_and_comes_back(
    stores: tuple[Store, Store], postgres_store_url: str
) -> None:
    """The leader's pruning due while another session locks the change log gives up
    after its lock wait: the heartbeat renews the leases, and the next heartbeat prunes
    (its time had not been counted as a pruning)."""
    import psycopg

    a, _ = stores
    ca = a.coordination("a")
    assert ca.lead()
    _old_nonce(a, "n-old")
    renewed: list[int] = []
    with psycopg.connect(postgres_store_url) as locker:
        locker.execute("LOCK TABLE wsnmom_changes IN ACCESS EXCLUSIVE MODE")
        beat = threading.Thread(
            target=lambda: renewed.append(len(ca.heartbeat(SHARDS, LEASE).held)), daemon=True
        )
        beat.start()
        beat.join(60)  # without the lock wait's bound: for as long as the lock is held
        assert renewed == [SHARDS]
        assert _nonce_rows(a) == ["n-old"]  # postponed with the change log's pruning
        locker.rollback()
    ca.heartbeat(SHARDS, LEASE)
    assert _nonce_rows(a) == []
    ca.leave()


def test_one_instance_remembers_a_nonce_until_it_expires() -> None:
    single = SingleInstance("only")
    now = time.time()
    assert single.first_use("n", now + 60) is True
    assert single.first_use("n", now + 60) is False
    assert single.first_use("old", now - 1) is True
    assert single.first_use("old", now + 60) is True  # its first record had expired


def test_one_instance_takes_each_nonce_once_under_concurrency() -> None:
    """Request threads recording nonces at once (past the point where expired ones are
    swept): each nonce is taken exactly once, and none is lost or raises."""
    single = SingleInstance("only")
    now = time.time()
    for i in range(5000):
        assert single.first_use(f"earlier-{i}", now + 60)
    nonces = [f"n-{i}" for i in range(2000)]
    taken: list[str] = []
    failed: list[BaseException] = []
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads interleave between almost every bytecode

    def run() -> None:
        try:
            taken.extend(n for n in nonces if single.first_use(n, now + 60))
        except BaseException as exc:  # recorded, asserted below
            failed.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(switch)
    assert failed == []
    assert sorted(taken) == sorted(nonces)  # each exactly once


def test_one_instance_remembers_a_bounded_number_of_live_nonces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Beyond :data:`NONCE_LIMIT` live nonces a forward is refused as "try again" (the
    caller answers 503), never remembered in a set that grows without bound; expired
    nonces make room.  (The "ending" nonces expire 30 s ahead and the clock is moved past
    them: with 0.5 s of real time, filling the set on a loaded machine outlasted them.)"""
    single = SingleInstance("only")
    now = time.time()
    for i in range(NONCE_LIMIT - 10):
        single.first_use(f"live-{i}", now + 600)
    for i in range(10):
        single.first_use(f"ending-{i}", now + 30)
    with pytest.raises(errors.ResourceUnavailable):
        single.first_use("one-more", now + 600)
    assert single.first_use("live-0", now + 600) is False  # a replay is still a replay
    later(monkeypatch, coordination, 31)
    assert single.first_use("one-more", now + 600) is True  # an expired one made room


def test_a_nonce_the_leader_may_have_purged_already_is_refused(
    stores: tuple[Store, Store],
) -> None:
    """An instance whose clock is behind the store's by more than the margin judges a
    signature still valid after the leader (by the store's clock) deleted its nonce: the
    store refuses such a nonce, recorded or not, so that a replay then is never taken for a
    first use."""
    a, b = stores
    ca, cb = a.coordination("a"), b.coordination("b")
    now = time.time()  # the store's clock: the test's (one host)
    assert ca.lead()
    assert cb.first_use("n-skewed", now - 90) is False
    ca.heartbeat(SHARDS, LEASE)  # the leader purges what expired beyond the margin
    assert cb.first_use("n-skewed", now - 90) is False  # the replay, after the purge
    assert cb.first_use("n-fresh", now + 60) is True
    ca.leave()
    cb.leave()


def test_a_nonce_used_through_two_instances_at_once_is_taken_once(
    stores: tuple[Store, Store],
) -> None:
    """Two instances recording the same nonces at the same moment (a forward and its
    replay racing): the store's unique key lets exactly one take each."""
    a, b = stores
    ca, cb = a.coordination("a"), b.coordination("b")
    expires = time.time() + 60
    nonces = [f"race-{i}" for i in range(50)]
    taken: list[str] = []
    start = threading.Barrier(2)

    def run(coordination: Coordination) -> None:
        start.wait()
        taken.extend(n for n in nonces if coordination.first_use(n, expires))

    threads = [threading.Thread(target=run, args=(c,)) for c in (ca, cb)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(taken) == sorted(nonces)
    ca.leave()
    cb.leave()


def _age_changes(store: Store, seconds: float) -> None:
    """Make every change-log row ``seconds`` older (as time passing would)."""
    with store.transaction() as conn:  # type: ignore[attr-defined]
        conn.execute("UPDATE wsnmom_changes SET at = at - make_interval(secs => %s)", (seconds,))


def test_an_instances_own_rows_are_not_read_back_and_still_move_its_cursor_once_settled(
    stores: tuple[Store, Store],
) -> None:
    """A burst of writes through one instance: its own rows never come back from
    ``changes`` (only the highest settled seq does, as the new cursor), while another
    instance's rows do, once each, whether settled or not."""
    a, b = stores
    ca = a.coordination("a")
    start = ca.cursor()
    for n in range(5):
        a.put_subscription(subscription(f"own{n}"))
    cursor, seen = ca.changes(start)
    assert (cursor, seen) == (start, [])  # nothing settled yet, nothing of a's own
    b.put_subscription(subscription("theirs"))
    _age_changes(a, 60)  # every row settled now
    a.put_subscription(subscription("own-fresh"))  # and one that is not
    settled_top = ca.cursor() - 1  # the last row is own-fresh's, unsettled
    cursor, seen = ca.changes(start)
    assert seen == [Change("subscription", "theirs")]
    assert cursor == settled_top
    assert ca.changes(cursor) == (cursor, [])  # own-fresh is a's own: never read back


def test_an_instances_own_writes_do_not_wake_it_and_another_instances_do(
    stores: tuple[Store, Store], postgres_store_url: str
) -> None:
    """The NOTIFY of a change carries its writer: ``wait`` lets this instance's own go by
    and returns on another instance's.  A listener of its own shows when the NOTIFY of
    a's write was sent (to every listener at once)."""
    import psycopg

    a, b = stores
    ca = a.coordination("a")
    ca.wait(0)  # a's session listens from now on
    with psycopg.connect(postgres_store_url, autocommit=True) as witness:
        witness.execute("LISTEN wsnmom_changes")
        a.put_subscription(subscription("own"))
        got = [n.payload for n in witness.notifies(timeout=30, stop_after=1)]
        assert got == ["a"]  # the writer's instance id
        started = time.monotonic()
        ca.wait(2.0)  # the NOTIFY of a's own write is there: it does not end the wait
        assert time.monotonic() - started >= 2.0
        b.put_subscription(subscription("theirs"))
        assert [n.payload for n in witness.notifies(timeout=30, stop_after=1)] == ["b"]
        started = time.monotonic()
        ca.wait(60.0)
        assert time.monotonic() - started < 60.0  # woken by b's write, not timed out
    ca.leave()


def _voluntary_switches() -> int:
    """How often the calling thread gave up the processor to wait (Linux)."""
    status = Path(f"/proc/self/task/{threading.get_native_id()}/status").read_text()
    return int(status.split("voluntary_ctxt_switches:")[1].split()[0])


def test_an_idle_wait_sleeps_until_the_store_sends_something(
    stores: tuple[Store, Store],
) -> None:
    """The follow thread's wait for another instance's write does not wake up on its
    own: psycopg's ``notifies(timeout=...)`` woke every 0.1 s (ten times in a second's
    wait), each wake-up a request for the GIL the busy threads of a gateway hold.  Only
    voluntary switches are counted (a wait's wake-ups; a loaded machine's preemptions
    are the other kind)."""
    a, _ = stores
    ca = a.coordination("a")
    ca.wait(0)  # connected and listening
    woke: list[int] = []

    def waiting() -> None:
        before = _voluntary_switches()
        ca.wait(1.0)
        woke.append(_voluntary_switches() - before)

    thread = threading.Thread(target=waiting)
    thread.start()
    thread.join(30)
    assert woke and woke[0] <= 4, woke  # the timeout's, and a GIL hand-over or two
    ca.leave()
