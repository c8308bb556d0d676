"""The cursor engine shared by several gateway instances (``CursorEngine.shared``, cluster
mode, docs/scale-out.md): two engines over one in-memory log and one position store
stand for two instances.  The instance that does not deliver a subscription never writes
its positions; the one that delivers keeps them saved; a new deliverer continues from
what the last one saved, not from where its own idle cursor was made."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from wsnmom.adapters.logbase.engine import CursorEngine
from wsnmom.core.adapter import AdapterError, SubscriptionHandle

from tests.adapters.test_logbase_engine import _MemoryBackend, _MemoryLog, spec
from tests.support.waiting import wait_until
from wsnmom.testing.conformance import Collector

STREAM = ("t", 0)
#: seconds between two position saves of the engines (the engine's default: 1 s)
SAVE_INTERVAL = 0.2


class _SharedPositions:
    """One position store (the middleware's), shared by every instance."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.positions: dict[str, dict[Any, int]] = {}

    def get(self, name: str) -> dict[Any, int] | None:
        with self.lock:
            found = self.positions.get(name)
            return None if found is None else dict(found)


class _InstanceStore:
    """One instance's view of the shared positions; notes every cursor it saved, and
    refuses writes once the instance is dead (kill -9: it writes nothing any more)."""

    def __init__(self, shared: _SharedPositions) -> None:
        self.shared = shared
        self.saved: set[str] = set()
        self.dead = False

    def load(self) -> dict[str, Any]:
        with self.shared.lock:
            return {k: dict(v) for k, v in self.shared.positions.items()}

    def load_one(self, name: str) -> dict[Any, int] | None:
        return self.shared.get(name)

    def save(self, changes: Any) -> None:
        if self.dead:
            raise ConnectionError("this instance is dead")
        with self.shared.lock:
            for name, positions in changes.items():
                self.shared.positions.setdefault(name, {}).update(positions)
                self.saved.add(name)

    def delete(self, names: Any) -> None:
        if self.dead:
            raise ConnectionError("this instance is dead")
        with self.shared.lock:
            for name in names:
                self.shared.positions.pop(name, None)


class _InstanceBackend(_MemoryBackend):
    def __init__(self, log: _MemoryLog, store: _InstanceStore) -> None:
        super().__init__(log)
        self.store = store

    def position_store(self) -> _InstanceStore:  # type: ignore[override]
        return self.store


@pytest.fixture
def engines() -> Iterator[tuple[_MemoryLog, _SharedPositions, list[CursorEngine]]]:
    log = _MemoryLog()
    shared = _SharedPositions()
    made: list[CursorEngine] = []
    for _ in range(2):
        engine = CursorEngine(
            _InstanceBackend(log, _InstanceStore(shared)),  # type: ignore[arg-type]
            catch_up_readers=1,
            # positions saved every 0.2 s instead of every second: the tests wait for
            # saves (what is saved, not how soon, is what they check)
            save_interval=SAVE_INTERVAL,
        )
        engine.shared = True
        engine.start()
        made.append(engine)
    yield log, shared, made
    for engine in made:
        store = engine.backend.position_store()  # type: ignore[attr-defined]
        store.dead = False
        engine.close()


def test_a_new_deliverer_continues_from_the_last_deliverers_saved_position(
    engines: tuple[_MemoryLog, _SharedPositions, list[CursorEngine]],
) -> None:
    log, shared, (a, b) = engines
    store_a = a.backend.position_store()  # type: ignore[attr-defined]
    store_b = b.backend.position_store()  # type: ignore[attr-defined]
    on_a = a.subscription(spec("s", "t"))
    on_b = b.subscription(spec("s", "t"))  # the same subscription, not delivered by B
    got_a = Collector()
    on_a.start(got_a)
    for i in range(10):
        log.append(STREAM, b"%d" % i)
    got_a.wait_for(10, 5)
    # the deliverer keeps its position saved while it delivers
    wait_until(
        lambda: shared.get("s") == {STREAM: 10}, 5, what="A saving the position it delivered"
    )
    # A dies (kill -9): it writes nothing any more; B takes the subscription over
    store_a.dead = True
    got_b = Collector()
    on_b.start(got_b)
    for i in range(10, 13):
        log.append(STREAM, b"%d" % i)
    received = got_b.wait_for_body(b"12", 5)
    # B began where A's saved position said, not where its own idle cursor was made
    assert [m.body for m in received] == [b"10", b"11", b"12"]
    wait_until(lambda: shared.get("s") == {STREAM: 13}, 5, what="B saving its position")
    assert "s" in store_b.saved


def test_an_instance_that_does_not_deliver_a_subscription_never_saves_its_position(
    engines: tuple[_MemoryLog, _SharedPositions, list[CursorEngine]],
) -> None:
    log, shared, (a, b) = engines
    store_b = b.backend.position_store()  # type: ignore[attr-defined]
    a.subscription(spec("s", "t")).start(got := Collector())
    b.subscription(spec("s", "t"))
    # a witness B delivers: once it has its records saved, B's commit passes have run
    witness = Collector()
    b.subscription(spec("w", "t")).start(witness)
    for i in range(5):
        log.append(STREAM, b"%d" % i)
    got.wait_for(5, 5)
    witness.wait_for(5, 5)
    wait_until(lambda: shared.get("w") == {STREAM: 5}, 5, what="B saving the witness")
    wait_until(lambda: shared.get("s") == {STREAM: 5}, 5, what="A saving the subscription")
    b.close()  # a clean stop saves every position B owns: none of the subscription's
    assert store_b.saved == {"w"}
    assert shared.get("s") == {STREAM: 5}


def test_a_deliverer_settling_a_burst_it_was_handed_long_ago_keeps_its_position_saved(
    engines: tuple[_MemoryLog, _SharedPositions, list[CursorEngine]],
) -> None:
    # a pull point drained slowly after a burst: every record was handed out at once, and
    # nothing new arrives while GetMessages settles them
    log, shared, (a, _b) = engines
    held: list[Any] = []
    lock = threading.Lock()

    def keep(received: Any) -> None:
        with lock:
            held.append(received)

    a.subscription(spec("s", "t")).start(keep, prefetch=100)
    for i in range(10):
        log.append(STREAM, b"%d" % i)
    wait_until(lambda: len(held) == 10, 5, what="the burst handed out")
    # the commit passes looked at the cursor and let it go: nothing settled yet
    wait_until(lambda: a.stats()["pinning"] == 0, 5, what="the commit passes done with it")
    for received in held[:6]:
        received.ack()
    # saved within save_interval + commit_interval (before, never: a kill -9 now gave
    # the burst out again from its start)
    wait_until(
        lambda: shared.get("s") == {STREAM: 6}, 5, what="the position of the records settled"
    )


def test_a_subscription_made_through_another_instance_starts_where_it_was_made(
    engines: tuple[_MemoryLog, _SharedPositions, list[CursorEngine]],
) -> None:
    log, shared, (a, b) = engines
    log.append(STREAM, b"before")
    a.subscription(spec("s", "t"))  # made through A, delivered by B
    assert shared.get("s") == {STREAM: 1}  # where it starts, saved before A answered
    for i in range(3):  # published before B followed the new subscription
        log.append(STREAM, b"%d" % i)
    got = Collector()
    b.subscription(spec("s", "t")).start(got)
    received = got.wait_for(3, 5)
    # before, B's cursor began at the end of the log when B made it: these were skipped
    assert [m.body for m in received] == [b"0", b"1", b"2"]


def test_a_stream_that_appeared_after_the_subscription_was_made_is_read_from_its_start(
    engines: tuple[_MemoryLog, _SharedPositions, list[CursorEngine]],
) -> None:
    log, _shared, (a, b) = engines
    log.append(STREAM, b"before")
    a.subscription(spec("s", "t"))  # made through A, delivered by B
    log.append(("t", 1), b"new")  # the first record of a stream A did not know
    got = Collector()
    b.subscription(spec("s", "t")).start(got)
    assert [m.body for m in got.wait_for(1, 5)] == [b"new"]


def test_a_zombies_position_writes_are_fenced_and_move_nothing_back(
    engines: tuple[_MemoryLog, _SharedPositions, list[CursorEngine]],
) -> None:
    """A delivered records, then was stopped (SIGSTOP: its writes do not land) past its
    lease while B took the subscription over and saved a position ahead of A's.  When A
    runs again, its position writes (the pending one, and the last one when its watchdog
    closes the delivery) are refused by core's fence (``may_save``): the saved position
    stays B's.  Before, A wrote its older position over B's, and a later failover
    delivered those records again."""
    log, shared, (a, b) = engines
    store_a = a.backend.position_store()  # type: ignore[attr-defined]
    leased = {"a": True}
    a.may_save = lambda name: name != "s" or leased["a"]
    on_a = a.subscription(spec("s", "t"))
    on_b = b.subscription(spec("s", "t"))
    # witnesses each instance delivers all along: their saves show its commit passes.
    # Each gets a record of its own topic and settles it, which is what has its position
    # saved again (a position that only follows the head past other topics' records is
    # not: before, the witness records carried topic "t", and the wait ran out whenever a
    # commit pass was done with the witness before its record came, at load 15-20)
    witness, witness_b = Collector(), Collector()
    a.subscription(spec("w", "u")).start(witness)
    b.subscription(spec("v", "v")).start(witness_b)
    got_a = Collector()
    on_a.start(got_a)
    store_a.dead = True  # stopped: what A writes from now on does not land
    for i in range(5):
        log.append(STREAM, b"%d" % i)
    got_a.wait_for(5, 30)
    # its lease expires: what it reads from now on it does not post (the lease check
    # before every post), so it settles nothing more; B takes the subscription over and
    # saves past A's position
    leased["a"] = False
    got_a.ack = False
    got_b = Collector()
    on_b.start(got_b)
    for i in range(5, 8):
        log.append(STREAM, b"%d" % i)
    got_b.wait_for_body(b"7", 30)
    wait_until(lambda: (shared.get("s") or {}).get(STREAM) == 8, 30, what="B saving its position")
    # B stops delivering (so that it saves nothing more), and its last commit pass ran
    on_b.stop()
    log.append(("v", 0), b"witness")
    witness_b.wait_for(1, 30)
    wait_until(lambda: (shared.get("v") or {}).get(("v", 0)) == 1, 30, what="B's next commit pass")
    # A runs again: its pending write is tried again, then its watchdog closes the
    # delivery (the position A had: 5)
    store_a.dead = False
    on_a.stop()
    log.append(("u", 0), b"witness")
    witness.wait_for(1, 30)
    wait_until(lambda: (shared.get("w") or {}).get(("u", 0)) == 1, 30, what="A's next commit pass")
    assert (shared.get("s") or {}).get(STREAM) == 8  # before: 5


def test_a_deliverer_keeps_saving_its_position_after_another_stream_was_recreated(
    engines: tuple[_MemoryLog, _SharedPositions, list[CursorEngine]],
) -> None:
    """A stream the deliverer had read (its saved position there in the old log) is
    re-created while it holds unsettled records of another stream: its position is saved
    again at once (the new log's start), and from then on as it settles, as before.
    Before, that one save was the last until it detached: what it settled afterwards was
    never saved, and a kill -9 handed it all out again from the frozen position."""
    log, shared, (a, b) = engines
    store_a = a.backend.position_store()  # type: ignore[attr-defined]
    other = ("t", 1)  # a stream that appeared after the cursor attached (no floor in it)
    held: list[Any] = []
    lock = threading.Lock()

    def keep(received: Any) -> None:
        with lock:
            held.append(received)

    a.subscription(spec("s", "t")).start(keep, prefetch=100)
    for i in range(4):
        log.append(STREAM, b"y%d" % i)
    log.append(other, b"x0")
    wait_until(lambda: len(held) == 5, 5, what="the records handed out")
    with lock:
        by_body = {r.body: r for r in held}
    by_body[b"x0"].ack()
    by_body[b"y0"].ack()
    wait_until(
        lambda: shared.get("s") == {STREAM: 1, other: 1}, 5, what="the position of y0 and x0"
    )
    # y1..y3 unsettled; the other stream starts again empty: its saved offset 1 lies in
    # the old log, so the position is saved again (before any crash could resume there)
    log.recreate(other)
    wait_until(
        lambda: shared.get("s") == {STREAM: 1, other: 0}, 5, what="the save after the restart"
    )
    for body in (b"y1", b"y2", b"y3"):
        by_body[body].ack()
    # saved within save_interval + commit_interval (before, never: it stayed at y1)
    wait_until(lambda: shared.get("s") == {STREAM: 4, other: 0}, 5, what="the position of y1..y3")
    # A dies (kill -9); B takes over from the saved position: nothing settled comes again
    store_a.dead = True
    got_b = Collector()
    b.subscription(spec("s", "t")).start(got_b)
    log.append(STREAM, b"y4")
    received = got_b.wait_for_body(b"y4", 5)
    assert [m.body for m in received] == [b"y4"]


def test_a_deliverer_with_nothing_unsettled_keeps_its_position_saved_when_a_stream_is_recreated(
    engines: tuple[_MemoryLog, _SharedPositions, list[CursorEngine]],
) -> None:
    """Everything settled, a stream it had read is re-created: its position is saved again
    (the new log's start), not deleted.  Before, it was deleted as on one instance (where
    the head's commit covers a cursor at the head; shared, it never does), and stayed
    deleted while no record came: an instance that made the subscription after a kill -9
    started it at the end of the log, and what was published meanwhile was skipped."""
    log, shared, (a, b) = engines
    store_a = a.backend.position_store()  # type: ignore[attr-defined]
    other = ("t", 1)
    got = Collector()
    a.subscription(spec("s", "t")).start(got)
    log.append(STREAM, b"y0")
    log.append(other, b"x0")
    got.wait_for(2, 5)
    wait_until(lambda: shared.get("s") == {STREAM: 1, other: 1}, 5, what="the position of both")
    # the commit passes are done with it (saved and unchanged)
    wait_until(lambda: a.stats()["pinning"] == 0, 5, what="the commit passes done with it")
    log.recreate(other)
    wait_until(
        lambda: shared.get("s") == {STREAM: 1, other: 0}, 5, what="the save after the restart"
    )
    # A dies (kill -9); a record is published; then B makes the subscription and delivers it
    store_a.dead = True
    log.append(STREAM, b"y1")
    got_b = Collector()
    b.subscription(spec("s", "t")).start(got_b)
    log.append(STREAM, b"y2")
    received = got_b.wait_for_body(b"y2", 5)
    assert [m.body for m in received] == [b"y1", b"y2"]


def test_a_deliverer_forgetting_a_subscription_another_instance_deleted_leaves_nothing(
    engines: tuple[_MemoryLog, _SharedPositions, list[CursorEngine]],
) -> None:
    # B deletes the subscription A delivers (an Unsubscribe through B); A follows: it
    # stops the handle, whose position it saves at the next commit pass, possibly after
    # B's delete (tests/cluster/test_kafka_groups.py plays it on Kafka)
    log, shared, (a, b) = engines
    on_a = a.subscription(spec("s", "t"))
    b.subscription(spec("s", "t"))
    on_a.start(got := Collector())
    log.append(STREAM, b"0")
    got.wait_for(1, 5)
    wait_until(lambda: shared.get("s") == {STREAM: 1}, 5, what="A saving the position")
    b.delete_subscription("s")
    wait_until(lambda: shared.get("s") is None, 5, what="B's delete")
    on_a.stop()
    # the save the stop asks for lands after B's delete: the position is there again
    wait_until(lambda: shared.get("s") == {STREAM: 1}, 5, what="A's save at the stop")
    a.forget_subscription("s")
    wait_until(lambda: shared.get("s") is None, 5, what="A deleting what it saved")
    assert "s" not in a.names() and "s" not in b.names()
    assert a.stats()["cursors"] == 0 and b.stats()["cursors"] == 0


def paused_with_ten_waiting(
    log: _MemoryLog, shared: _SharedPositions, a: CursorEngine
) -> tuple[SubscriptionHandle, Collector]:
    """Subscription "s" delivered by ``a``: its first record delivered and the position
    past it saved, then paused with ten more records waiting (read by the head)."""
    handle = a.subscription(spec("s", "t"))
    handle.start(got := Collector())
    log.append(STREAM, b"0")
    got.wait_for(1, 5)
    wait_until(lambda: shared.get("s") == {STREAM: 1}, 5, what="A saving the position")
    handle.stop()  # paused
    for i in range(1, 11):
        log.append(STREAM, b"%d" % i)
    wait_until(lambda: handle.depth() == 10, 5, what="the head reading the ten records")
    return handle, got


def test_a_purge_is_not_undone_by_a_resume_while_its_position_is_being_saved(
    engines: tuple[_MemoryLog, _SharedPositions, list[CursorEngine]],
) -> None:
    # tests/cluster/test_any_instance.py's peek/purge on Kafka got the purged messages
    # after the resume (session 9): the resume took the position up from the store while
    # the commit pass was still saving the one past the purged records
    log, shared, (a, _b) = engines
    store = a.backend.position_store()  # type: ignore[attr-defined]
    handle, got = paused_with_ten_waiting(log, shared, a)
    entered, release = threading.Event(), threading.Event()
    save = store.save

    def slow_save(changes: Any) -> None:
        if dict(changes).get("s") == {STREAM: 11}:  # the position past the purged ones
            entered.set()
            assert release.wait(10)
        save(changes)

    store.save = slow_save
    try:
        # a discard (core's limits) answers before its save, as a purge did until
        # session 12 (a purge now waits for it: test_a_purge_answers_once_...)
        assert handle.discard(10) == 10
        assert entered.wait(5), "the commit pass saving the position past the purge"
        handle.start(got)  # resumed while that save is on its way
    finally:
        release.set()
    log.append(STREAM, b"11")
    assert [m.body for m in got.wait_for_body(b"11", 5)] == [b"0", b"11"]
    wait_until(lambda: shared.get("s") == {STREAM: 12}, 5, what="A saving the position")


def test_a_purge_answers_once_its_position_is_saved(
    engines: tuple[_MemoryLog, _SharedPositions, list[CursorEngine]],
) -> None:
    """A purge answered before the position past what it dropped was saved: a kill -9
    in between (0.2 s, the next commit pass) brought the purged messages back after the
    restart.  The purge now returns once that save landed (the e2e kill:
    tests/e2e/test_kafka_saves.py)."""
    log, shared, (a, _b) = engines
    store = a.backend.position_store()  # type: ignore[attr-defined]
    handle, _ = paused_with_ten_waiting(log, shared, a)
    answered: list[int | None] = []
    at_save: list[list[int | None]] = []  # what the purge had answered when it began
    save = store.save

    def watched_save(changes: Any) -> None:
        if dict(changes).get("s") == {STREAM: 11}:  # the position past the purged ones
            at_save.append(list(answered))
        save(changes)

    store.save = watched_save
    purging = threading.Thread(target=lambda: answered.append(handle.purge()))
    purging.start()
    purging.join(15)
    assert answered == [10]
    # before, the purge returned at once and the save followed at the next commit pass
    assert at_save == [[]], "the purge answered before its position was saved"
    assert shared.get("s") == {STREAM: 11}


def test_a_purge_whose_save_the_fence_refuses_fails_within_its_bound(
    engines: tuple[_MemoryLog, _SharedPositions, list[CursorEngine]],
) -> None:
    """A purge whose position cannot be saved (here core's fence refuses it) fails after
    ``purge_timeout`` (core answers a fault) rather than saying the messages are gone."""
    log, shared, (a, _b) = engines
    a.may_save = lambda name: False
    a.purge_timeout = 0.5
    handle = a.subscription(spec("s", "t"))
    for i in range(3):
        log.append(STREAM, b"%d" % i)
    wait_until(lambda: handle.depth() == 3, 5, what="the head reading the three records")
    with pytest.raises(AdapterError, match=r"not saved within 0\.5 s"):
        handle.purge()
    assert shared.get("s") != {STREAM: 3}


@pytest.mark.parametrize("deliverer", ["maker", "follower"])
def test_a_subscription_made_before_any_stream_existed_gets_the_first_records(
    engines: tuple[_MemoryLog, _SharedPositions, list[CursorEngine]], deliverer: str
) -> None:
    """The maker knew no stream, so it saved no start; the first record was published
    before the other instance followed the subscription.  Before, that instance took the
    subscription for a new one, started it at its own end and saved that: whichever
    instance delivered it then skipped the record (an at-least-once loss)."""
    log, shared, (a, b) = engines
    made = a.subscription(replace(spec("s", "t"), origin="new"))
    assert shared.get("s") is None  # no stream yet: nothing to save
    log.append(STREAM, b"first")
    followed = b.subscription(replace(spec("s", "t"), origin="elsewhere"))
    log.append(STREAM, b"second")  # published once both instances have the cursor
    got = Collector()
    (made if deliverer == "maker" else followed).start(got)
    received = got.wait_for_body(b"second", 5)
    assert [m.body for m in received] == [b"first", b"second"]


def test_a_purge_is_not_undone_by_a_resume_after_the_fence_refused_its_save(
    engines: tuple[_MemoryLog, _SharedPositions, list[CursorEngine]],
) -> None:
    """tests/cluster/test_any_instance.py's peek/purge on Kafka got the ten purged
    messages after the resume again (session 11, load 8-16): core's fence refused the
    deliverer's save of the position past them for a moment (a heartbeat late: the lease's
    local deadline passed before it was renewed), and the resume took the older position
    up from the store.  The deliverer kept its shard, so nobody else wrote a position
    since: its own is the newest, and is kept."""
    log, shared, (a, _b) = engines
    leased = threading.Event()
    leased.set()
    a.may_save = lambda name: leased.is_set()
    handle, got = paused_with_ten_waiting(log, shared, a)
    cursor = a._cursors["s"]
    leased.clear()  # the fence refuses until the late heartbeat renews the lease
    # a discard answers before its save (a purge now waits for it, and fails here:
    # test_a_purge_whose_save_the_fence_refuses_fails_within_its_bound)
    assert handle.discard(10) == 10
    # the commit pass took the position past the purged records (after the skip: not
    # dirty since) and finished: the fence refused it
    wait_until(
        lambda: cursor.positions == {STREAM: 11} and not cursor.dirty and not cursor.saving,
        5,
        what="the commit pass refused the position past the purge",
    )
    assert shared.get("s") == {STREAM: 1}
    leased.set()  # renewed: the same instance delivers it, and resumes it
    handle.start(got)
    log.append(STREAM, b"11")
    assert [m.body for m in got.wait_for_body(b"11", 5)] == [b"0", b"11"]
    wait_until(lambda: shared.get("s") == {STREAM: 12}, 5, what="A saving the position")


def test_a_cursor_started_again_takes_up_the_position_another_instance_saved_since(
    engines: tuple[_MemoryLog, _SharedPositions, list[CursorEngine]],
) -> None:
    # the other side of the rule above: A delivered and saved, then B delivered the
    # subscription and saved past A; A delivers it again from B's position, not its own
    log, shared, (a, b) = engines
    on_a = a.subscription(spec("s", "t"))
    on_b = b.subscription(spec("s", "t"))
    on_a.start(got_a := Collector())
    for i in range(3):
        log.append(STREAM, b"%d" % i)
    got_a.wait_for(3, 5)
    wait_until(lambda: shared.get("s") == {STREAM: 3}, 5, what="A saving the position")
    on_a.stop()  # its shard handed over
    cursor = a._cursors["s"]
    wait_until(lambda: not cursor.dirty and not cursor.saving, 5, what="A's save at the stop")
    on_b.start(got_b := Collector())
    for i in range(3, 6):
        log.append(STREAM, b"%d" % i)
    assert [m.body for m in got_b.wait_for_body(b"5", 5)] == [b"3", b"4", b"5"]
    wait_until(lambda: shared.get("s") == {STREAM: 6}, 5, what="B saving its position")
    on_b.stop()  # handed back
    on_a.start(got_again := Collector())
    log.append(STREAM, b"6")
    assert [m.body for m in got_again.wait_for_body(b"6", 5)] == [b"6"]


def test_a_cursor_made_after_another_instance_deleted_it_leaves_nothing_when_forgotten(
    engines: tuple[_MemoryLog, _SharedPositions, list[CursorEngine]],
) -> None:
    """A follower made a pull point's cursor (``core.follow``: no origin, so where it
    starts is saved when nothing is stored) a moment after a DestroyPullPoint through
    another instance deleted its stored position: its save made the entry again.  It
    then followed the destroy and forgot the cursor; before, it sent no delete (it had
    never delivered it) and the entry stayed for good (on Kafka a consumer group still
    listed long after, session 11)."""
    log, shared, (a, b) = engines
    log.append(STREAM, b"before")
    b.subscription(spec("p", "t"))  # made through B: where it starts is saved
    assert shared.get("p") == {STREAM: 1}
    b.delete_subscription("p")  # destroyed through B
    wait_until(lambda: shared.get("p") is None, 5, what="B's delete")
    a.subscription(spec("p", "t"))  # A follows the creation late
    assert shared.get("p") == {STREAM: 1}  # made again
    a.forget_subscription("p")  # A follows the destroy
    wait_until(lambda: shared.get("p") is None, 5, what="A deleting what it saved")
    assert "p" not in a.names() and "p" not in b.names()
