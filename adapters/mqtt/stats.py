"""The MQTT adapter's counts for tests and metrics (``MqttAdapter.stats``): on a single
instance, its session's filters and arrivals, its queues, the messages handed to taps,
its publisher and its dead-letter outbox; in cluster mode, the subscription sessions'
handles (connected, fenced, lost, made again) and the publisher.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import node as nodes
from .cluster_handle import ClusterHandle
from .cluster_node import ClusterNode

__all__ = ["cluster_stats", "describe", "node_stats"]


def describe(handles: Sequence[Any]) -> dict[str, int]:
    """Counts over cluster handles (the adapter's ``stats``)."""
    live = [h for h in handles if isinstance(h, ClusterHandle)]
    return {
        "subscription_sessions": len(live),
        "connected_sessions": sum(1 for h in live if h.connected),
        "fenced_reconnects": sum(h.fenced for h in live),
        "sessions_lost": sum(h.sessions_lost for h in live),
        "sessions_remade": sum(h.remade for h in live),
    }


def cluster_stats(cnode: ClusterNode, handles: Sequence[Any]) -> dict[str, Any]:
    """Cluster mode's counts: the handles of the subscription sessions (``describe``) and
    the publisher's window and the most messages it had unacknowledged at once."""
    return {
        "client_id": cnode.client_id,
        "cluster": True,
        **describe(handles),
        "publish_window": cnode.publisher.window,
        "publish_peak_inflight": cnode.publisher.peak_inflight,
    }


def node_stats(node: nodes.Node) -> dict[str, Any]:
    """A single instance's counts: filters, subscriptions, arrivals, messages handed to
    taps (``spark_logs``), the publisher's window and the most messages it had
    unacknowledged at once, and the dead-letter outbox's (:meth:`.Outbox.stats`)."""
    s = node.session.stats
    return {
        "client_id": node.client_id,
        "filters": len(node.session.filters),
        "subscriptions": len(node.engine.subs),
        "received": s.received,
        "committed": s.committed,
        "dropped_retained": s.dropped_retained,
        "dropped_twins": s.dropped_twins,
        "dropped_qos0": s.dropped_qos0,
        "tapped": node.session.taps.delivered,
        "tap_failures": node.session.taps.failures,
        "backlog": node.session.backlog(),
        "publish_window": node.publisher.window,
        "publish_peak_inflight": node.publisher.peak_inflight,
        **node.outbox.stats(),
    }
