"""Embedded store's outbox (used by the MQTT adapter on MQTT 5): the dead letters a
subscription's limits drop are written to the ``outbox`` table in the transaction that
drops them, instead of into the queues; they stay there, over a restart, until
``outbox_remove`` forgets them (after the broker confirmed them, :mod:`adapters.mqtt.outbox`)."""

from __future__ import annotations

import uuid
from pathlib import Path

from wsnmom.adapters.embedded.store import Engine
from wsnmom.core.adapter import (
    HEADER_DROPPED_FROM,
    HEADER_DROPPED_REASON,
    INTERNAL_NAMESPACE_PREFIX,
    OutboundMessage,
    QueueLimits,
)
from wsnmom.topic_mapping.model import PathPattern, Topic

NS = "urn:wsnmom:test:embedded-outbox"
GRAVE = Topic(INTERNAL_NAMESPACE_PREFIX + "dead-letters", ("test",))
LOCAL = Topic(INTERNAL_NAMESPACE_PREFIX + "dead-letters", ("local",))


def msg(body: bytes) -> OutboundMessage:
    return OutboundMessage(Topic(NS, ("t",)), body, uuid.uuid4().hex, {"x-app": "1"})


def engine(path: Path) -> Engine:
    return Engine(str(path), keep_current=False, outbox=lambda topic: topic == GRAVE)


def test_dropped_messages_wait_in_the_outbox_until_removed(tmp_path: Path) -> None:
    eng = engine(tmp_path)
    kicks: list[int] = []
    eng.on_outbox = lambda: kicks.append(1)
    try:
        box = eng.attach("box", (PathPattern(GRAVE.namespace, GRAVE.path),), QueueLimits())
        eng.attach("sub", (PathPattern(NS, ("t",)),), QueueLimits(max_messages=1), GRAVE)
        eng.publish_many([msg(b"first"), msg(b"second"), msg(b"third")])
        assert kicks  # told after the commit
        rows = eng.outbox_batch(10)
        assert [m.body for _, m in rows] == [b"first", b"second"]
        assert all(m.topic == GRAVE for _, m in rows)
        assert {m.headers[HEADER_DROPPED_REASON] for _, m in rows} == {"overflow"}
        assert {m.headers[HEADER_DROPPED_FROM] for _, m in rows} == {"sub"}
        assert {m.headers["x-app"] for _, m in rows} == {"1"}
        # not in the box's queue: it gets them back from the other middleware
        assert eng.depths([box.id]) == [0]
        assert len(eng.outbox_batch(1)) == 1
    finally:
        eng.close()
    # a restart keeps what was not confirmed
    eng = engine(tmp_path)
    try:
        rows = eng.outbox_batch(10)
        assert [m.body for _, m in rows] == [b"first", b"second"]
        eng.outbox_remove([rows[0][0]])
        assert [m.body for _, m in eng.outbox_batch(10)] == [b"second"]
    finally:
        eng.close()


def test_other_dead_letter_topics_stay_in_the_queues(tmp_path: Path) -> None:
    eng = engine(tmp_path)
    try:
        box = eng.attach("box", (PathPattern(LOCAL.namespace, LOCAL.path),), QueueLimits())
        eng.attach("sub", (PathPattern(NS, ("t",)),), QueueLimits(max_messages=1), LOCAL)
        eng.publish_many([msg(b"first"), msg(b"second")])
        assert eng.outbox_batch(10) == []
        assert eng.depths([box.id]) == [1]
    finally:
        eng.close()
