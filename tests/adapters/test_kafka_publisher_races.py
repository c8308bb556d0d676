"""Races of the Kafka publisher's producer replacement (``Publisher.renew``) with the
publishes using the producer it replaces, on the session's broker."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("confluent_kafka")

from confluent_kafka import KafkaError, Producer
from wsnmom.adapters.kafka.adapter import KafkaAdapter
from wsnmom.adapters.kafka.mapping import Destination
from wsnmom.adapters.kafka.publisher import Publisher, PublishUnavailable
from wsnmom.adapters.kafka.reports import Batch
from wsnmom.core.adapter import OutboundMessage
from wsnmom.topic_mapping.model import PathPattern, Topic

from tests.adapters.test_kafka import NS, make_kafka, message, subscribe
from tests.adapters.test_kafka_conformance import isolated_options
from tests.fixtures.tansu import TansuNode

pytestmark = pytest.mark.kafka

__all__ = ["make_kafka"]  # the fixture, used by name


def replace_before_first_produce(
    monkeypatch: pytest.MonkeyPatch,
    before: Callable[[], None] = lambda: None,
    after: Callable[[], None] = lambda: None,
) -> list[Producer]:
    """Make the next publish's first produce meet its producer replaced by another
    publish (``renew``), once the poll thread's poll of the old producer (up to 0.1 s) is
    over (a wider window than a live race's, same order); ``before`` and ``after`` run
    around that produce.  The list gets the replaced producer."""
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
        if replaced:
            return original(self, producer, batch, index, msg, dest, deadline)
        replaced.append(producer)
        self.renew("the test: another publish replaced it", only=producer)
        time.sleep(0.3)  # the poll thread drops the old producer as empty
        before()
        produced = original(self, producer, batch, index, msg, dest, deadline)
        after()
        return produced

    monkeypatch.setattr(Publisher, "_produce", produce)
    return replaced


def publish_confirmed_promptly_past_a_replacement(
    adapter: KafkaAdapter,
    msg: OutboundMessage,
    monkeypatch: pytest.MonkeyPatch,
    before: Callable[[], None] = lambda: None,
    after: Callable[[], None] = lambda: None,
) -> None:
    """Publish ``msg``, its first produce meeting its producer replaced
    (``replace_before_first_produce``, ``before`` and ``after`` around it): it must have
    produced, and been confirmed within half its timeout."""
    replaced = replace_before_first_produce(monkeypatch, before, after)
    timeout = 12.0
    started = time.monotonic()
    adapter.publish(msg, timeout=timeout)
    took = time.monotonic() - started
    assert replaced, "the publish did not produce"
    assert took < timeout / 2, f"confirmed after {took:.1f}s"


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
    publish_confirmed_promptly_past_a_replacement(adapter, message(topic, b"<raced/>"), monkeypatch)
    adapter.publish(message(topic, b"<sentinel/>"))
    got.wait_for(3, 30)
    assert got.bodies() == [b"<warm/>", b"<raced/>", b"<sentinel/>"]


def test_a_record_in_flight_on_a_replaced_producer_dropped_as_empty_is_confirmed(
    tansu_factory: Callable[[], TansuNode], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, but the record is on the wire when the publish purges what the replaced
    producer still queues (the broker held, SIGSTOP), after the poll thread had dropped
    that producer as empty: its acknowledgement comes once the broker answers again, and
    only a poll of the old producer serves it.  The publish must have it polled again.
    Before, it failed after its whole timeout (fresh-clone run69 met this without the
    broker held)."""
    node = tansu_factory()
    adapter = KafkaAdapter(node.url, {**isolated_options(), "namespaces": {NS: "plant"}})
    adapter.open()
    try:
        topic = Topic(NS, ("in-flight",))
        adapter.publish(message(topic, b"<warm/>"))

        def sent_held() -> None:
            time.sleep(0.3)  # sent into the held broker's socket: in flight, unanswered
            threading.Timer(0.5, node.resume).start()

        publish_confirmed_promptly_past_a_replacement(
            adapter, message(topic, b"<in-flight/>"), monkeypatch, node.pause, sent_held
        )
    finally:
        node.resume()
        adapter.close()


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


def test_a_record_purged_from_the_queue_after_a_lost_connection_is_not_produced_twice(
    make_kafka: Callable[..., KafkaAdapter], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker wrote a record, the connection was lost before its acknowledgement
    (librdkafka puts it back in its queue for a retry), and the producer was replaced
    meanwhile (the cluster did not answer, or a followed topic was re-created): the
    purge reports it ``_PURGE_QUEUE``, as a record never sent.  The test plays that
    report (and the lost connection, ``Health.epoch``) for a record tansu did write.
    The publish must fail (the gateway cannot know whether it was written) and the
    record be there once.  Before, it was produced again on the new producer (a new
    producer id, so no idempotence) and written twice, the publish confirmed."""
    adapter = make_kafka(namespaces={NS: "plant"})
    topic = Topic(NS, ("requeued",))
    got = subscribe(adapter, PathPattern(NS, ("requeued",)))
    adapter.publish(message(topic, b"<warm/>"))
    got.wait_for(1, 30)
    publisher = adapter._require().publisher
    health = publisher._health
    report = Batch.report
    played: list[threading.Thread] = []

    def requeued_then_purged(
        batch: Batch, attempt: int, index: int, error: KafkaError | None, msg: Any
    ) -> None:
        if error is not None or msg.value() != b"<requeued/>" or played:
            report(batch, attempt, index, error, msg)
            return

        def play() -> None:  # not on the poll thread: renew polls the old producer
            with health._lock:
                health.epoch += 1  # the connection lost before the acknowledgement
            publisher.renew("the test: the cluster did not answer")
            report(batch, attempt, index, KafkaError(KafkaError._PURGE_QUEUE), msg)

        played.append(threading.Thread(target=play))
        played[0].start()

    monkeypatch.setattr(Batch, "report", requeued_then_purged)
    with pytest.raises(PublishUnavailable):
        adapter.publish(message(topic, b"<requeued/>"), timeout=12)
    assert played, "the record was not written"
    played[0].join(10)
    adapter.publish(message(topic, b"<sentinel/>"))
    got.wait_for(3, 30)
    assert got.bodies() == [b"<warm/>", b"<requeued/>", b"<sentinel/>"]


class _Counting:
    """An AdminClient that counts its DescribeTopics requests."""

    def __init__(self, admin: Any) -> None:
        self._admin = admin
        self.describes = 0
        self._lock = threading.Lock()

    def describe_topics(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            self.describes += 1
        return self._admin.describe_topics(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._admin, name)


def test_publishes_the_broker_held_share_one_look_at_the_topics(
    tansu_factory: Callable[[], TansuNode],
) -> None:
    """32 threads publishing while the broker is held 1 s (SIGSTOP): each publish on the
    wire is not confirmed within a quarter of ``unavailable_grace`` and looks whether the
    cluster lost its topics (``TopicCheck.check``), but one look serves those waiting
    for it: it asks only for the topics the looks before it did not find (8 topics
    here: 7-8 requests).  Before, each publish sent its own DescribeTopics, at a broker
    just coming back: 32 of 32, 3 of 3 runs (load 2.6)."""
    node = tansu_factory()
    adapter = KafkaAdapter(node.url, {**isolated_options(), "namespaces": {NS: "plant"}})
    adapter.open()
    try:
        topics = [Topic(NS, ("burst", f"n{i}")) for i in range(8)]
        for topic in topics:
            adapter.publish(message(topic, b"<warm/>"))
        looks = adapter._require().publisher._topics
        counting = _Counting(looks._admin)
        looks._admin = counting  # type: ignore[assignment]
        failed: list[BaseException] = []

        def publish(k: int) -> None:
            for j in range(10):
                try:
                    adapter.publish(message(topics[(k + j) % 8], b"<burst/>"), timeout=15)
                except BaseException as exc:
                    failed.append(exc)

        threads = [threading.Thread(target=publish, args=(k,)) for k in range(32)]
        for thread in threads:
            thread.start()
        node.pause()  # amid the burst: the publishes on the wire pass a quarter of the grace
        try:
            held = time.monotonic()
            # held 1 s, and until a look came (those waiting are past a quarter of it)
            while counting.describes == 0 or time.monotonic() < held + 1.0:
                assert time.monotonic() < held + 30, "no publish looked at the topics"
                time.sleep(0.02)
        finally:
            node.resume()
        for thread in threads:
            thread.join(30)
        assert not failed, failed[:3]
        assert counting.describes <= 12, f"{counting.describes} DescribeTopics for 32 publishes"
    finally:
        node.resume()
        adapter.close()
