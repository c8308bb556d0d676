"""Retiring the dead-letter boxes of departed gateway instances (MQTT cluster mode;
docs/scale-out.md, "Dead-letter boxes").

Every instance reads dead letters through box sessions of its own, all in one
``$share/<dead_letter_share>/…`` group, and Mosquitto hands a shared subscription's
messages round robin to every session of the group, connected or not
(eclipse-mosquitto/mosquitto#1747): the box of an instance gone for good would go on
taking its share into a session nobody reads.  Each box's record names the instance that
reads it (``#owner=``, :mod:`.cluster_sessions`); the instance that runs periodic work
gives the adapter the ids of the live instances (``Adapter.retire_departed``), and each
box whose owner is not among them is retired by :func:`retire_box`:

1. connect with the box's client id (clean start false: the queued letters come; a
   zombie still connected with it is cut off), subscribe a sentinel topic of its own and
   unsubscribe the box's ``$share`` filters: from the UNSUBACK on the group hands the box
   nothing more;
2. publish the sentinel: Mosquitto sends a session's messages in the order it queued
   them, so every letter queued for the box comes before it;
3. publish each letter again through the group (a live box takes it; the caller makes
   sure one of its own is subscribed) and acknowledge it only once the broker confirmed
   the publish;
4. at the sentinel, end the session (DISCONNECT with session expiry 0) and clear its
   record.

A zombie that comes back afterwards finds its box session gone and makes it again, with
its record (``ClusterHandle._open_box``).  One that comes back during the retirement cuts
the retiring connection off: the retirement stops there (the record stays, the zombie's
connection subscribes the filters again), and the letters of the batch being published
again that were not acknowledged yet come to the zombie as well: that batch (at most
:data:`RETIRE_WINDOW` letters) is the duplicate bound.  The retirement checks for the
cut-off after each batch and, once the sentinel came, makes one round trip (it
unsubscribes the sentinel: the broker answers only while this connection holds the
session) before it ends the session; a cut-off in the instant between that answer and
the DISCONNECT leaves the zombie holding its session with
its record cleared (it is not retired again until its instance opens the box again, at
its next start, and writes the record).
"""

from __future__ import annotations

import logging
import queue
import time
import uuid
from collections.abc import Callable, Collection

from wsnmom.core.adapter import (
    HEADER_MESSAGE_ID,
    INTERNAL_NAMESPACE_PREFIX,
    AdapterUnavailable,
    OutboundMessage,
    Received,
)
from wsnmom.topic_mapping.model import Topic

from .cluster_handle import ClusterHandle
from .cluster_node import ClusterNode
from .cluster_sessions import CLIENT_ID_HEAD, Record, SubscriptionSessions
from .publish_routing import route_and_publish
from .record_scan import retained_under
from .sub_session import SessionConnection

__all__ = ["RETIRE_WINDOW", "Republish", "departed_boxes", "retire_box", "retire_departed"]

log = logging.getLogger("wsnmom.adapters.mqtt")

#: the Receive Maximum of a retiring connection: letters published again per batch
RETIRE_WINDOW = 64
#: the internal namespace of the sentinels (``<prefix>/wsnmom/internal/retire/<id>``)
SENTINEL_NAMESPACE = INTERNAL_NAMESPACE_PREFIX + "retire"

#: publishes dead letters again and returns once the broker confirmed every one
Republish = Callable[[list[OutboundMessage]], None]


def retire_departed(
    cnode: ClusterNode,
    boxes: Collection[ClusterHandle],
    live: Callable[[], Collection[str]],
    timeout: float,
) -> list[str]:
    """``Adapter.retire_departed``: retire the boxes of the instances not in ``live()``.
    ``boxes``: this instance's subscription sessions; a departed box is retired only
    while this instance's own box of its destination is connected (the group then has a
    live member for the letters published again); otherwise it waits for a later call.
    Returns the client ids of the box sessions retired."""
    retired: list[str] = []
    for client_id, record in departed_boxes(cnode.sessions, live, timeout):
        if not any(h.name == record.name and h.connected for h in list(boxes)):
            log.info(
                "MQTT: the dead-letter box %s of departed instance %s waits: this instance "
                "reads no box of %s now",
                client_id,
                record.owner,
                record.name,
            )
            continue

        def republish(letters: list[OutboundMessage]) -> None:
            route_and_publish(cnode, letters, timeout, boxes)

        try:
            moved = retire_box(cnode.sessions, client_id, record, republish, timeout * 4)
        except AdapterUnavailable as exc:
            # its owner came back, or the broker is away: a later call tries again
            log.warning("MQTT: the dead-letter box %s was not retired: %s", client_id, exc)
            continue
        log.warning(
            "MQTT: retired the dead-letter box %s of departed instance %s (%d letters "
            "published again to the live boxes)",
            client_id,
            record.owner,
            moved,
        )
        retired.append(client_id)
    return retired


def departed_boxes(
    sessions: SubscriptionSessions, live: Callable[[], Collection[str]], timeout: float
) -> list[tuple[str, Record]]:
    """(client id, record) of every dead-letter box whose record names an owner that is
    neither this instance nor one of ``live()``, asked after the records were read: an
    instance joins the cluster before it writes its boxes' records, so one that wrote a
    record read here is in the answer.  A box whose record names no owner (written by a
    version before owners, or by an instance never told its id) is never taken for
    departed."""
    head = sessions.mapping.record_head
    found = retained_under(sessions.settings, sessions.instance_id, head + "+", timeout)
    boxes: list[tuple[str, Record]] = []
    for topic, payload in sorted(found.items()):
        client_id = topic[len(head) :]
        if not client_id.startswith(CLIENT_ID_HEAD):
            continue
        record = sessions.parse_record(client_id, payload)
        if record is None or record.name is None or not sessions.own(record.name):
            continue
        if not record.owner or record.owner == sessions.owner:
            continue
        if client_id == sessions.client_id(record.name):
            continue  # this process's own box, whatever its record says
        boxes.append((client_id, record))
    if not boxes:
        return []
    alive = set(live())
    return [(c, r) for c, r in boxes if r.owner not in alive]


def letter_of(received: Received) -> OutboundMessage:
    """A dead letter read from a box, to be published again as it was."""
    headers = dict(received.headers)
    return OutboundMessage(
        topic=received.topic,
        body=received.body,
        message_id=headers.get(HEADER_MESSAGE_ID) or uuid.uuid4().hex,
        headers=headers,
        content_type=received.content_type,
    )


def retire_box(
    sessions: SubscriptionSessions,
    client_id: str,
    record: Record,
    republish: Republish,
    timeout: float,
) -> int:
    """Retire the box session ``client_id`` (module docstring): returns how many letters
    it held, published again.  AdapterUnavailable when the connection was cut off (its
    owner came back) or the sentinel did not come within ``timeout``: what was not
    acknowledged stays in the session."""
    arrived: queue.SimpleQueue[Received | None] = queue.SimpleQueue()
    conn = SessionConnection(
        sessions.settings,
        client_id,
        sessions.mapping,
        lambda topic: True,
        consumer=arrived.put,
        receive_maximum=RETIRE_WINDOW,
        on_lost=lambda: arrived.put(None),
        hub=sessions.hub,
    )
    ended = False
    try:
        if not conn.connect():
            conn.end()  # nothing was there: end the empty session this CONNECT made
            ended = True
            sessions.clear_record(client_id)
            return 0
        moved = _drain(sessions, conn, record, arrived, republish, timeout)
        if conn.lost:
            raise AdapterUnavailable(f"retiring {client_id}: cut off (its owner is back)")
        conn.end()
        ended = True
        sessions.clear_record(client_id)
        return moved
    finally:
        if not ended:
            conn.close()


def _drain(
    sessions: SubscriptionSessions,
    conn: SessionConnection,
    record: Record,
    arrived: queue.SimpleQueue[Received | None],
    republish: Republish,
    timeout: float,
) -> int:
    """Steps 1 to 3 of the module docstring, up to the sentinel; the letters moved."""
    deadline = time.monotonic() + timeout
    sentinel = Topic(SENTINEL_NAMESPACE, (uuid.uuid4().hex,))
    sentinel_name = sessions.mapping.name(sentinel)
    conn.subscribe([sentinel_name], timeout)
    conn.unsubscribe(record.filters, timeout)
    publisher = sessions.publisher
    assert publisher is not None
    marker = OutboundMessage(topic=sentinel, body=b"", message_id=sentinel.path[0])
    publisher.publish_many([(sentinel_name, marker)], timeout, retain=False)
    moved = 0
    while True:
        left = deadline - time.monotonic()
        try:
            first = arrived.get(timeout=max(0.0, left))
        except queue.Empty:
            raise AdapterUnavailable(
                f"retiring {conn.client_id}: its letters did not all come within {timeout:g}s"
            ) from None
        batch = [first]
        while not arrived.empty():
            batch.append(arrived.get_nowait())
        if any(r is None for r in batch) or conn.lost:
            raise AdapterUnavailable(f"retiring {conn.client_id}: cut off (its owner is back)")
        got = [r for r in batch if r is not None]
        letters = [r for r in got if r.topic != sentinel]
        if letters:
            republish([letter_of(r) for r in letters])
            moved += len(letters)
        for r in got:
            r.ack()
        if conn.lost:
            # cut off while it published them again: their PUBACKs may not have left, and
            # the owner that is back has the session (and them, once more)
            raise AdapterUnavailable(f"retiring {conn.client_id}: cut off (its owner is back)")
        if len(letters) < len(got):
            # a round trip after the last PUBACKs: an UNSUBACK comes only while this
            # connection still holds the session (a zombie back meanwhile took it)
            conn.unsubscribe([sentinel_name], max(0.5, deadline - time.monotonic()))
            return moved
