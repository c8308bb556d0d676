"""This instance as a member of a cluster of gateways on one store (docs/scale-out.md).

:class:`ClusterMember` runs one background thread that, with the store's
:class:`~wsnmom.core.coordination.Coordination`:

* follows what other instances wrote (``core.follow``), woken by the store (LISTEN/NOTIFY)
  and at least every ``cluster.poll`` seconds;
* every ``cluster.heartbeat`` seconds renews its heartbeat and shard leases and takes free
  shards up to its fair share; push subscriptions are delivered only by the instance
  holding their shard (:meth:`ClusterMember.delivers`), so it opens their delivery when it
  gains a shard and closes it when it loses one;
* stops delivering every shard before its leases can have expired when it could not
  renew them (the store does not answer, or the process was stopped), so a shard taken
  over by another instance has one deliverer again once that instance's lease began;
* takes the leadership when it is free: periodic work (expiry, overflow ends, demand
  reconciliation) runs only on the leader (:meth:`ClusterMember.leads`).

On a store only one instance opens (SQLite) there is no thread: the instance leads and
delivers everything.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from wsnmom.core.config import ClusterSettings
from wsnmom.core.coordination import Coordination, InstanceInfo, shard_of
from wsnmom.core.follow import Follower

__all__ = ["ClusterMember"]

log = logging.getLogger(__name__)


def _shards_text(shards: Iterable[int]) -> str:
    return ",".join(str(s) for s in sorted(shards))


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
    ) -> None:
        self.coordination = coordination
        self.shared = coordination.shared
        self._settings = settings
        self._follower = follower
        self._gained = gained
        self._lost = lost
        self._became_leader = became_leader
        self._lease = settings.lease.total_seconds()
        #: stop delivering this long before a lease could expire (a heartbeat's delay)
        self._margin = min(2.0, self._lease / 4)
        self._held: dict[int, int] = {}
        self._valid_until = 0.0
        self._leader = not self.shared
        self._cursor = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

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

    def leads(self) -> bool:
        """Whether this instance runs the cluster's periodic work."""
        return self._leader

    def held(self) -> dict[int, int]:
        """Shards held now, with their epochs."""
        return dict(self._held)

    def instances(self) -> list[InstanceInfo]:
        """The instances on the store (for operators)."""
        return self.coordination.instances()

    # -- life ------------------------------------------------------------------------------
    def join(self, address: str, version: str, *, single_instance: bool) -> None:
        """Before the restore: record this instance, take its first leases (so the restore
        opens delivery only for its shards) and note the change log's position (so no
        change made during the restore is missed)."""
        self.coordination.join(address, version, single_instance=single_instance)
        if not self.shared:
            return
        self._cursor = self.coordination.cursor()
        self._beat(notify=False)
        self._leader = self.coordination.lead()
        if self._leader:
            log.info("instance %s leads the cluster's periodic work", self._instance)

    @property
    def _instance(self) -> str:
        return str(getattr(self.coordination, "instance_id", ""))

    def start(self) -> None:
        """Start following, heartbeats and leadership (a no-op for a single instance)."""
        if not self.shared or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="wsnmom-cluster", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread; hand the leases and the leadership back (a clean stop)."""
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(10)
        if self.shared:
            held = set(self._held)
            self._held = {}
            self._valid_until = 0.0
            if held:
                log.info("instance %s hands back shards %s", self._instance, _shards_text(held))
            self.coordination.leave()

    # -- the thread ------------------------------------------------------------------------
    def _run(self) -> None:
        s = self._settings
        next_beat = time.monotonic() + s.heartbeat
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_beat:
                next_beat = now + s.heartbeat
                self._beat(notify=True)
                self._take_lead()
            self._watchdog()
            self._follow()
            try:
                self.coordination.wait(max(0.01, min(s.poll, next_beat - time.monotonic())))
            except Exception:
                log.debug("waiting for store changes failed", exc_info=True)
                self._stop.wait(s.poll)

    def _follow(self) -> None:
        try:
            self._cursor, changes = self.coordination.changes(self._cursor)
        except Exception:
            log.debug("reading the change log failed", exc_info=True)
            return
        if changes:
            self._follower.apply(changes)

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
            log.warning("instance %s: heartbeat failed: %s", self._instance, exc)
            return
        now_held = dict(leases.held)
        lost = set(self._held) - set(now_held)
        gained = set(now_held) - set(self._held)
        # the lease began at the store after ``started``: it ends after started + lease
        self._valid_until = started + self._lease - self._margin
        if lost:
            self._held = {s: e for s, e in self._held.items() if s in now_held}
            log.info("instance %s stops delivering shards %s", self._instance, _shards_text(lost))
            if notify:
                self._lost(lost)
        if leases.released:
            try:
                self.coordination.release(leases.released)
            except Exception:
                log.debug("releasing shards failed (their leases expire)", exc_info=True)
        self._held = now_held
        if gained:
            log.info(
                "instance %s took shards %s (epochs %s)",
                self._instance,
                _shards_text(gained),
                ",".join(str(now_held[s]) for s in sorted(gained)),
            )
            if notify:
                self._gained(gained)

    def _watchdog(self) -> None:
        """Stop delivering before leases not renewed in time can expire."""
        if self._held and time.monotonic() >= self._valid_until:
            lost = set(self._held)
            self._held = {}
            log.warning(
                "instance %s could not renew its leases in time: stops delivering shards %s",
                self._instance,
                _shards_text(lost),
            )
            self._lost(lost)
