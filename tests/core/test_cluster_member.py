"""``core.cluster.ClusterMember`` with a coordination whose store stops answering after
the first heartbeat: the member's deadline for delivering its shards falls before their
leases can have expired at the store (the lease began after the heartbeat started), its
delivery is closed, and it starts again when a heartbeat renews them."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import timedelta
from typing import Any

import pytest
from wsnmom.core import follow_thread
from wsnmom.core.cluster import ClusterMember
from wsnmom.core.config import ClusterSettings
from wsnmom.core.coordination import Change, InstanceInfo, Leases

from tests.support.waiting import wait_until

LEASE = 1.0


class FlakyStore:
    """A shared coordination that holds shards 0 and 1 while ``up``."""

    shared = True
    instance_id = "test"

    def __init__(self) -> None:
        self.up = True
        self.renewed: list[float] = []

    def cursor(self) -> int:
        return 0

    def changes(self, cursor: int) -> tuple[int, list[Change]]:
        return cursor, []

    def wait(self, timeout: float) -> None:
        time.sleep(timeout)

    def join(self, address: str, version: str, *, single_instance: bool) -> None:
        return None

    def heartbeat(self, shards: int, lease: float) -> Leases:
        started = time.monotonic()
        if not self.up:
            raise ConnectionError("the store does not answer")
        self.renewed.append(started)
        return Leases({0: 1, 1: 1})

    def release(self, shards: Sequence[int]) -> None:
        return None

    def lead(self) -> bool:
        return self.up

    def instances(self) -> list[InstanceInfo]:
        return []

    def leave(self) -> None:
        return None


def joined_member(
    store: Any,
    *,
    follower: Any = None,
    gained: Callable[[set[int]], None] = lambda shards: None,
    lost: Callable[[set[int]], None] = lambda shards: None,
    poll: float = 0.05,
) -> ClusterMember:
    """A member over ``store`` (the lease :data:`LEASE`, a heartbeat every 0.1 s), joined
    as one of several instances; not started."""
    settings = ClusterSettings(lease=timedelta(seconds=LEASE), heartbeat=0.1, poll=poll)
    member = ClusterMember(
        store,
        settings,
        follower=follower,
        gained=gained,
        lost=lost,
        became_leader=lambda: None,
    )
    member.join("http://x", "1", single_instance=False)
    return member


@contextlib.contextmanager
def started(member: ClusterMember) -> Iterator[ClusterMember]:
    """``member`` started, stopped (its threads joined) on the way out."""
    member.start()
    try:
        yield member
    finally:
        member._stop.set()
        for thread in member._threads:
            thread.join(5)


def test_delivery_stops_before_an_unrenewed_lease_can_expire_and_resumes() -> None:
    store = FlakyStore()
    lost: list[tuple[float, set[int]]] = []
    gained: list[set[int]] = []
    member = joined_member(
        store, gained=gained.append, lost=lambda shards: lost.append((time.monotonic(), shards))
    )
    sub = next(f"s{i}" for i in range(100) if member.shard(f"s{i}") in (0, 1))
    assert member.delivers(sub)
    with started(member):
        wait_until(lambda: len(store.renewed) >= 2, 5, what="a renewal by the thread")
        store.up = False
        _, shards = wait_until(lambda: lost and lost[0], 5, what="delivery stopped")
        assert shards == {0, 1}
        # the store's lease ends no earlier than the last renewal's start + LEASE: this
        # instance's own deadline for delivering (delivers(), checked by every push) is
        # before that
        assert member._valid_until < store.renewed[-1] + LEASE
        assert not member.delivers(sub)
        # nor may it write the subscription's position in the middleware any more (a
        # zombie's write would move the next deliverer's back)
        assert not member.may_save(sub)
        store.up = True
        wait_until(lambda: gained, 5, what="delivery started again after a renewal")
        assert gained[0] == {0, 1} and member.delivers(sub)


class ReleasingStore(FlakyStore):
    """Holds shards 0 and 1, then is told to hand shard 1 back (another instance
    joined)."""

    def __init__(self) -> None:
        super().__init__()
        self.release_one = False

    def heartbeat(self, shards: int, lease: float) -> Leases:
        super().heartbeat(shards, lease)
        if self.release_one:
            return Leases({0: 1}, released=(1,))
        return Leases({0: 1, 1: 1})


def test_the_final_positions_of_a_shard_handed_back_may_be_saved_until_its_lease_ends() -> None:
    store = ReleasingStore()
    member = joined_member(store)
    ids = [f"s{i}" for i in range(200)]
    kept = next(i for i in ids if member.shard(i) == 0)
    handed = next(i for i in ids if member.shard(i) == 1)
    other = next(i for i in ids if member.shard(i) not in (0, 1))
    assert member.may_save(kept) and member.may_save(handed) and not member.may_save(other)
    store.release_one = True
    member._beat(notify=True)
    assert not member.delivers(handed)
    # the delivery closed at the hand-over saves its final position at the adapter's next
    # commit pass: allowed until the lease it had would have ended
    assert member.may_save(handed)
    # with the epoch it held the shard with: the store's fence of that write
    assert member.token(handed) == (1, 1) and member.token(kept) == (0, 1)
    assert member.token(other) is None
    until = member._released_until[1]
    wait_until(lambda: time.monotonic() >= until, LEASE * 2, what="the old lease's end")
    member._beat(notify=True)  # the lease it keeps renewed
    assert not member.may_save(handed) and member.token(handed) is None
    assert member.may_save(kept)


class OneChange(FlakyStore):
    """The change log holds one change, read once."""

    def __init__(self) -> None:
        super().__init__()
        self.read = False

    def changes(self, cursor: int) -> tuple[int, list[Change]]:
        if self.read:
            return cursor, []
        self.read = True
        return cursor + 1, [Change("subscription", "s1")]


class FailingOnce:
    """A follower whose first following of a change fails (the middleware closed the
    connection under its declaration)."""

    def __init__(self) -> None:
        self.seen: list[Change] = []

    def apply(self, changes: Iterable[Change]) -> list[Change]:
        got = list(changes)
        self.seen.extend(got)
        return got if len(self.seen) == len(got) else []


def test_a_change_whose_following_failed_is_followed_again() -> None:
    """Before, it was logged and dropped: the instance did not know a subscription made
    through another one, and when it held its shard nobody delivered it."""
    follower = FailingOnce()
    member = joined_member(OneChange(), follower=follower)
    with started(member):
        wait_until(lambda: len(follower.seen) >= 2, 10, what="the change followed again")
        assert follower.seen == [Change("subscription", "s1")] * 2
        # followed since: not again
        wait_until(lambda: not member._following, 5, what="the change no longer pending")


class FailingFor:
    """A follower whose following of every change fails its first ``times`` tries; it
    notes when each try came."""

    def __init__(self, times: int) -> None:
        self.times = times
        self.tries: list[float] = []

    def apply(self, changes: Iterable[Change]) -> list[Change]:
        got = list(changes)
        self.tries.extend(time.monotonic() for _ in got)
        return got if len(self.tries) <= self.times else []


def test_a_change_failing_past_the_alarm_is_still_followed_with_a_growing_wait(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Until session 15 a change failing for 5 minutes was given up: a subscription made
    through another instance stayed unknown here, and nobody delivered it while this
    instance held its shard.  Now it is followed until it succeeds, the wait doubling up
    to a ceiling, with one ERROR when it has failed for ``FOLLOW_RETRY_ALARM``, and it is
    counted as failing in the status meanwhile."""
    monkeypatch.setattr(follow_thread, "FOLLOW_RETRY_EVERY", 0.05)
    monkeypatch.setattr(follow_thread, "FOLLOW_RETRY_LONGEST", 0.2)
    monkeypatch.setattr(follow_thread, "FOLLOW_RETRY_ALARM", 0.5)
    follower = FailingFor(8)
    member = joined_member(OneChange(), follower=follower, poll=0.02)
    caplog.set_level(logging.ERROR, logger=follow_thread.__name__)
    with started(member):
        wait_until(lambda: len(follower.tries) >= 3, 10, what="a third try")
        assert member.status().counts.follow_failing == 1
        wait_until(lambda: len(follower.tries) >= 9, 20, what="the ninth try, which succeeds")
        wait_until(lambda: not member._following, 5, what="the change no longer pending")
        assert member.status().counts.follow_failing == 0
    assert len(follower.tries) == 9  # followed since: not again
    # each wait at least its schedule: 0.05, 0.1, then 0.2 (the ceiling) from there on
    gaps = [b - a for a, b in zip(follower.tries, follower.tries[1:], strict=False)]
    assert all(gap >= min(0.05 * 2**i, 0.2) - 0.01 for i, gap in enumerate(gaps)), gaps
    # eight failures over 0.05 + 0.1 + 6 * 0.2 s: past the alarm, said once
    alarms = [r for r in caplog.records if "has failed to follow subscription s1" in r.message]
    assert len(alarms) == 1, [r.message for r in caplog.records]
