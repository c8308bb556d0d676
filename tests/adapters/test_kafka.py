"""The Kafka adapter against a real Kafka-protocol broker: native interop both ways, both
mappings, wildcard subscriptions and topics created later, the topic policy, the current
message, 2,000 subscriptions on bounded clients and threads, secrets kept out of logs.
Outages (SIGSTOP, kill and restart) run on private tansu nodes: tests/adapters/
test_kafka_outage.py."""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

pytest.importorskip("confluent_kafka")

from confluent_kafka import Consumer, Producer, TopicPartition
from wsnmom.adapters.kafka.adapter import KafkaAdapter
from wsnmom.core.adapter import (
    HEADER_MESSAGE_ID,
    HEADER_TOPIC_NAMESPACE,
    OutboundMessage,
    SubscriptionHandle,
    SubscriptionSpec,
    TopicUnavailable,
)
from wsnmom.topic_mapping.model import ANY, DEEP, PathPattern, Topic

from tests.adapters.test_kafka_conformance import isolated_options
from tests.fixtures.brokers import ResolvedBroker
from tests.support.kafka_records import delete_records_or_skip
from wsnmom.testing.conformance import Collector

pytestmark = pytest.mark.kafka

NS = "http://example.org/plant"


@pytest.fixture
def make_kafka(kafka_url: str) -> Iterator[Callable[..., KafkaAdapter]]:
    """Open Kafka adapters with isolated names (extra options win); closed at the end."""
    made: list[KafkaAdapter] = []

    def make(url: str | None = None, **options: Any) -> KafkaAdapter:
        adapter = KafkaAdapter(url or kafka_url, {**isolated_options(), **options})
        adapter.open()
        made.append(adapter)
        return adapter

    yield make
    for adapter in reversed(made):
        adapter.close()


def message(topic: Topic, body: bytes, **headers: str) -> OutboundMessage:
    return OutboundMessage(topic=topic, body=body, message_id=uuid.uuid4().hex, headers=headers)


def subscribe(adapter: KafkaAdapter, *patterns: PathPattern, ack: bool = True) -> Collector:
    collector = Collector(ack=ack)
    spec = SubscriptionSpec(f"s-{uuid.uuid4().hex}", tuple(patterns) or None)
    adapter.subscription(spec).start(collector, prefetch=100)
    return collector


def native_producer(bootstrap: str) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20})


def test_native_records_of_any_body_reach_subscribers(
    make_kafka: Callable[..., KafkaAdapter], kafka_bootstrap: str
) -> None:
    adapter = make_kafka(namespaces={NS: "plant"})
    prefix = adapter.settings.topic_prefix
    got = subscribe(adapter, PathPattern(NS, ("valve", ANY)))
    adapter.publish(message(Topic(NS, ("valve", "v0")), b"<warmup/>"))  # creates the topic
    assert got.wait_for(1, 10)
    bodies = {
        "json": (b'{"pressure": 7.5}', "application/json"),
        "text": (b"open at 12:00", "text/plain"),
        "binary": (bytes(range(256)), "application/octet-stream"),
        "xml": (b'<reading xmlns="urn:r">7</reading>', "application/xml"),
    }
    producer = native_producer(kafka_bootstrap)
    for kind, (body, _) in bodies.items():
        producer.produce(f"{prefix}.plant.valve.v0", body, key=kind.encode())
    producer.produce(f"{prefix}.plant.pump.p1", b"not for this subscription")
    assert producer.flush(10) == 0
    received = got.wait_for(5, 10)[1:]
    assert [(m.body, m.content_type) for m in received] == list(bodies.values())
    assert {m.topic for m in received} == {Topic(NS, ("valve", "v0"))}
    assert all(HEADER_MESSAGE_ID not in m.headers for m in received)


def test_gateway_records_are_readable_by_a_plain_consumer(
    make_kafka: Callable[..., KafkaAdapter], kafka_bootstrap: str
) -> None:
    adapter = make_kafka(namespaces={NS: "plant"})
    topic = Topic(NS, ("valve", "v7"))
    adapter.publish(message(topic, b"<state>open</state>", **{HEADER_TOPIC_NAMESPACE: NS}))
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": uuid.uuid4().hex})
    consumer.assign([TopicPartition(f"{adapter.settings.topic_prefix}.plant.valve.v7", 0, 0)])
    try:
        record = None
        deadline = time.monotonic() + 10
        while record is None and time.monotonic() < deadline:
            record = consumer.poll(0.5)
    finally:
        consumer.close()
    assert record is not None and record.error() is None
    headers = {k: (v or b"").decode() for k, v in record.headers() or []}
    assert record.value() == b"<state>open</state>"
    assert record.key() == b"valve/v7"
    assert headers["content-type"] == "application/xml"
    assert headers[HEADER_TOPIC_NAMESPACE] == NS
    assert HEADER_MESSAGE_ID in headers


def test_topic_per_namespace_routes_native_records_by_key(
    make_kafka: Callable[..., KafkaAdapter], kafka_bootstrap: str
) -> None:
    shared = f"plant-{uuid.uuid4().hex[:8]}"
    adapter = make_kafka(namespaces={NS: {"mode": "namespace", "topic": shared}}, partitions=3)
    valves = subscribe(adapter, PathPattern(NS, ("valve", DEEP)))
    pumps = subscribe(adapter, PathPattern(NS, ("pump",)))
    adapter.publish(message(Topic(NS, ("valve", "a")), b"<gw/>"))
    assert valves.wait_for(1, 10)
    producer = native_producer(kafka_bootstrap)
    producer.produce(shared, b'{"n": 1}', key=b"valve/b/c")
    producer.produce(shared, b"p", key=b"pump")
    producer.produce(shared, b"k", key=b"not a path")  # default path "native"
    assert producer.flush(10) == 0
    assert [m.topic.path for m in valves.wait_for(2, 10)] == [("valve", "a"), ("valve", "b", "c")]
    assert [m.body for m in pumps.wait_for(1, 10)] == [b"p"]
    # the barrier: a sentinel for each subscription in every partition, after the rest
    for partition in range(3):
        producer.produce(shared, b"sentinel", key=b"valve/sentinel", partition=partition)
        producer.produce(shared, b"sentinel", key=b"pump", partition=partition)
    assert producer.flush(10) == 0
    valves.wait_for(5, 10)
    pumps.wait_for(4, 10)
    assert [m.body for m in valves.received if m.body != b"sentinel"] == [b"<gw/>", b'{"n": 1}']
    assert [m.body for m in pumps.received] == [b"p"] + [b"sentinel"] * 3


def test_wildcard_subscription_picks_up_a_topic_created_after_it(
    make_kafka: Callable[..., KafkaAdapter], kafka_bootstrap: str
) -> None:
    adapter = make_kafka(namespaces={NS: "plant"}, discovery_interval=1.0)
    got = subscribe(adapter, PathPattern(NS, ("line", DEEP)))
    native = native_producer(kafka_bootstrap)
    # created by someone else (here: the native producer's broker auto-creation is off, so
    # through the admin API of a second gateway instance's publish)
    other = make_kafka(
        namespaces={NS: "plant"},
        topic_prefix=adapter.settings.topic_prefix,
        internal_topic=adapter.settings.internal_topic + "-2",
    )
    other.publish(message(Topic(NS, ("line", "l9", "speed")), b"<v>1</v>"))
    native.produce(f"{adapter.settings.topic_prefix}.plant.line.l9.speed", b"2")
    assert native.flush(10) == 0
    # timed from here, when the topic and both records are there: the second adapter's
    # start and the producers' round trips before are the test's time (seconds under load)
    present = time.monotonic()
    bodies = [m.body for m in got.wait_for(2, 10)]
    took = time.monotonic() - present
    assert bodies == [b"<v>1</v>", b"2"]
    # documented bound: discovery_interval (1 s here) plus a fetch
    assert took < 1.0 + 2.0, took


def test_existing_topics_policy_refuses_missing_topics(
    make_kafka: Callable[..., KafkaAdapter],
) -> None:
    adapter = make_kafka(topic_policy="existing", namespaces={NS: "plant"})
    with pytest.raises(TopicUnavailable):
        adapter.publish(message(Topic(NS, ("never", "created")), b"<x/>"))
    creator = make_kafka(topic_prefix=adapter.settings.topic_prefix, namespaces={NS: "plant"})
    creator.publish(message(Topic(NS, ("now", "there")), b"<x/>"))
    adapter.publish(message(Topic(NS, ("now", "there")), b"<y/>"))  # exists: accepted


def test_current_message_includes_native_records(
    make_kafka: Callable[..., KafkaAdapter], kafka_bootstrap: str
) -> None:
    adapter = make_kafka(namespaces={NS: "plant"})
    topic = Topic(NS, ("tank", "t1"))
    assert adapter.current_message(topic) is None
    adapter.publish_many([message(topic, b"<a/>"), message(topic, b"<b/>")])
    current = adapter.current_message(topic)
    assert current is not None and current.body == b"<b/>"
    producer = native_producer(kafka_bootstrap)
    producer.produce(f"{adapter.settings.topic_prefix}.plant.tank.t1", b'{"level": 3}')
    assert producer.flush(10) == 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        current = adapter.current_message(topic)
        if current is not None and current.body == b'{"level": 3}':
            break
        time.sleep(0.1)
    assert current is not None and current.body == b'{"level": 3}'
    assert current.content_type == "application/json"
    # a fresh gateway (empty cache) finds it in the topic's tail, natively produced too
    fresh = make_kafka(topic_prefix=adapter.settings.topic_prefix, namespaces={NS: "plant"})
    found = fresh.current_message(topic)
    assert found is not None and json.loads(found.body) == {"level": 3}
    assert fresh.current_message(Topic(NS, ("tank",))) is None


def test_current_message_per_namespace_is_the_last_for_that_path(
    make_kafka: Callable[..., KafkaAdapter],
) -> None:
    shared = f"plant-{uuid.uuid4().hex[:8]}"
    options = {"namespaces": {NS: {"mode": "namespace", "topic": shared}}, "partitions": 2}
    adapter = make_kafka(**options)
    a, b = Topic(NS, ("a",)), Topic(NS, ("b",))
    adapter.publish_many([message(a, b"<a1/>"), message(b, b"<b1/>"), message(a, b"<a2/>")])
    adapter.publish(message(b, b"<b2/>"))
    fresh = make_kafka(**options, topic_prefix=adapter.settings.topic_prefix)
    got_a, got_b = fresh.current_message(a), fresh.current_message(b)
    assert got_a is not None and got_a.body == b"<a2/>"
    assert got_b is not None and got_b.body == b"<b2/>"


def test_2000_subscriptions_on_bounded_clients_and_threads(
    make_kafka: Callable[..., KafkaAdapter],
) -> None:
    # librdkafka clients of earlier tests of this process may still be alive (their
    # adapters closed, the clients not yet collected): count this adapter's only
    clients_before = _librdkafka_threads()["clients"]
    adapter = make_kafka(namespaces={NS: "plant"})
    before = threading.active_count()
    collectors = [Collector() for _ in range(2000)]

    def create(i: int) -> SubscriptionHandle:
        spec = SubscriptionSpec(f"many-{i}", (PathPattern(NS, ("fan", f"f{i % 10}")),))
        handle = adapter.subscription(spec)
        handle.start(collectors[i], prefetch=10)
        return handle

    started = time.monotonic()
    with ThreadPoolExecutor(16) as pool:  # as HTTP workers would
        handles = list(pool.map(create, range(2000)))
    print(f"\n2000 subscriptions created in {time.monotonic() - started:.1f}s")
    adapter.publish_many([message(Topic(NS, ("fan", f"f{k}")), b"<%d/>" % k) for k in range(10)])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(len(c.received) < 1 for c in collectors):
        time.sleep(0.1)
    assert all(len(c.received) == 1 for c in collectors)
    stats = adapter.stats()
    assert stats["cursors"] == 2000
    # the engine's threads are fixed; librdkafka clients: producer, admin, head,
    # catch-up readers (4), current-message reader
    assert stats["threads"] <= 8
    assert threading.active_count() - before <= 10
    clients = _librdkafka_threads()
    print(f"2000 subscriptions: {threading.active_count()} Python threads, {clients}")
    assert clients["clients"] - clients_before <= 12
    for handle in handles:
        handle.delete()


def _librdkafka_threads() -> dict[str, int]:
    """librdkafka clients and threads of this process (from /proc: rdk:main per client)."""
    import os

    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            continue
    rdk = [n for n in names if n.startswith("rdk:")]
    return {"clients": rdk.count("rdk:main"), "threads": len(rdk), "all": len(names)}


def test_secrets_stay_out_of_repr_and_logs(
    kafka_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    host = kafka_url.removeprefix("kafka://")
    url = f"kafka://gw:hunter2@{host}?security.protocol=PLAINTEXT"
    adapter = KafkaAdapter(url, {**isolated_options(), "config": {"ssl.key.password": "k3y"}})
    assert "hunter2" not in repr(adapter) and "k3y" not in repr(adapter)
    with caplog.at_level(logging.DEBUG, logger="wsnmom"):
        adapter.open()
        adapter.publish(message(Topic(NS, ("x",)), b"<x/>"))
        adapter.close()
    assert "hunter2" not in caplog.text and "k3y" not in caplog.text


def test_exact_watermarks_start_a_new_subscription_at_the_end(
    make_kafka: Callable[..., KafkaAdapter],
) -> None:
    """With ``exact_watermarks`` (Apache Kafka) a new subscription starts at the end the
    cluster reports.  One record per batch here, where tansu's watermark is exact too."""
    adapter = make_kafka(namespaces={NS: "plant"}, exact_watermarks=True)
    topic = Topic(NS, ("meter", "m1"))
    for i in range(3):
        adapter.publish(message(topic, b"<old%d/>" % i))
    got = subscribe(adapter, PathPattern(NS, ("meter", ANY)))
    adapter.publish(message(topic, b"<new/>"))
    assert [m.body for m in got.wait_for(1, 10)] == [b"<new/>"]
    adapter.publish(message(topic, b"<sentinel/>"))  # the barrier: nothing more before it
    got.wait_for(2, 10)
    assert got.bodies() == [b"<new/>", b"<sentinel/>"]


def test_records_deleted_before_a_paused_subscription_read_them_are_counted(
    make_kafka: Callable[..., KafkaAdapter],
    kafka_bootstrap: str,
    kafka_broker: ResolvedBroker,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A paused subscription whose records were deleted (DeleteRecords moves the log start
    the way retention does) is told on resume: ``lost()`` counts them and a warning names
    the subscription.  tansu cannot delete records: skipped there, runs on a real cluster
    (``WSNMOM_TEST_KAFKA_BOOTSTRAP``); the same logbase cursor code is proven on every
    machine through the file-log adapter (tests/adapters/test_logbase_engine.py,
    tests/e2e/test_retention_losses.py)."""
    from confluent_kafka.admin import AdminClient

    adapter = make_kafka(namespaces={NS: "plant"})
    topic = Topic(NS, ("silo", "s1"))
    adapter.publish(message(topic, b"<first/>"))  # the topic exists
    name = f"lost-{uuid.uuid4().hex[:6]}"
    handle = adapter.subscription(SubscriptionSpec(name, (PathPattern(NS, ("silo", ANY)),)))
    handle.start(Collector(), prefetch=100)
    handle.stop()  # paused: its position is where the log ended
    adapter.publish_many([message(topic, b"<m%d/>" % i) for i in range(6)])
    log_name = f"{adapter.settings.topic_prefix}.plant.silo.s1"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    end = TopicPartition(log_name, 0, 1 + 4)  # deletes <first/> and <m0/>..<m3/>
    delete_records_or_skip(admin, end, kafka_broker)
    got = Collector()
    with caplog.at_level(logging.WARNING, logger="wsnmom"):
        handle.start(got, prefetch=100)
        assert got.wait_for(2, 10) and got.bodies() == [b"<m4/>", b"<m5/>"]
    assert handle.lost() == 4
    assert f"subscription {name}: 4 message(s)" in caplog.text


def test_a_batch_remembers_the_last_message_per_topic_once(
    make_kafka: Callable[..., KafkaAdapter],
) -> None:
    adapter = make_kafka(namespaces={NS: "plant"})
    publisher = adapter._require().publisher
    remember = publisher._confirmed
    assert remember is not None
    remembered: list[bytes] = []

    def spy(dest: Any, msg: OutboundMessage, *report: int) -> None:
        remembered.append(msg.body)
        remember(dest, msg, *report)

    publisher._confirmed = spy
    a, b = Topic(NS, ("a",)), Topic(NS, ("b",))
    adapter.publish_many([message(a if i % 2 else b, b"<m%d/>" % i) for i in range(100)])
    assert sorted(remembered) == [b"<m98/>", b"<m99/>"]
    got_a, got_b = adapter.current_message(a), adapter.current_message(b)
    assert got_a is not None and got_a.body == b"<m99/>"
    assert got_b is not None and got_b.body == b"<m98/>"
