"""This instance as a member of a cluster of gateways on one store (docs/scale-out.md).

:class:`ClusterMember` runs two background threads with the store's
:class:`~wsnmom.core.coordination.Coordination`.  The **heartbeat** thread:

* every ``cluster.heartbeat`` seconds renews its heartbeat and shard leases and takes free
  shards up to its fair share; push subscriptions are delivered only by the instance
  holding their shard (:meth:`ClusterMember.delivers`), so it opens their delivery when it
  gains a shard and closes it when it loses one;
* stops delivering every shard before its leases can have expired when it could not
  renew them (the store does not answer, or the process was stopped), so a shard taken
  over by another instance has one deliverer again once that instance's lease began;
* takes the leadership when it is free: periodic work (expiry, overflow ends, demand
  reconciliation) runs only on the leader (:meth:`ClusterMember.leads`).

The **follow** thread (``core.follow_thread``) follows what other instances wrote
(``core.follow``), woken by the store (LISTEN/NOTIFY) and at least every ``cluster.poll``
seconds.  Following a subscription made through another instance declares it in the
middleware (round trips): a burst of Subscribes keeps this thread busy for as long as it
lasts, which on the heartbeat's thread outlasted the lease (every shard then moved to
another instance and back, docs/scale-out.md).  A change whose following failed is
followed again until it succeeds, and ``wsnmom_cluster_follow_failing`` counts those
pending.  Only the heartbeat thread writes the leases' state (``_held``, ``_valid_until``,
``_released_until``; ``stop`` once the threads ended); other threads read it
(:meth:`ClusterMember.delivers`, :meth:`ClusterMember.may_save`).

On a store only one instance opens (SQLite) there is no thread: the instance leads and
delivers everything.

:meth:`ClusterMember.status` is what operators see (``wsnmom cluster status``, ``/admin``);
the heartbeat counts renewals, failures, shards taken and lost, and the store's round
trip in ``/metrics`` (``wsnmom_cluster_*``, ``wsnmom_store_round_trip_seconds``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from wsnmom.core import metrics
from wsnmom.core.config import ClusterSettings
from wsnmom.core.coordination import Coordination, InstanceInfo, shard_of
from wsnmom.core.follow import Follower
from wsnmom.core.follow_thread import FollowThread

__all__ = ["ClusterCounts", "ClusterMember", "ClusterStatus"]

log = logging.getLogger(__name__)

#: seconds ``ClusterMember.stop`` waits for its threads before handing back
STOP_WAIT = 1.0


def _shards_text(shards: Iterable[int]) -> str:
    return ",".join(str(s) for s in sorted(shards))


@dataclass(slots=True)
class ClusterCounts:
    """What this instance's heartbeats did since it started."""

    renewals: int = 0
    heartbeat_failures: int = 0
    #: shards taken when free or handed over
    taken: int = 0
    #: shards taken from an instance whose lease had expired
    failovers: int = 0
    #: shards handed back above the fair share
    released: int = 0
    #: shards given up because their leases could not be renewed in time
    expired: int = 0
    #: seconds the last heartbeat's transaction took (None: none yet)
    store_seconds: float | None = None
    #: seconds the longest round of following the change log took (None: none yet)
    follow_longest: float | None = None
    #: changes whose following failed and is tried again (now)
    follow_failing: int = 0


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    """This instance and the cluster, for operators (``wsnmom cluster status``)."""

    instance: str
    #: whether other instances may share the store (PostgreSQL)
    shared: bool
    leader: bool
    #: shards the push subscriptions are hashed into
    shards: int
    lease: float
    #: shards this instance delivers, with their epochs
    held: dict[int, int]
    #: seconds until this instance stops delivering unless a heartbeat renews its leases
    lease_left: float | None
    counts: ClusterCounts
    #: every instance on the store, newest heartbeat first
    instances: list[InstanceInfo] = field(default_factory=list)
    #: why ``instances`` is empty ("" when the store answered)
    error: str = ""


class ClusterMember:
    """See the module docstring."""

    def __init__(
        self,
        coordination: Coordination,
        settings: ClusterSettings,
        follower: Follower,
        *,
        gained: Callable[[set[int]], None],
        lost: Callable[[set[int]], None],
        became_leader: Callable[[], None],
        held: Callable[[set[int]], None] | None = None,
    ) -> None:
        self.coordination = coordination
        self.shared = coordination.shared
        self._settings = settings
        self._gained = gained
        self._lost = lost
        self._became_leader = became_leader
        #: told the shards held after every heartbeat (``Ownership.reconcile``)
        self._reconcile = held
        self._lease = settings.lease.total_seconds()
        #: stop delivering this long before a lease could expire (a heartbeat's delay)
        self._margin = min(2.0, self._lease / 4)
        self._held: dict[int, int] = {}
        self._valid_until = 0.0
        #: shards handed back cleanly: until when their last lease was valid (the final
        #: positions of their deliveries may still be saved until then, ``may_save``)
        self._released_until: dict[int, float] = {}
        #: the epochs those shards were held with (their positions' fencing token,
        #: ``token``): written before ``_released_until``, kept as long as it
        self._released_epochs: dict[int, int] = {}
        self._leader = not self.shared
        self._stop = threading.Event()
        self._following = FollowThread(
            coordination, follower, settings.poll, self._stop, lambda: self._instance
        )
        self._threads: list[threading.Thread] = []
        self._counts = ClusterCounts()
        metrics.set_cluster_sources(
            lambda: len(self._held) if self.shared else settings.shards,
            lambda: float(self._leader),
            lambda: len(self._following),
        )

    # -- what the broker asks --------------------------------------------------------------
    def shard(self, subscription_id: str) -> int:
        """The shard of a subscription."""
        return shard_of(subscription_id, self._settings.shards)

    def delivers(self, subscription_id: str) -> bool:
        """Whether this instance delivers the subscription now: it holds the lease of its
        shard, and the lease cannot have expired."""
        if not self.shared:
            return True
        return self.shard(subscription_id) in self._held and time.monotonic() < self._valid_until

    def may_save(self, subscription_id: str) -> bool:
        """Whether this instance may still write the subscription's delivery position in
        the middleware (the fence of ``Adapter.shared_by_instances``): while it delivers
        it, and for a shard it handed back cleanly until that lease would have ended (the
        final position of a delivery closed at the hand-over).  Never after its lease
        could have expired unrenewed (a zombie): another instance may deliver the
        subscription by then, and an older position written now would move its saved
        position back."""
        if not self.shared:
            return True
        if self.delivers(subscription_id):
            return True
        until = self._released_until.get(self.shard(subscription_id))
        return until is not None and time.monotonic() < until

    def token(self, subscription_id: str) -> tuple[int, int] | None:
        """The fencing token of the subscription's position writes: (its shard, the
        epoch this instance holds it with) whenever ``may_save`` says yes (a clean
        hand-back's epoch during its grace), else None.  The store writes a position only
        while the shard's epoch is still that one (``core.position_fence``): a takeover
        bumps it, so a write that passed ``may_save`` before the process was stopped is
        refused once another instance took the shard."""
        if not self.shared:
            return None
        shard = self.shard(subscription_id)
        epoch = self._held.get(shard)
        if epoch is not None and time.monotonic() < self._valid_until:
            return shard, epoch
        until = self._released_until.get(shard)
        epoch = self._released_epochs.get(shard)
        if until is None or epoch is None or time.monotonic() >= until:
            return None
        return shard, epoch

    def leads(self) -> bool:
        """Whether this instance runs the cluster's periodic work."""
        return self._leader

    def leader_epoch(self) -> int | None:
        """The epoch of the leadership this instance holds (the fencing token of its
        writes as the leader), None when it does not lead."""
        return self.coordination.epoch() if self._leader else None

    def held(self) -> dict[int, int]:
        """Shards held now, with their epochs."""
        return dict(self._held)

    def instances(self) -> list[InstanceInfo]:
        """The instances on the store (for operators)."""
        return self.coordination.instances()

    def status(self) -> ClusterStatus:
        """This instance and every instance on the store (one store query)."""
        error = ""
        try:
            instances = self.coordination.instances()
        except Exception as exc:
            instances = []
            error = f"the store does not answer: {exc}"
        held = dict(self._held)
        lease_left: float | None = None
        if self.shared and held:
            lease_left = max(0.0, self._valid_until + self._margin - time.monotonic())
        c = self._counts
        return ClusterStatus(
            instance=self._instance,
            shared=self.shared,
            leader=self._leader,
            shards=self._settings.shards,
            lease=self._lease,
            held=held,
            lease_left=lease_left,
            counts=ClusterCounts(
                c.renewals,
                c.heartbeat_failures,
                c.taken,
                c.failovers,
                c.released,
                c.expired,
                c.store_seconds,
                self._following.longest,
                len(self._following),
            ),
            instances=instances,
            error=error,
        )

    # -- life ------------------------------------------------------------------------------
    def join(self, address: str, version: str, *, single_instance: bool) -> None:
        """Before the restore: record this instance, take its first leases (so the restore
        opens delivery only for its shards) and note the change log's position (so no
        change made during the restore is missed)."""
        self.coordination.join(address, version, single_instance=single_instance)
        if not self.shared:
            return
        self._following.cursor = self.coordination.cursor()
        self._beat(notify=False)
        self._leader = self.coordination.lead()
        if self._leader:
            log.info("instance %s leads the cluster's periodic work", self._instance)

    @property
    def _instance(self) -> str:
        return str(getattr(self.coordination, "instance_id", ""))

    def start(self) -> None:
        """Start the heartbeat and follow threads (a no-op for a single instance)."""
        if not self.shared or self._threads:
            return
        self._threads = [
            threading.Thread(target=self._run_heartbeat, name="wsnmom-heartbeat", daemon=True),
            threading.Thread(target=self._following.run, name="wsnmom-follow", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """Stop the threads; hand the leases and the leadership back (a clean stop).

        The threads are waited for briefly (:data:`STOP_WAIT` in all): the follow thread
        may be declaring a subscription another instance made, a middleware round trip
        that waits for a connection being restored (a SIGTERM right after a rejoin); the
        heartbeat thread only queues the openings and closings of the shards it gains and
        loses (``core.ownership``).  The caller closed the
        deliveries first and stopped ``gained`` (``core.ownership``), so what opens
        meanwhile never consumes, and the shards are handed back at once; a thread still
        busy ends after its round without touching the leases again."""
        self._stop.set()
        deadline = time.monotonic() + STOP_WAIT
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                log.warning(
                    "instance %s: the thread %s is still busy; handing back anyway",
                    self._instance,
                    thread.name,
                )
        if self.shared:
            held = set(self._held)
            # recorded before they are forgotten: ``may_save``, asked meanwhile from
            # delivery threads, says yes for them throughout (``token``: with their epochs)
            self._released_epochs = {**self._released_epochs, **self._held}
            self._released_until.update(dict.fromkeys(held, self._valid_until))
            self._held = {}
            self._valid_until = 0.0
            if held:
                log.info("instance %s hands back shards %s", self._instance, _shards_text(held))
            self.coordination.leave()

    # -- the threads -----------------------------------------------------------------------
    def _run_heartbeat(self) -> None:
        """Beat every ``cluster.heartbeat`` seconds; between beats, wake when the leases'
        local deadline passes (the watchdog)."""
        s = self._settings
        next_beat = time.monotonic() + s.heartbeat
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_beat:
                next_beat = now + s.heartbeat
                self._beat(notify=True)
                if self._stop.is_set():
                    break  # stopped during the beat: ``stop`` may have handed back
                self._take_lead()
            self._watchdog()
            wake = next_beat
            if self._held:
                wake = min(wake, self._valid_until)
            self._stop.wait(max(0.01, wake - time.monotonic()))

    def _take_lead(self) -> None:
        if self._leader:
            self._leader = self.coordination.lead()
            return
        try:
            self._leader = self.coordination.lead()
        except Exception:
            log.debug("taking the leadership failed", exc_info=True)
            return
        if self._leader:
            self._became_leader()

    def _beat(self, *, notify: bool) -> None:
        started = time.monotonic()
        try:
            leases = self.coordination.heartbeat(self._settings.shards, self._lease)
        except Exception as exc:
            self._counts.heartbeat_failures += 1
            metrics.CLUSTER_HEARTBEAT_FAILURES.inc()
            log.warning("instance %s: heartbeat failed: %s", self._instance, exc)
            return
        if self._stop.is_set():
            return  # ``stop`` hands back (or did, when this beat outlasted its wait)
        took = time.monotonic() - started
        self._counts.store_seconds = took
        metrics.STORE_ROUND_TRIP_SECONDS.observe(took)
        self._counts.renewals += 1
        metrics.CLUSTER_LEASE_RENEWALS.inc()
        now_held = dict(leases.held)
        lost = set(self._held) - set(now_held)
        gained = set(now_held) - set(self._held)
        # ``delivers`` and ``may_save`` are asked meanwhile from other threads: the shards
        # handed back are recorded before they are forgotten, and those lost are
        # forgotten before the lease is renewed (a zombie's, long expired, would otherwise
        # cover for a moment the shards another instance took over)
        now = time.monotonic()
        released_until = {s: t for s, t in self._released_until.items() if t > now}
        released_epochs = {s: e for s, e in self._released_epochs.items() if s in released_until}
        for shard in lost & set(leases.released):
            released_until[shard] = self._valid_until
            released_epochs[shard] = self._held[shard]
        self._released_epochs = released_epochs
        self._released_until = released_until
        if lost:
            self._held = {s: e for s, e in self._held.items() if s in now_held}
        # the lease began at the store after ``started``: it ends after started + lease
        self._valid_until = started + self._lease - self._margin
        if lost:
            released = len(lost & set(leases.released))
            self._count_lost(released=released, expired=len(lost) - released)
            log.info("instance %s stops delivering shards %s", self._instance, _shards_text(lost))
            if notify:
                self._lost(lost)
        if leases.released:
            try:
                self.coordination.release(leases.released)
            except Exception:
                log.debug("releasing shards failed (their leases expire)", exc_info=True)
        if self._stop.is_set():
            return  # stopped during this beat: ``stop`` hands back
        self._held = now_held
        if gained:
            failovers = len(gained & set(leases.taken_over))
            self._counts.taken += len(gained) - failovers
            self._counts.failovers += failovers
            metrics.CLUSTER_SHARDS_TAKEN.labels(how="free").inc(len(gained) - failovers)
            metrics.CLUSTER_SHARDS_TAKEN.labels(how="failover").inc(failovers)
            log.info(
                "instance %s took shards %s (epochs %s)",
                self._instance,
                _shards_text(gained),
                ",".join(str(now_held[s]) for s in sorted(gained)),
            )
            if notify:
                self._gained(gained)
        if notify and self._reconcile is not None and now_held:
            self._reconcile(set(now_held))

    def _watchdog(self) -> None:
        """Stop delivering before leases not renewed in time can expire."""
        if self._held and time.monotonic() >= self._valid_until:
            lost = set(self._held)
            self._held = {}
            self._count_lost(released=0, expired=len(lost))
            log.warning(
                "instance %s could not renew its leases in time: stops delivering shards %s",
                self._instance,
                _shards_text(lost),
            )
            self._lost(lost)

    def _count_lost(self, *, released: int, expired: int) -> None:
        self._counts.released += released
        self._counts.expired += expired
        metrics.CLUSTER_SHARDS_LOST.labels(why="released").inc(released)
        metrics.CLUSTER_SHARDS_LOST.labels(why="expired").inc(expired)
