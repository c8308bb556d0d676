"""What ``core.cluster.ClusterMember`` tells operators: its counts since it started and its
status with every instance on the store (``wsnmom cluster status``, ``/admin``).  Imported
from ``core.cluster`` too."""

from __future__ import annotations

from dataclasses import dataclass, field

from wsnmom.core.coordination import InstanceInfo

__all__ = ["ClusterCounts", "ClusterStatus"]


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
