"""The current-message map of the Kafka adapter without a broker: records the head reads
stay unconverted until GetCurrentMessage asks, and "newest" keeps its meaning for lazy and
published entries alike."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

pytest.importorskip("confluent_kafka")

from wsnmom.adapters.kafka.clients import Health
from wsnmom.adapters.kafka.config import parse_settings
from wsnmom.adapters.kafka.current import CurrentMessages
from wsnmom.adapters.kafka.mapping import KafkaMapping
from wsnmom.adapters.kafka.topics import Topics
from wsnmom.adapters.logbase.backend import Details, LogRecord
from wsnmom.core.adapter import OutboundMessage
from wsnmom.topic_mapping.model import Topic

NS = "http://example.org/plant"
TOPIC = Topic(NS, ("tank",))


@pytest.fixture
def current() -> CurrentMessages:
    settings = parse_settings("kafka://127.0.0.1:1", {"namespaces": {NS: "plant"}})
    mapping = KafkaMapping(settings)
    return CurrentMessages(settings, mapping, Topics(None, settings), Health(1.0, 1.0))  # type: ignore[arg-type]


class Counted:
    """A record's details function that counts its calls."""

    def __init__(self, body: bytes, millis: int) -> None:
        self.body = body
        self.millis = millis
        self.calls = 0

    def __call__(self) -> Details:
        self.calls += 1
        stamp = datetime.fromtimestamp(self.millis / 1000, UTC)
        return self.body, {"k": "v"}, "application/xml", stamp


def record(partition: int, offset: int, details: Counted) -> LogRecord:
    return LogRecord(("plant.tank", partition), offset, TOPIC, details=details)


def test_head_records_are_converted_only_when_asked_for(current: CurrentMessages) -> None:
    seen = [Counted(b"<r%d/>" % i, 1000 + i) for i in range(50)]
    for i, details in enumerate(seen):
        current.observe(record(0, i, details))
    assert sum(d.calls for d in seen) == 0
    found = current.get(TOPIC)
    assert found is not None and found.body == b"<r49/>" and found.headers == {"k": "v"}
    assert [d.calls for d in seen] == [0] * 49 + [1]
    current.get(TOPIC)  # converted once, then kept
    assert seen[-1].calls == 1


def test_newest_across_partitions_is_by_timestamp(current: CurrentMessages) -> None:
    older, newer = Counted(b"<old/>", 5_000), Counted(b"<new/>", 6_000)
    current.observe(record(1, 7, newer))
    current.observe(record(0, 900, older))  # higher offset, other partition, older
    found = current.get(TOPIC)
    assert found is not None and found.body == b"<new/>"


def test_a_confirmed_publish_and_the_head_agree_on_the_newest(current: CurrentMessages) -> None:
    dest = KafkaMapping(parse_settings("kafka://127.0.0.1:1", {})).destination(TOPIC)
    published = OutboundMessage(topic=TOPIC, body=b"<mine/>", message_id="m1")
    current.published(dest, published, 0, 10, 2_000)
    late = Counted(b"<mine/>", 2_000)
    current.observe(record(0, 10, late))  # the head reads the same record later
    assert late.calls == 0
    current.observe(record(0, 9, Counted(b"<older/>", 1_000)))
    found = current.get(TOPIC)
    assert found is not None and found.body == b"<mine/>"
    assert found.headers["wsnmom-message-id"] == "m1"
