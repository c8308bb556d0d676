"""What the session's Kafka-protocol broker (tansu locally) does with an offset commit of a
stale group member (docs/scale-out.md, "What fences what today"): the experiment behind
the choice of the lease fence over consumer-group generations for the adapter's position
writes.  ``OffsetCommit`` v2 requests are written by hand, so that the generation sent is
the one the test chooses, not the member's current one (librdkafka always sends that).
"""

from __future__ import annotations

import socket
import struct
import uuid

import pytest

pytest.importorskip("confluent_kafka")

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.waiting import wait_until

pytestmark = pytest.mark.kafka

OK = 0
ILLEGAL_GENERATION = 22
UNKNOWN_MEMBER_ID = 25


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def offset_commit(bootstrap: str, group: str, generation: int, member: str, topic: str) -> int:
    """The error code of an ``OffsetCommit`` v2 of offset 1 of ``topic``'s partition 0
    (a one-node broker: the node asked coordinates every group)."""
    body = _string(group) + struct.pack(">i", generation) + _string(member)
    body += struct.pack(">q", -1) + struct.pack(">i", 1) + _string(topic)
    body += struct.pack(">i", 1) + struct.pack(">iq", 0, 1) + struct.pack(">h", -1)
    request = struct.pack(">hhi", 8, 2, 1) + _string("wsnmom-test") + body
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(struct.pack(">i", len(request)) + request)
        size = struct.unpack(">i", conn.recv(4))[0]
        data = b""
        while len(data) < size:
            chunk = conn.recv(size - len(data))
            assert chunk, "the broker closed the connection"
            data += chunk
    # correlation id, topics [name, partitions [index, error]]
    pos = 8
    pos += 2 + struct.unpack(">h", data[pos : pos + 2])[0]
    pos += 4 + 4
    return int(struct.unpack(">h", data[pos : pos + 2])[0])


def test_a_commit_in_an_older_generation_is_rejected(kafka_bootstrap: str) -> None:
    bootstrap = kafka_bootstrap
    tag = uuid.uuid4().hex[:10]
    topic, group = f"wsnmom-gen-{tag}", f"wsnmom-gen-{tag}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        future.result(30)
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, b"x")
    producer.flush(10)
    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "enable.auto.commit": False,
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 500,
    }
    first = Consumer(conf)
    second: Consumer | None = None
    try:
        first.subscribe([topic])

        def joined(consumer: Consumer) -> bool:
            consumer.poll(0.1)
            return bool(consumer.assignment())

        wait_until(lambda: joined(first), 30, what="the first member's assignment")
        member = first.memberid()
        assert member
        # the one generation there is: which one is it?
        current = next(
            g for g in range(0, 6) if offset_commit(bootstrap, group, g, member, topic) == OK
        )
        second = Consumer(conf)
        second.subscribe([topic])
        later = second

        def fenced() -> bool:
            """Once the group settled in a newer generation (the members polled), the
            first member's commit in its old generation is refused, while one in the
            new generation is taken (during the rebalance the old one may still be)."""
            first.poll(0.1)
            later.poll(0.1)
            if not later.memberid():
                return False
            newer = [
                g
                for g in range(current + 1, current + 6)
                if offset_commit(bootstrap, group, g, member, topic) == OK
            ]
            old = offset_commit(bootstrap, group, current, member, topic)
            return bool(newer) and old == ILLEGAL_GENERATION

        wait_until(fenced, 60, what="the old generation's commit refused")
        assert offset_commit(bootstrap, group, current, "nobody", topic) == UNKNOWN_MEMBER_ID
    finally:
        # the later member first: closed after the first one left, it waited 4 s (load 4)
        # in the rebalance that leave began; closed first, each close took 0.2 s or less
        if second is not None:
            second.close()
        first.close()
