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


def _bodies(eng: Engine, sid: int) -> list[bytes]:
    return [row.body for row, _ in eng.peek(sid, 100)]


def _parked_setup(eng: Engine) -> tuple[int, list[tuple[int, OutboundMessage]]]:
    """A box, and two dead letters of ``sub``'s limit waiting in the outbox: (the box's
    id, the outbox rows)."""
    box = eng.attach("box", (PathPattern(GRAVE.namespace, GRAVE.path),), QueueLimits())
    eng.attach("sub", (PathPattern(NS, ("t",)),), QueueLimits(max_messages=1), GRAVE)
    eng.publish_many([msg(b"first"), msg(b"second"), msg(b"third")])
    rows = eng.outbox_batch(10)
    assert [m.body for _, m in rows] == [b"first", b"second"]
    return box.id, rows


def test_parking_is_idempotent(tmp_path: Path) -> None:
    """The outbox row is the key of a parking: parking rows again (a sender that failed
    after the parking committed and repeats it) queues nothing twice."""
    eng = engine(tmp_path)
    try:
        box, rows = _parked_setup(eng)
        eng.outbox_park(rows)
        eng.outbox_park(rows)
        eng.outbox_park(rows[:1])
        assert _bodies(eng, box) == [b"first", b"second"]
        assert eng.outbox_batch(10) == []
    finally:
        eng.close()


def test_a_letter_parked_without_its_box_is_kept_until_the_box_is_back(tmp_path: Path) -> None:
    """A dead letter parked while its destination's box was deleted has no queue to go
    to: it is stranded (kept, counted), over a restart, and moved into the box's queue
    when the box is attached again, once."""
    eng = engine(tmp_path)
    try:
        _, rows = _parked_setup(eng)
        eng.delete_subscription("box")
        homeless = eng.outbox_park(rows)
        assert eng.outbox_batch(10) == []
        assert eng.stranded_count() == 2
        assert homeless == 2
        # another subscription is no box of theirs
        eng.attach("other", (PathPattern(NS, ("t",)),), QueueLimits())
        assert eng.stranded_count() == 2
    finally:
        eng.close()
    eng = engine(tmp_path)
    try:
        assert eng.stranded_count() == 2
        box = eng.attach("box", (PathPattern(GRAVE.namespace, GRAVE.path),), QueueLimits())
        assert eng.stranded_count() == 0
        assert _bodies(eng, box.id) == [b"first", b"second"]
        row = eng.peek(box.id, 10)[0][0]
        assert row.headers[HEADER_DROPPED_REASON] == "overflow"
        assert row.headers[HEADER_DROPPED_FROM] == "sub"
        # attaching it again moves nothing more
        eng.attach("box2", (PathPattern(GRAVE.namespace, GRAVE.path),), QueueLimits())
        assert _bodies(eng, box.id) == [b"first", b"second"]
    finally:
        eng.close()


def test_a_local_dead_letter_without_its_box_is_kept(tmp_path: Path) -> None:
    """The same without the outbox (the embedded adapter, MQTT 3.1.1): what a limit drops
    for a destination whose box is gone is stranded, not dropped."""
    eng = engine(tmp_path)
    try:
        eng.attach("sub", (PathPattern(NS, ("t",)),), QueueLimits(max_messages=1), LOCAL)
        eng.publish_many([msg(b"first"), msg(b"second")])
        assert eng.stranded_count() == 1
        box = eng.attach("box", (PathPattern(LOCAL.namespace, LOCAL.path),), QueueLimits())
        assert _bodies(eng, box.id) == [b"first"]
        assert eng.stranded_count() == 0
    finally:
        eng.close()
