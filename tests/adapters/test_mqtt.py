"""The MQTT adapter against a real Mosquitto, beyond the conformance kit: filters that
overlap (within one subscription, across subscriptions, and while they change under a
running stream), several gateway instances on one broker, 2,000 subscriptions on a
bounded number of threads, native retained messages, the RETAIN flag on arrival, and
the broker going away and coming back."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.importorskip("paho.mqtt")

from wsnmom.adapters.mqtt.adapter import MqttAdapter
from wsnmom.core.adapter import (
    AdapterUnavailable,
    OutboundMessage,
    PublishFailed,
    QueueLimits,
    Received,
    SubscriptionHandle,
    SubscriptionSpec,
)
from wsnmom.topic_mapping.model import ANY, DEEP, PathPattern, Segment, Topic

from tests.fixtures.mosquitto import MosquittoNode, close_client, native_client
from tests.support.mqtt_adapters import mqtt_adapters
from tests.support.waiting import wait_until
from wsnmom.testing.conformance import Collector

pytestmark = pytest.mark.mqtt

NS = "urn:test:mqtt"


@pytest.fixture
def make(mqtt_url: str, tmp_path: Path) -> Iterator[Callable[..., MqttAdapter]]:
    """Open MQTT adapters (each on its own data directory unless ``data_dir`` is given;
    the test's namespace has one topic prefix of its own)."""
    with mqtt_adapters(tmp_path, NS, mqtt_url, session_expiry=300) as open_adapter:
        yield open_adapter


def topic(path: str) -> Topic:
    return Topic(NS, tuple(path.split("/")))


def pattern(*segments: Segment) -> PathPattern:
    return PathPattern(NS, tuple(segments))


def message(path: str, body: bytes) -> OutboundMessage:
    return OutboundMessage(topic=topic(path), body=body, message_id=uuid.uuid4().hex)


def subscribe(
    adapter: MqttAdapter, *patterns: PathPattern, name: str | None = None
) -> SubscriptionHandle:
    spec = SubscriptionSpec(name or uuid.uuid4().hex, tuple(patterns), QueueLimits())
    return adapter.subscription(spec)


SENTINEL = b"<sentinel/>"


def until_sentinel(
    handle: SubscriptionHandle,
    sentinels: int = 1,
    timeout: float = 10.0,
    *,
    sentinel: bytes = SENTINEL,
) -> list[Received]:
    """Pull (and ack) until ``sentinels`` messages whose body is ``sentinel`` arrived,
    published after what the test checks (the barrier, docs/testing.md); returns the
    others, in order of arrival."""
    got: list[Received] = []

    def arrived() -> bool:
        got.extend(handle.pull(1000, timeout=0.2))
        return sum(m.body == sentinel for m in got) >= sentinels

    wait_until(arrived, timeout, what=f"{sentinels} x {sentinel!r}")
    for m in got:
        m.ack()
    return [m for m in got if m.body != sentinel]


def acknowledged_at_the_broker(adapter: MqttAdapter) -> None:
    """Return once the broker has taken the session's PUBACKs of everything stored so far.

    A restart of the broker before it read them sends those messages again (at least
    once), and the queues would get them twice.  The worker stores a batch, runs the
    barriers whose sentinels came in it, and only then queues the batch's PUBACKs: the
    first barrier's sentinel, published after the test saw the batch stored, arrives in a
    later batch, so when it completes the PUBACKs are queued; the second sentinel goes out
    behind them on the same connection, and the broker answers it after reading them."""
    node = adapter._node  # the session's barriers
    assert node is not None
    node.session.at_barrier(lambda: None)
    node.session.at_barrier(lambda: None)


# -- overlapping filters ------------------------------------------------------------------


def test_overlapping_filters_of_one_and_of_several_subscriptions_deliver_once(
    make: Callable[..., MqttAdapter],
) -> None:
    adapter = make()
    union = subscribe(adapter, pattern("a", ANY, "c"), pattern("a", "b", ANY), pattern("a", DEEP))
    first = subscribe(adapter, pattern("a", ANY, "c"))
    second = subscribe(adapter, pattern("a", "b", ANY))
    adapter.publish_many([message("a/b/c", b"1"), message("a/x/c", b"2"), message("a/b/y", b"3")])
    adapter.publish(message("a/b/c", SENTINEL))  # every filter lets it through
    assert sorted(m.body for m in until_sentinel(union)) == [b"1", b"2", b"3"]
    assert sorted(m.body for m in until_sentinel(first)) == [b"1", b"2"]
    assert sorted(m.body for m in until_sentinel(second)) == [b"1", b"3"]
    # the session holds one filter for all of them (a/# covers every one)
    assert adapter.stats()["filters"] == 1


#: messages the stream of the next test may be ahead of what its subscription received
_STREAM_AHEAD = 200


def test_a_stream_survives_filters_changing_around_it(
    make: Callable[..., MqttAdapter], mqtt_url: str
) -> None:
    """A subscription on ``s/x`` gets every message of a stream exactly once while other
    subscriptions with filters that cover, join or release its own come and go.

    The stream keeps at most :data:`_STREAM_AHEAD` messages ahead of what the subscription
    received: while filters overlap the broker sends the session a copy per filter, and a
    publisher that outran the session's ingest (a loaded process: measured 260 arrivals/s)
    grew a backlog that every Subscribe's barrier waits behind (10 s and more)."""
    adapter = make()
    steady = subscribe(adapter, pattern("s", "x"))
    got = Collector()
    steady.start(got, prefetch=500)
    stop = threading.Event()
    sent: list[bytes] = []
    failed: list[BaseException] = []

    def publish() -> None:
        i = 0
        try:
            while not stop.is_set():
                got.wait_for(len(sent) - _STREAM_AHEAD, 30)  # a steady stream, not a flood
                batch = [message("s/x", b"%d" % (i + k)) for k in range(20)]
                adapter.publish_many(batch)
                sent.extend(m.body for m in batch)
                i += 20
                time.sleep(0.005)
        except BaseException as exc:
            failed.append(exc)

    publisher = threading.Thread(target=publish)
    publisher.start()
    try:
        for _ in range(6):
            wide = subscribe(adapter, pattern("s", DEEP))
            join = subscribe(adapter, pattern(ANY, "x"))
            time.sleep(0.05)
            wide.delete()
            time.sleep(0.05)
            join.delete()
            time.sleep(0.05)
    finally:
        stop.set()
        publisher.join(30)
    assert not failed, failed
    adapter.publish(message("s/x", SENTINEL))  # the barrier: after the whole stream
    wait_until(lambda: SENTINEL in got.bodies(), 15, what="the sentinel after the stream")
    steady.stop()
    counts = Counter(b for b in got.bodies() if b != SENTINEL)
    assert set(counts) == set(sent), f"{len(set(sent) - set(counts))} of {len(sent)} missing"
    duplicates = {k: n for k, n in counts.items() if n > 1}
    assert not duplicates, f"{len(duplicates)} delivered twice"
    assert adapter.stats()["filters"] == 1


# -- several gateway instances ----------------------------------------------------------


def test_two_gateway_instances_on_one_broker_deliver_once_each(
    make: Callable[..., MqttAdapter],
) -> None:
    a = make()
    b = make()
    assert a.stats()["client_id"] != b.stats()["client_id"]
    on_a = subscribe(a, pattern("news"))
    on_b = subscribe(b, pattern("news"))
    a.publish(message("news", b"from-a"))
    b.publish(message("news", b"from-b"))
    a.publish(message("news", SENTINEL))  # one sentinel after each instance's message
    b.publish(message("news", SENTINEL))
    assert sorted(m.body for m in until_sentinel(on_a, 2)) == [b"from-a", b"from-b"]
    assert sorted(m.body for m in until_sentinel(on_b, 2)) == [b"from-a", b"from-b"]


# -- scale --------------------------------------------------------------------------------


def test_two_thousand_subscriptions_on_a_bounded_number_of_threads(
    make: Callable[..., MqttAdapter],
) -> None:
    before = threading.active_count()
    adapter = make()
    opened = threading.active_count() - before
    handles = [subscribe(adapter, pattern("dev", f"d{i}", "temp")) for i in range(2_000)]
    wide = subscribe(adapter, pattern("dev", ANY, "temp"))
    collectors = []
    for h in handles[:50]:
        c = Collector()
        h.start(c, prefetch=10)
        collectors.append(c)
    assert threading.active_count() - before <= opened + 1  # + the queues' dispatcher
    assert threading.active_count() - before <= 6
    adapter.publish_many([message(f"dev/d{i}/temp", b"%d" % i) for i in range(2_000)])
    for i, c in enumerate(collectors):
        assert [m.body for m in c.wait_for(1, 10)] == [b"%d" % i]
    adapter.publish(message("dev/sentinel/temp", SENTINEL))  # only the wide one's
    assert len(until_sentinel(wide, timeout=30)) == 2_000
    assert adapter.stats()["filters"] == 1  # dev/+/temp covers the 2,000 others
    wide.delete()
    assert adapter.stats()["filters"] == 2_000
    for h in handles:
        h.stop()


# -- retained messages ----------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_current_message_is_the_retained_one_also_from_a_native_client(
    make: Callable[..., MqttAdapter], mqtt_url: str, protocol: str
) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    adapter = make(namespaces={NS: prefix}, protocol=protocol)
    assert adapter.current_message(topic("door")) is None
    handle = subscribe(adapter, pattern("door"))
    native = native_client(mqtt_url)
    try:
        native.publish(f"{prefix}/door", b'{"open": true}', qos=1, retain=True).wait_for_publish(5)
        current = adapter.current_message(topic("door"))
        assert current is not None and current.body == b'{"open": true}'
        assert current.content_type == "application/json"
        # the native message is a notification for the subscriber, once
        # a new subscription does not get the retained message as a notification: the
        # barrier is the next message, which both get
        late = subscribe(adapter, pattern("door"))
        adapter.publish(message("door", b"<closed/>"))
        assert [m.body for m in until_sentinel(handle, sentinel=b"<closed/>")] == [
            b'{"open": true}'
        ]
        assert until_sentinel(late, sentinel=b"<closed/>") == []
        current = adapter.current_message(topic("door"))
        assert current is not None and current.body == b"<closed/>"
    finally:
        close_client(native)


# -- outages ------------------------------------------------------------------------------


def test_broker_down_fails_fast_and_everything_resumes_after_a_restart(
    make: Callable[..., MqttAdapter], mosquitto_factory: Callable[..., MosquittoNode]
) -> None:
    node = mosquitto_factory()
    adapter = make(node.url, reconnect_max_delay=0.5)
    handle = subscribe(adapter, pattern("o"))
    adapter.publish(message("o", b"before"))
    adapter.publish(message("o", SENTINEL))
    assert [m.body for m in until_sentinel(handle)] == [b"before"]
    acknowledged_at_the_broker(adapter)
    node.stop()
    deadline = time.monotonic() + 5
    while adapter.available() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not adapter.available()
    started = time.monotonic()
    with pytest.raises(AdapterUnavailable):
        adapter.publish(message("o", b"lost"))
    with pytest.raises(AdapterUnavailable):
        subscribe(adapter, pattern("new"))
    # at once: not after the publish's timeout (10 s)
    assert time.monotonic() - started < 5.0
    node.start()
    deadline = time.monotonic() + 10
    while not adapter.available() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert adapter.available()
    adapter.publish(message("o", b"after"))
    fresh = subscribe(adapter, pattern("new"))
    adapter.publish(message("new", b"fresh"))
    adapter.publish_many([message("o", SENTINEL), message("new", SENTINEL)])
    assert [m.body for m in until_sentinel(handle)] == [b"after"]
    assert [m.body for m in until_sentinel(fresh)] == [b"fresh"]


def test_offline_session_keeps_messages_across_a_broker_restart(
    make: Callable[..., MqttAdapter],
    mosquitto_factory: Callable[..., MosquittoNode],
    tmp_path: Path,
) -> None:
    """Messages published while the gateway is away wait in its session at the broker,
    beyond Mosquitto's default limit of 1,000, across a graceful broker restart."""
    node = mosquitto_factory()
    data_dir = str(tmp_path / "gateway")
    gateway = make(node.url, data_dir=data_dir)
    subscribe(gateway, pattern("away"), name="kept")
    gateway.close()
    publisher = make(node.url)
    publisher.publish_many([message("away", b"%d" % i) for i in range(1_500)])
    publisher.publish(message("away", SENTINEL))
    publisher.close()
    node.restart()
    again = make(node.url, data_dir=data_dir)
    handle = subscribe(again, pattern("away"), name="kept")
    got = until_sentinel(handle, timeout=30)
    assert [m.body for m in got] == [b"%d" % i for i in range(1_500)]


def test_a_message_larger_than_allowed_is_refused(make: Callable[..., MqttAdapter]) -> None:
    adapter = make(max_message_bytes=100)
    assert adapter.capabilities.max_message_bytes == 100
    with pytest.raises(PublishFailed, match="max_message_bytes"):
        adapter.publish(message("big", b"x" * 101))
    adapter.publish(message("big", b"x" * 100))


# -- Spark buffer logs (taps) -------------------------------------------------------------


def test_spark_logs_are_fed_by_the_gateway_session(
    make: Callable[..., MqttAdapter], mqtt_url: str, tmp_path: Path
) -> None:
    from wsnmom.spark_bridge.log import NotificationLog

    prefix = f"t{uuid.uuid4().hex[:8]}"
    path = tmp_path / "spark.sqlite"
    tap = {"path": str(path), "topic": "p:a//c", "namespaces": {"p": NS}}
    adapter = make(namespaces={NS: prefix}, spark_logs={"plant": tap})
    handle = subscribe(adapter, pattern("a", DEEP))
    adapter.publish(message("a/x/c", b"<c/>"))
    adapter.publish(message("a/x/d", b"<d/>"))  # the subscription's, not the log's
    native = native_client(mqtt_url, "3.1.1")
    try:
        native.publish(f"{prefix}/a/y/z/c", b'{"n": 1}', qos=1).wait_for_publish(5)
    finally:
        close_client(native)
    adapter.publish(message("a/s/c", SENTINEL))  # the barrier: nothing more before it
    assert len(until_sentinel(handle)) == 3
    log = NotificationLog(path, create=False)
    wait_until(lambda: len(log) >= 3, what="3 records in the log")
    entries = [(name, body) for _, name, body in log.entries()]
    assert entries == [
        (f"{prefix}/a/x/c", b"<c/>"),
        (f"{prefix}/a/y/z/c", b'{"n": 1}'),
        (f"{prefix}/a/s/c", b"<sentinel/>"),
    ]
    assert log.name == "plant" and log.middleware == "mqtt"
    # counted once the sink returned, a moment after its records became visible (a
    # fresh-clone run read 2 here once)
    wait_until(lambda: adapter.stats()["tapped"] >= 3, what="the taps' count")
    assert adapter.stats()["tapped"] == 3


def test_a_bad_spark_logs_option_is_refused_at_once(tmp_path: Path) -> None:
    from wsnmom.core.adapter import AdapterError

    for bad in ({"x": {"topic": "q:a"}}, {"x": {"path": "p", "topic": "q:a"}}, {"x": "p"}):
        with pytest.raises(AdapterError, match="spark_logs"):
            MqttAdapter("mqtt://127.0.0.1:1", {"data_dir": str(tmp_path), "spark_logs": bad})


# -- dead letters ---------------------------------------------------------------------------


def test_dead_letters_left_in_the_outbox_by_a_crash_reach_the_broker_on_open(
    make: Callable[..., MqttAdapter], tmp_path: Path
) -> None:
    """What a queue limit dropped waits in the queue store's outbox until the broker
    confirmed it: one written by a process that stopped before publishing it is published
    by the next one, and read back by the dead-letter box through the session."""
    from wsnmom.adapters.embedded.store import Engine
    from wsnmom.core.adapter import HEADER_DROPPED_REASON, INTERNAL_NAMESPACE_PREFIX

    data_dir = str(tmp_path / "crashed")
    grave = Topic(INTERNAL_NAMESPACE_PREFIX + "dead-letters", (f"d{uuid.uuid4().hex[:8]}",))
    adapter = make(data_dir=data_dir)
    box_spec = SubscriptionSpec("box", (PathPattern(grave.namespace, grave.path),))
    adapter.subscription(box_spec)
    bounded = SubscriptionSpec("sub", (pattern("o"),), QueueLimits(max_messages=1), grave)
    adapter.subscription(bounded)
    adapter.close()
    # the drop of a process that stopped before its outbox was sent
    engine = Engine(
        str(Path(data_dir) / "mqtt" / "queues"), keep_current=False, outbox=grave.__eq__
    )
    try:
        engine.publish_many([message("o", b"kept-1"), message("o", b"kept-2")])
        assert [m.body for _, m in engine.outbox_batch(10)] == [b"kept-1"]
    finally:
        engine.close()
    adapter = make(data_dir=data_dir)
    box = adapter.subscription(box_spec)
    [letter] = wait_until(lambda: box.pull(10), 30, what="the dead letter via the broker")
    assert letter.body == b"kept-1" and letter.headers[HEADER_DROPPED_REASON] == "overflow"
    node = adapter._require()
    wait_until(lambda: not node.engine.outbox_batch(1), 10, what="the outbox emptied")
