"""``ClusterMember.may_save`` (the fence of Kafka position writes, asked from delivery
threads while the member's thread changes what it holds) answers right at every step of
a heartbeat and of a clean stop, not only once they are over (issue 23, review of the
fence): a zombie whose lease ran out never may save a shard's positions another instance
took over, not even while the heartbeat that tells it so is being applied; a shard handed
back cleanly may have its final positions saved at every moment of the hand-back.

The member's steps are observed where it reads the clock (a clock of the test) and where
it records the shards handed back: no threads, no timing.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from wsnmom.core import cluster as cluster_module
from wsnmom.core.cluster import ClusterMember
from wsnmom.core.config import ClusterSettings
from wsnmom.core.coordination import Leases

from .test_cluster_member import FlakyStore

LEASE = 1.0


class Clock:
    """The member's clock: ``probe`` runs at every read (not within itself)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.probe: Callable[[], None] | None = None
        self._probing = False

    def monotonic(self) -> float:
        if self.probe is not None and not self._probing:
            self._probing = True
            try:
                self.probe()
            finally:
                self._probing = False
        return self.now


class TakenOver(FlakyStore):
    """Holds shards 0 and 1; then (``taken``) only 0: another instance took 1 over."""

    def __init__(self) -> None:
        super().__init__()
        self.taken = False

    def heartbeat(self, shards: int, lease: float) -> Leases:
        return Leases({0: 1}) if self.taken else Leases({0: 1, 1: 1})


def _member(store: FlakyStore, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> ClusterMember:
    monkeypatch.setattr(cluster_module, "time", SimpleNamespace(monotonic=clock.monotonic))
    settings = ClusterSettings(lease=timedelta(seconds=LEASE), heartbeat=0.1, poll=0.05)
    member = ClusterMember(
        store,
        settings,
        follower=None,  # type: ignore[arg-type]
        gained=lambda shards: None,
        lost=lambda shards: None,
        became_leader=lambda: None,
    )
    member.join("http://x", "1", single_instance=False)
    return member


def _in_shard(member: ClusterMember, shard: int) -> str:
    return next(f"s{i}" for i in range(1000) if member.shard(f"s{i}") == shard)


def test_a_zombie_never_may_save_a_shard_taken_over_while_its_heartbeat_applies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = TakenOver()
    clock = Clock()
    member = _member(store, clock, monkeypatch)
    member._beat(notify=True)
    taken = _in_shard(member, 1)
    assert member.may_save(taken)
    clock.now += 60  # stopped far past its lease (a zombie): shard 1 went to another
    assert not member.may_save(taken)
    store.taken = True
    answers: list[bool] = []
    clock.probe = lambda: answers.append(member.may_save(taken))
    member._beat(notify=True)
    assert answers and not any(answers), answers  # before: True once the lease renewed
    assert not member.may_save(taken)
    assert member.may_save(_in_shard(member, 0))


class Recording(dict[int, float]):
    """The member's shards handed back: ``probe`` runs before each is recorded."""

    probe: Callable[[], None] | None = None

    def update(self, *args: Any, **kwargs: Any) -> None:
        if self.probe is not None:
            self.probe()
        super().update(*args, **kwargs)


def test_a_shard_handed_back_at_a_clean_stop_may_be_saved_throughout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()
    member = _member(FlakyStore(), clock, monkeypatch)
    member._beat(notify=True)
    handed = _in_shard(member, 1)
    answers: list[bool] = []
    recording = Recording()
    recording.probe = lambda: answers.append(member.may_save(handed))
    member._released_until = recording
    member.stop()
    assert answers == [True]  # before: False between forgetting the shard and recording it
    assert member.may_save(handed)  # its final positions, until the lease would end
    clock.now += 60
    assert not member.may_save(handed)
