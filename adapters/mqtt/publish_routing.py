"""Where each message of an MQTT ``publish_many`` goes: messages on internal topics that
never reach the broker (a single instance's pull point inboxes, 3.1.1 dead letters) are
stored in the queues directly, in one transaction; the others are published, retained
(GetCurrentMessage reads them back) except dead letters and, in cluster mode, pull point
inboxes.  In cluster mode a dead letter first waits for its box to be subscribed
(docs/scale-out.md, "Dead-letter boxes").
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence

from wsnmom.core.adapter import (
    OutboundMessage,
    PublishReceipt,
    TopicUnavailable,
    is_internal_namespace,
)
from wsnmom.core.dead_letter_records import box_name
from wsnmom.topic_mapping.errors import NameNotRepresentable

from . import node as nodes
from .cluster_handle import ClusterHandle, await_boxes
from .cluster_node import ClusterNode

__all__ = ["route_and_publish"]


def route_and_publish(
    node: nodes.Node | ClusterNode,
    messages: Sequence[OutboundMessage],
    timeout: float,
    boxes: Collection[ClusterHandle] | None,
) -> list[PublishReceipt]:
    """Publish ``messages`` through ``node`` (see the module docstring), every PUBACK
    awaited; receipts in order.  ``boxes``: in cluster mode, the adapter's live set of the
    handles of its subscription sessions (its dead-letter boxes among them, read when the
    dead letters go out); None otherwise."""
    receipts: list[PublishReceipt | None] = [None] * len(messages)
    mapping = node.mapping
    internal = [i for i, m in enumerate(messages) if not mapping.on_broker(m.topic.namespace)]
    if internal:
        assert isinstance(node, nodes.Node)
        fanouts = node.engine.publish_many([messages[i] for i in internal])
        for i, fanout in zip(internal, fanouts, strict=True):
            receipts[i] = PublishReceipt(routed=fanout > 0)
    if len(internal) < len(messages):
        external: list[tuple[int, tuple[str, OutboundMessage]]] = []
        letters: list[tuple[int, tuple[str, OutboundMessage]]] = []
        for i, m in enumerate(messages):
            if receipts[i] is None:
                try:
                    item = (i, (mapping.name(m.topic), m))
                except NameNotRepresentable as exc:
                    raise TopicUnavailable(f"the topic has no MQTT name: {exc}") from exc
                # dead letters and (cluster mode) pull point inboxes: never retained
                unretained = mapping.is_dead_letter(m.topic) or is_internal_namespace(
                    m.topic.namespace
                )
                (letters if unretained else external).append(item)
        for batch, retain in ((external, None), (letters, False)):
            if not batch:
                continue
            if retain is False and boxes is not None:
                # a box whose $share filter the broker dropped (a restart) first
                # subscribes again: docs/scale-out.md, "Dead-letter boxes"
                started = time.monotonic()
                wanted = {
                    box_name("/".join(m.topic.path))
                    for _, (_, m) in batch
                    if mapping.is_dead_letter(m.topic)
                }
                await_boxes(list(boxes), wanted, timeout)
                timeout = max(0.1, timeout - (time.monotonic() - started))
            done = node.publisher.publish_many([item for _, item in batch], timeout, retain=retain)
            for (i, _), receipt in zip(batch, done, strict=True):
                receipts[i] = receipt
    return [r for r in receipts if r is not None]
