"""Where a new Kafka subscription starts when the brokers' high watermark is not trusted
(``exact_watermarks = false``, tansu) and the head reader is slow (a loaded machine)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest

pytest.importorskip("confluent_kafka")

from wsnmom.adapters.kafka.adapter import KafkaAdapter
from wsnmom.adapters.kafka.readers import KafkaHeadReader
from wsnmom.topic_mapping.model import PathPattern, Topic

from tests.adapters.test_kafka import NS, make_kafka, message, subscribe

pytestmark = pytest.mark.kafka

__all__ = ["make_kafka"]  # the fixture, used by name


def test_a_new_subscription_gets_nothing_the_gateway_published_before_it(
    make_kafka: Callable[..., KafkaAdapter], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record the gateway published (confirmed) before a Subscribe is not delivered to
    it, even when the head reader has not read that record when the subscription is
    made: it starts after the gateway's own confirmed publishes at least.  Before, it
    started where the head reader was once a sync of at most 1 s ran out, and got the
    record: ``test_kafka_conformance``'s ``test_delete_into_dead_letters`` failed so at
    load 7-19 (``after`` reached the subscription made again).  Here each head poll
    takes 1.5 s, as a head thread that gets no CPU."""
    adapter = make_kafka(namespaces={NS: "plant"})
    assert not adapter.settings.exact_watermarks  # isolated_options: tansu's
    topic = Topic(NS, ("late",))
    pattern = PathPattern(NS, ("late",))
    first = subscribe(adapter, pattern)
    adapter.publish(message(topic, b"<one/>"))
    first.wait_for(1, 30)  # the topic is known and followed by the head reader
    slow = threading.Event()
    original = KafkaHeadReader.poll

    def poll(self: KafkaHeadReader, max_records: int, timeout: float) -> Sequence[Any]:
        records = original(self, max_records, timeout)
        if slow.is_set():
            time.sleep(1.5)  # a head thread without CPU: its records wait to be dispatched
        return records

    monkeypatch.setattr(KafkaHeadReader, "poll", poll)
    slow.set()
    time.sleep(0.1)  # the head thread is in a slow poll now
    adapter.publish(message(topic, b"<before/>"))
    later = subscribe(adapter, pattern)
    slow.clear()
    adapter.publish(message(topic, b"<sentinel/>"))
    later.wait_for_body(b"<sentinel/>", 30)
    assert later.bodies() == [b"<sentinel/>"]
