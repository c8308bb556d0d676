"""Where each message of an MQTT ``publish_many`` goes: messages on internal topics that
never reach the broker (a single instance's pull point inboxes, 3.1.1 dead letters) are
stored in the queues directly, in one transaction; the others are published, retained
(GetCurrentMessage reads them back) except dead letters and, in cluster mode, pull point
inboxes.  In cluster mode a dead letter first waits for its box to be subscribed
(docs/scale-out.md, "Dead-letter boxes").
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Sequence

from wsnmom.core.adapter import (
    AdapterUnavailable,
    OutboundMessage,
    PublishReceipt,
    TopicUnavailable,
    is_internal_namespace,
)
from wsnmom.core.dead_letter_records import box_name
from wsnmom.topic_mapping.errors import NameNotRepresentable

from . import node as nodes
from .cluster_handle import ClusterHandle
from .cluster_node import ClusterNode

__all__ = ["await_boxes", "route_and_publish"]


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


def await_boxes(handles: Iterable[ClusterHandle], boxes: set[str], timeout: float) -> None:
    """Wait until this instance's started dead-letter boxes named in ``boxes`` have a
    connection whose SUBSCRIBE the broker acknowledged, up to ``timeout`` seconds in all;
    AdapterUnavailable when one has none by then (the dead letters then stay with core,
    which publishes them again later).

    Why: Mosquitto 2.0.11 drops a session's shared subscriptions across its restart (it
    keeps the plain ones and the queued messages), and a box reads ``$share/…``: a dead
    letter published after the broker came back and before any box subscribed again is
    queued for nobody.  The publisher may reconnect before the box does; its dead letters
    wait for the box (docs/scale-out.md, "Dead-letter boxes")."""
    deadline = time.monotonic() + timeout
    for handle in [h for h in handles if h.name in boxes]:
        if not handle.await_connection(max(0.0, deadline - time.monotonic())):
            raise AdapterUnavailable(
                f"the dead-letter box {handle.name} has not subscribed again since its "
                "connection was lost: its dead letters wait"
            )
