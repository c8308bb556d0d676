"""Races of the Kafka publisher's producer replacement (``Publisher.renew``) with the
publishes using the producer it replaces, on the session's broker."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("confluent_kafka")

from confluent_kafka import KafkaError, Producer
from wsnmom.adapters.kafka.adapter import KafkaAdapter
from wsnmom.adapters.kafka.mapping import Destination
from wsnmom.adapters.kafka.publisher import Publisher
from wsnmom.adapters.kafka.reports import Batch
from wsnmom.core.adapter import OutboundMessage
from wsnmom.topic_mapping.model import PathPattern, Topic

from tests.adapters.test_kafka import NS, make_kafka, message, subscribe

pytestmark = pytest.mark.kafka

__all__ = ["make_kafka"]  # the fixture, used by name


def test_a_record_produced_on_a_producer_replaced_meanwhile_is_confirmed_once(
    make_kafka: Callable[..., KafkaAdapter], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A publish takes the producer, another publish replaces it (``renew``: purge, one
    poll) before the first produces on it: the record must still be confirmed (produced
    again on the new producer, or its report served), promptly, and written once.
    Before, nobody polled the old producer any more: the old producer wrote the record,
    its report was never served and the publish failed after its whole timeout."""
    adapter = make_kafka(namespaces={NS: "plant"})
    topic = Topic(NS, ("raced",))
    got = subscribe(adapter, PathPattern(NS, ("raced",)))
    adapter.publish(message(topic, b"<warm/>"))
    got.wait_for(1, 30)
    original = Publisher._produce
    replaced: list[Producer] = []

    def produce(
        self: Publisher,
        producer: Producer,
        batch: Batch,
        index: int,
        msg: OutboundMessage,
        dest: Destination,
        deadline: float,
    ) -> Any:
        if not replaced:  # the first produce: another publish replaces the producer first
            replaced.append(producer)
            self.renew("the test: another publish replaced it", only=producer)
            # the poll thread's poll of the old producer (up to 0.1 s) is over: it
            # polls the new one now (a wider window than a live race's, same order)
            time.sleep(0.3)
        return original(self, producer, batch, index, msg, dest, deadline)

    monkeypatch.setattr(Publisher, "_produce", produce)
    timeout = 12.0
    started = time.monotonic()
    adapter.publish(message(topic, b"<raced/>"), timeout=timeout)
    took = time.monotonic() - started
    assert replaced, "the publish did not produce"
    assert took < timeout / 2, f"confirmed after {took:.1f}s"
    adapter.publish(message(topic, b"<sentinel/>"))
    got.wait_for(3, 30)
    assert got.bodies() == [b"<warm/>", b"<raced/>", b"<sentinel/>"]


def test_a_late_report_of_an_earlier_attempt_counts_for_nothing() -> None:
    """``Batch.rearm`` after ``fail_all`` (a fatal error replaced the producer while
    reports of a purge were being served): a report of the earlier attempt arriving
    after the rearm must not stand for the record produced again, or the publish would
    return "confirmed" for a record nobody acknowledged.  Before, it counted."""
    purged = KafkaError(KafkaError._PURGE_QUEUE)
    batch = Batch(2)
    first = [batch.reporter(0), batch.reporter(1)]
    first[0](purged, None)
    batch.fail_all(KafkaError(KafkaError._FATAL))
    assert batch.wait(0)
    batch.rearm([0])
    again = batch.reporter(0)
    first[1](None, None)  # index 1's report of the first attempt, late
    assert batch.remaining == 1  # still waiting for the record produced again
    again(None, None)
    assert batch.wait(0)
