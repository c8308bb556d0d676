"""The cluster as the admin API shows it (``GET /wsn/admin/api/cluster`` and the
overview's ``cluster``): this instance's shards, leadership, lease and heartbeat counts,
and every instance on the store with the shards it holds (docs/scale-out.md)."""

from __future__ import annotations

from typing import Any

from wsnmom.core.cluster import ClusterStatus
from wsnmom.core.coordination import InstanceInfo

__all__ = ["cluster_json"]


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _instance_json(info: InstanceInfo, me: str) -> dict[str, Any]:
    return {
        "id": info.id,
        "address": info.address,
        "version": info.version,
        "this": info.id == me,
        "heartbeat_age": _seconds(info.heartbeat_age),
        "shards": [shard for shard, _ in info.shards],
        "epochs": {str(shard): epoch for shard, epoch in info.shards},
        "lease_left": _seconds(info.lease_left),
    }


def cluster_json(status: ClusterStatus) -> dict[str, Any]:
    """See the module docstring."""
    c = status.counts
    return {
        "instance": status.instance,
        "shared": status.shared,
        "leader": status.leader,
        "shards": status.shards,
        "lease": status.lease,
        "held": sorted(status.held) if status.shared else list(range(status.shards)),
        "lease_left": _seconds(status.lease_left),
        "counts": {
            "renewals": c.renewals,
            "heartbeat_failures": c.heartbeat_failures,
            "taken": c.taken,
            "failovers": c.failovers,
            "released": c.released,
            "expired": c.expired,
            "store_seconds": _seconds(c.store_seconds),
            "follow_longest": _seconds(c.follow_longest),
            "follow_failing": c.follow_failing,
        },
        "instances": [_instance_json(i, status.instance) for i in status.instances],
        "error": status.error,
    }
