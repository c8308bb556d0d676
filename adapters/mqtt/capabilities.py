"""What the MQTT adapter can do (``Capabilities``): the class's answer, and an instance's by
its settings (protocol, ``retain``, the largest body) and mode (single instance, or cluster
mode, where the broker's sessions are the queues and nothing lies on this disk).
"""

from __future__ import annotations

import dataclasses

from wsnmom.core.adapter import Capabilities
from wsnmom.topic_mapping.syntax import MQTT

from .config import MqttSettings

__all__ = ["CAPABILITIES", "capabilities_of"]

#: what the adapter class can do (``wsnmom adapters`` lists it): a single instance on MQTT 5
CAPABILITIES = Capabilities(
    syntax=MQTT,
    ack_mode="per_message",
    durable_subscriptions=True,
    native_pull=True,
    retained_current_message=True,
    native_headers=True,
    native_queue_limits=True,
    ordering="subscription",
    competing_consumers=False,
    max_message_bytes=None,
    sole_publisher=False,
    # each subscription's queue is an embedded store in this instance's data directory
    local_queues=True,
    # the queues in this instance's data directory; in cluster mode the sessions
    # whose records lie under this cluster's topic prefix (core's orphan sweep)
    own_names=True,
    per_message_nack=True,
    ordered_acks=False,
    shape="session",
    # the queues are the gateway's own (embedded store): peek reads them in SQLite
    peek=True,
    # and what their limits drop goes to SubscriptionSpec.dead_letters in the same
    # transaction (MQTT 5: to the outbox that publishes it to the broker; 3.1.1: into
    # the box's queue)
    native_dead_letters=True,
)


def capabilities_of(
    s: MqttSettings, *, cluster: bool, max_bytes: int | None = None
) -> Capabilities:
    """What an adapter with settings ``s`` can do, in cluster mode or not; ``max_bytes``:
    the largest body the broker takes, when it said (its Maximum Packet Size)."""
    caps = dataclasses.replace(
        CAPABILITIES,
        native_headers=s.v5,
        retained_current_message=s.retain,
        max_message_bytes=s.max_message_bytes or max_bytes,
    )
    if not cluster:
        return caps
    # cluster mode: the broker's sessions are the queues; nothing on this disk
    return dataclasses.replace(
        caps,
        local_queues=False,
        # a session hands messages out only to a connection: pull points are read
        # by the instance holding their shard (core buffers them)
        native_pull=False,
        # the broker's own per-session limits bound them, not QueueLimits
        native_queue_limits=False,
        peek=False,
        native_dead_letters=False,
        # PUBACKs in arrival order
        ordered_acks=True,
        # a requeue drops the connection: every unacknowledged message comes again
        per_message_nack=False,
    )
