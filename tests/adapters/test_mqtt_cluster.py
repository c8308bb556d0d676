"""MQTT in cluster mode, adapter level, on the session's Mosquitto: two adapters in cluster
mode (two "instances": their own data directories, one topic prefix) on one broker,
where every durable subscription is a persistent session of its own (docs/scale-out.md,
"MQTT in cluster mode").  ``may`` plays core's lease fence (``may_save``)."""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from wsnmom.adapters.mqtt.adapter import MqttAdapter
from wsnmom.adapters.mqtt.cluster_handle import ClusterHandle
from wsnmom.adapters.mqtt.cluster_sessions import Record
from wsnmom.core.adapter import (
    OutboundMessage,
    QueueLimits,
    Received,
    SpecOrigin,
    SubscriptionSpec,
)
from wsnmom.core.adapter_options import AdapterOptionError
from wsnmom.core.codec import pull_point_inbox
from wsnmom.core.dead_letter_records import box_name, destination_topic
from wsnmom.core.pull_points import inbox_pattern
from wsnmom.topic_mapping.model import PathPattern, Topic

from tests.support.waiting import wait_until

pytestmark = pytest.mark.mqtt

NS = "urn:test:mqtt-cluster"
SENTINEL = b"<sentinel/>"


class Instance:
    """One adapter in cluster mode and its fence (``may``: name -> delivers)."""

    def __init__(self, url: str, data_dir: Path, prefix: str, **options: object) -> None:
        """``options``: more adapter options (``reconnect_max_delay``)."""
        self.may: dict[str, bool] = {}
        self.adapter = MqttAdapter(
            url,
            {
                "data_dir": str(data_dir),
                "namespaces": {NS: "ns"},
                "topic_prefix": prefix,
                "session_expiry": 600,
                "reconnect_min_delay": 0.1,
                **options,
            },
        )
        self.adapter.shared_by_instances(lambda name: self.may.get(name, True))
        self.adapter.open()

    def handle(self, name: str, path: str = "a", origin: SpecOrigin = "") -> ClusterHandle:
        pattern = PathPattern(NS, tuple(path.split("/")))
        spec = SubscriptionSpec(name, (pattern,), QueueLimits(), origin=origin)
        handle = self.adapter.subscription(spec)
        assert isinstance(handle, ClusterHandle)
        return handle

    def publish(self, *bodies: bytes, path: str = "a") -> None:
        topic = Topic(NS, tuple(path.split("/")))
        self.adapter.publish_many(
            [OutboundMessage(topic=topic, body=b, message_id=uuid.uuid4().hex) for b in bodies]
        )


class Collector:
    """A consumer: keeps what arrives; acks at once unless ``hold``, before it keeps the
    message, so that a message a test sees in ``got`` was acknowledged (a ``stop`` the
    test makes once it saw it cannot come before the ack)."""

    def __init__(self, hold: bool = False) -> None:
        self.hold = hold
        self.got: list[Received] = []
        self.lock = threading.Lock()

    def __call__(self, received: Received) -> None:
        if not self.hold:
            received.ack()
        with self.lock:
            self.got.append(received)

    def bodies(self) -> list[bytes]:
        with self.lock:
            return [r.body for r in self.got]

    def has(self, body: bytes) -> bool:
        return body in self.bodies()


@pytest.fixture
def cluster(mqtt_url: str, tmp_path: Path) -> Iterator[Callable[[], Instance]]:
    prefix = f"c{uuid.uuid4().hex[:8]}"
    made: list[Instance] = []

    def make() -> Instance:
        inst = Instance(mqtt_url, tmp_path / f"i{len(made)}", prefix)
        made.append(inst)
        return inst

    yield make
    for inst in reversed(made):
        inst.adapter.close()


def session_present(url: str, client_id: str, expiry: int = 0) -> bool:
    """Whether the broker holds ``client_id``'s session (connect with clean start false
    and session expiry ``expiry``: 0 leaves nothing behind, more keeps the session)."""
    host, port = url.removeprefix("mqtt://").rsplit(":", 1)
    client = mqtt.Client(
        callback_api_version=CallbackAPIVersion.VERSION2,
        client_id=client_id,
        protocol=mqtt.MQTTv5,
        manual_ack=True,  # what the session sends it meanwhile stays unacknowledged
    )
    flags: list[bool] = []
    done = threading.Event()

    def on_connect(c: Any, u: Any, f: Any, reason: Any, props: Any) -> None:
        flags.append(bool(f.session_present))
        done.set()

    client.on_connect = on_connect
    props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
    props.SessionExpiryInterval = expiry
    client.connect(host, int(port), clean_start=False, properties=props)
    client.loop_start()
    try:
        assert done.wait(10), "no CONNACK"
    finally:
        client.disconnect()
        client.loop_stop()
    return flags[0]


def test_declared_through_a_consumed_through_b_gets_everything_after_the_declare(
    cluster: Callable[[], Instance],
) -> None:
    a, b = cluster(), cluster()
    a.handle("s1")  # the Subscribe's instance declares the session and does not consume
    bodies = [b"m%d" % i for i in range(30)]
    a.publish(*bodies)
    consumer = Collector()
    b.handle("s1").start(consumer, prefetch=8)
    b.publish(SENTINEL)
    wait_until(lambda: consumer.has(SENTINEL), 20, what="the sentinel through B")
    assert consumer.bodies() == [*bodies, SENTINEL]
    # B's own declare (its re-attach) took at most one message (Receive Maximum 1) and
    # gave it back unacknowledged: it comes with DUP
    assert sum(r.redelivered for r in consumer.got) <= 1


def test_a_new_subscription_is_declared_without_reading_a_record_and_keeps_what_follows(
    cluster: Callable[[], Instance],
) -> None:
    """A Subscribe's new subscription (``origin`` "new"): no record is read (there can be
    none); its session is made with its filters all the same, so what is published once
    ``subscription`` returned waits for its deliverer, and its record names it (another
    instance's re-attach finds it and connects nothing)."""
    a, b = cluster(), cluster()
    sessions = a.adapter._require_cluster().sessions
    reads: list[str] = []
    read = sessions.read_record

    def counted(client_id: str) -> Record | None:
        reads.append(client_id)
        return read(client_id)

    sessions.read_record = counted  # type: ignore[method-assign]
    a.handle("fresh", origin="new")
    assert reads == []
    bodies = [b"n%d" % i for i in range(5)]
    a.publish(*bodies)
    assert sessions.recorded(sessions.client_id("fresh")) is not None
    consumer = Collector()
    b.handle("fresh").start(consumer, prefetch=8)
    b.publish(SENTINEL)
    wait_until(lambda: consumer.has(SENTINEL), 20, what="the sentinel through B")
    assert consumer.bodies() == [*bodies, SENTINEL]


def test_a_takeover_cuts_b_off_and_a_gets_bs_unacknowledged_messages_first_in_order(
    cluster: Callable[[], Instance],
) -> None:
    a, b = cluster(), cluster()
    held = Collector(hold=True)
    hb = b.handle("s2")
    hb.start(held, prefetch=10)
    first = [b"f%d" % i for i in range(25)]
    a.publish(*first)
    # B holds its window (Receive Maximum 10) unacknowledged
    wait_until(lambda: len(held.got) == 10, 20, what="B's window full")
    # the lease moves to A: B is no longer allowed to deliver (core's fence)
    b.may["s2"] = False
    consumer = Collector()
    a.handle("s2").start(consumer, prefetch=10)
    wait_until(lambda: hb.fenced >= 1, 20, what="B cut off and not reconnecting")
    a.publish(SENTINEL)
    wait_until(lambda: consumer.has(SENTINEL), 20, what="the sentinel through A")
    # everything, in order; what came again is exactly what B held (the duplicate bound:
    # B's Receive Maximum)
    assert consumer.bodies() == [*first, SENTINEL]
    again = [r.body for r in consumer.got if r.redelivered]
    assert again == first[:10]
    # B (a zombie: its reconnect was refused by the fence) received nothing more
    assert held.bodies() == first[:10]
    assert not hb.connected
    # B's late acknowledgements belong to its lost connection: they change nothing
    for r in held.got:
        r.ack()
    a.publish(b"after")
    wait_until(lambda: consumer.has(b"after"), 20, what="the next message through A")
    assert consumer.bodies() == [*first, SENTINEL, b"after"]


def test_a_re_attach_through_another_instance_does_not_disturb_the_deliverer(
    cluster: Callable[[], Instance],
) -> None:
    """Core re-attaches every subscription on every instance (at start, when following):
    the session's record says it exists with those filters, so nothing connects."""
    a, b = cluster(), cluster()
    consumer = Collector()
    hb = b.handle("s3")
    hb.start(consumer, prefetch=4)
    a.handle("s3")
    a.publish(*[b"x%d" % i for i in range(10)], SENTINEL)
    wait_until(lambda: consumer.has(SENTINEL), 20, what="the sentinel through B")
    assert consumer.bodies() == [*[b"x%d" % i for i in range(10)], SENTINEL]
    assert hb.await_connection(20) and hb.connections == 1  # installed at the SUBACK


def test_a_deliverer_still_holding_the_lease_reconnects_after_being_cut_off(
    cluster: Callable[[], Instance], mqtt_url: str
) -> None:
    a, b = cluster(), cluster()
    consumer = Collector()
    hb = b.handle("s8")
    hb.start(consumer, prefetch=4)
    a.publish(*[b"y%d" % i for i in range(10)])
    # another connection with the client id (as a declare of changed filters does)
    assert session_present(mqtt_url, hb.client_id, expiry=600)
    wait_until(lambda: hb.connections >= 2 and hb.connected, 20, what="B back")
    a.publish(SENTINEL)
    wait_until(lambda: consumer.has(SENTINEL), 20, what="the sentinel through B")
    unique = list(dict.fromkeys(consumer.bodies()))
    assert unique == [*[b"y%d" % i for i in range(10)], SENTINEL]


def test_delete_through_a_while_b_consumes_leaves_no_session(
    cluster: Callable[[], Instance], mqtt_url: str
) -> None:
    a, b = cluster(), cluster()
    consumer = Collector()
    hb = b.handle("s4")
    hb.start(consumer, prefetch=4)
    a.publish(b"one")
    wait_until(lambda: consumer.has(b"one"), 20, what="a delivery through B")
    a.adapter.delete_subscription("s4")
    # B is cut off and reconnects (it still holds the lease, core has not followed the
    # Unsubscribe), finds no session and ends the empty one its CONNECT made; its restart
    # finds the session's record gone and does not make the session again
    wait_until(lambda: hb.sessions_lost == 1, 20, what="B finding the session gone")
    wait_until(lambda: hb.unrecorded >= 1, 20, what="B's restart finding no record")
    assert not session_present(mqtt_url, hb.client_id)
    assert not hb.connected
    hb.stop()  # core follows the Unsubscribe


def test_stop_keeps_messages_and_start_delivers_them(cluster: Callable[[], Instance]) -> None:
    a = cluster()
    consumer = Collector()
    h = a.handle("s5")
    h.start(consumer)
    a.publish(b"before")
    wait_until(lambda: consumer.has(b"before"), 20, what="the first message")
    h.stop()
    a.publish(b"p1", b"p2", b"p3")
    h.start(consumer)
    a.publish(SENTINEL)
    wait_until(lambda: consumer.has(SENTINEL), 20, what="the sentinel")
    assert consumer.bodies() == [b"before", b"p1", b"p2", b"p3", SENTINEL]


def test_a_nack_requeues_that_message_and_the_later_ones_in_order(
    cluster: Callable[[], Instance],
) -> None:
    a = cluster()
    acked: list[bytes] = []
    nacked: list[bytes] = []

    def consumer(r: Received) -> None:
        if r.body == b"n3" and not nacked:
            nacked.append(r.body)
            r.nack(requeue=True)
            return
        acked.append(r.body)
        r.ack()

    h = a.handle("s6")
    h.start(consumer, prefetch=1)
    bodies = [b"n%d" % i for i in range(8)]
    a.publish(*bodies)
    wait_until(lambda: b"n7" in acked, 20, what="the last message")
    assert nacked == [b"n3"]
    assert acked == bodies  # n3 came again, then the rest, in order
    assert h.connections >= 2


def test_messages_the_patterns_reject_are_acknowledged_and_not_handed_out(
    cluster: Callable[[], Instance],
) -> None:
    a = cluster()
    consumer = Collector()
    spec = SubscriptionSpec("s7", (PathPattern(NS, ("a", "b")),), QueueLimits())
    assert a.adapter._cnode is not None
    sessions = a.adapter._cnode.sessions
    h = ClusterHandle(sessions, spec)
    # a filter wider than the patterns, as a widened filter brings: the handle decides
    (exact,) = h.filters
    h.filters = frozenset({exact.rsplit("/", 1)[0] + "/#"})
    sessions.declare(h.client_id, h.filters, 10)
    h.start(consumer)
    a.publish(b"other", path="a/c")
    a.publish(b"mine", path="a/b")
    wait_until(lambda: consumer.has(b"mine"), 20, what="the matching message")
    assert consumer.bodies() == [b"mine"]


def test_a_pull_point_inbox_goes_through_the_broker(cluster: Callable[[], Instance]) -> None:
    a, b = cluster(), cluster()
    spec = SubscriptionSpec("pp1", (inbox_pattern("pp1"),), QueueLimits())
    h = a.adapter.subscription(spec)
    inbox = pull_point_inbox("pp1")
    # a Notify to the pull point through the other instance
    b.adapter.publish(OutboundMessage(topic=inbox, body=b"to-pp", message_id="m1"))
    consumer = Collector()
    h.start(consumer)
    wait_until(lambda: consumer.has(b"to-pp"), 20, what="the inbox message")
    assert consumer.got[0].topic == inbox
    assert not a.adapter.capabilities.native_pull
    assert not a.adapter.capabilities.local_queues
    # never retained: a new subscription of the inbox gets nothing old
    assert a.adapter.current_message(inbox) is None


def test_cluster_mode_refuses_mqtt_3_1_1_and_spark_taps(mqtt_url: str, tmp_path: Path) -> None:
    old = MqttAdapter(mqtt_url, {"data_dir": str(tmp_path / "x"), "protocol": "3.1.1"})
    with pytest.raises(AdapterOptionError, match="only with MQTT 5"):
        old.shared_by_instances(lambda name: True)
    assert old.capabilities.local_queues  # still a single instance's adapter


def test_a_slow_consumer_never_holds_more_than_its_prefetch(
    cluster: Callable[[], Instance],
) -> None:
    """Mosquitto 2.0.11 sends a session more unacknowledged messages than its Receive
    Maximum once PUBACKs flow (eclipse-mosquitto/mosquitto#2301); the connection holds
    the excess back, so core never has more than its prefetch unsettled, in order."""
    a = cluster()
    prefetch = 4
    pending: queue.SimpleQueue[Received] = queue.SimpleQueue()
    seen: list[bytes] = []
    lock = threading.Lock()
    unsettled = [0, 0]  # now, most

    def consumer(r: Received) -> None:
        with lock:
            seen.append(r.body)
            unsettled[0] += 1
            unsettled[1] = max(unsettled[1], unsettled[0])
        pending.put(r)

    def settle() -> None:
        while True:
            r = pending.get()
            if r is None:
                return
            time.sleep(0.002)
            with lock:
                unsettled[0] -= 1
            r.ack()

    worker = threading.Thread(target=settle, daemon=True)
    worker.start()
    h = a.handle("s9")
    bodies = [b"%d" % i for i in range(300)]
    a.publish(*bodies)
    h.start(consumer, prefetch=prefetch)
    try:
        wait_until(lambda: len(seen) == len(bodies), 60, what="every message")
    finally:
        pending.put(None)  # type: ignore[arg-type]
        worker.join(10)
    assert seen == bodies
    assert unsettled[1] <= prefetch
    conn = h._conn
    assert conn is not None
    print(f"received and not acknowledged at most: {conn.peak_unacknowledged}")


def test_cluster_mode_chosen_after_open_ends_the_single_instance_session(
    mqtt_url: str, tmp_path: Path
) -> None:
    """``wsnmom serve`` opens the middleware before core says the store is shared."""
    adapter = MqttAdapter(
        mqtt_url, {"data_dir": str(tmp_path / "late"), "topic_prefix": f"l{uuid.uuid4().hex[:8]}"}
    )
    adapter.open()
    try:
        single = adapter.stats()["client_id"]
        assert adapter.capabilities.local_queues
        adapter.shared_by_instances(lambda name: True)
        assert not adapter.capabilities.local_queues
        assert adapter.stats()["cluster"]
        assert not session_present(mqtt_url, single)
    finally:
        adapter.close()


def test_each_instance_reads_dead_letters_through_a_box_session_of_its_own(
    cluster: Callable[[], Instance],
) -> None:
    """Dead-letter boxes are read by every instance (core opens one in each): their
    sessions are the instance's own, sharing each dead letter through ``$share``."""
    a, b = cluster(), cluster()
    topic = destination_topic("dl1")
    spec = SubscriptionSpec(
        box_name("dl1"), (PathPattern(topic.namespace, topic.path),), QueueLimits()
    )
    ha, hb = a.adapter.subscription(spec), b.adapter.subscription(spec)
    assert isinstance(ha, ClusterHandle) and isinstance(hb, ClusterHandle)
    assert ha.client_id != hb.client_id
    got_a, got_b = Collector(), Collector()
    ha.start(got_a)
    hb.start(got_b)
    bodies = [b"d%d" % i for i in range(6)]
    a.adapter.publish_many(
        [OutboundMessage(topic=topic, body=body, message_id=uuid.uuid4().hex) for body in bodies]
    )
    wait_until(
        lambda: len(got_a.bodies()) + len(got_b.bodies()) == len(bodies),
        20,
        what="every dead letter in one of the boxes",
    )
    assert sorted(got_a.bodies() + got_b.bodies()) == sorted(bodies)
