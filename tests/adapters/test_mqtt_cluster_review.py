"""MQTT in cluster mode, adapter level: defects found in review (issue 23), each on the
session's Mosquitto with two adapters in cluster mode (``Instance``, ``Collector`` and
the ``cluster`` fixture of test_mqtt_cluster.py)."""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from wsnmom.adapters.mqtt import box_retire
from wsnmom.adapters.mqtt.adapter import MqttAdapter
from wsnmom.adapters.mqtt.cluster_handle import ClusterHandle, SubscriptionSessions
from wsnmom.adapters.mqtt.config import parse_settings
from wsnmom.adapters.mqtt.hub import Hub
from wsnmom.adapters.mqtt.mapping import MqttMapping
from wsnmom.core.adapter import (
    AdapterError,
    OutboundMessage,
    QueueLimits,
    Received,
    SubscriptionSpec,
)
from wsnmom.core.dead_letter_records import box_name, destination_topic
from wsnmom.topic_mapping.model import PathPattern, Topic

from tests.adapters import test_mqtt_cluster as base
from tests.adapters.test_mqtt_cluster import NS, SENTINEL, Collector, Instance, session_present
from tests.fixtures.mosquitto import MqttPublisher
from tests.support.waiting import wait_until

pytestmark = pytest.mark.mqtt

#: two adapters in cluster mode on one broker (the fixture of test_mqtt_cluster.py)
cluster = base.cluster


def test_a_start_after_a_delete_through_another_instance_does_not_make_the_session_again(
    cluster: Callable[[], Instance], mqtt_url: str
) -> None:
    """B followed the Subscribe (its handle declared, not started: not its shard); the
    Unsubscribe goes through A; B gains the shard (or is resumed) before it follows the
    Unsubscribe and starts the handle.  That start must not make the deleted session
    again: core's follower then only stops the handle (``Subscriptions.forget``), so a
    session made here would stay on the broker for ever, queueing every match."""
    a, b = cluster(), cluster()
    hb = b.handle("gone1")
    a.adapter.delete_subscription("gone1")
    consumer = Collector()
    hb.start(consumer)
    assert not hb.connected
    hb.stop()  # core follows the Unsubscribe
    assert not session_present(mqtt_url, hb.client_id)


def test_an_unreadable_session_record_counts_as_none(
    cluster: Callable[[], Instance], mqtt_url: str
) -> None:
    """A session's record is a retained message under the topic prefix, which any
    native client allowed to publish there can overwrite.  One that is not UTF-8 must
    not make the Subscribe fail with a UnicodeDecodeError (a 500): it is no record."""
    a, b = cluster(), cluster()
    assert a.adapter._cnode is not None
    sessions = a.adapter._cnode.sessions
    client_id = sessions.client_id("bad1")
    native = MqttPublisher(mqtt_url)
    try:
        native.publish(sessions.record_topic(client_id), b"\xff\xfe\n\x80", retain=True)
        a.handle("bad1")  # declares (the record is not the one wanted): rewrites it
        a.publish(b"after")
        consumer = Collector()
        b.handle("bad1").start(consumer)
        a.publish(SENTINEL)
        wait_until(lambda: consumer.has(SENTINEL), 20, what="the sentinel through B")
        assert consumer.bodies() == [b"after", SENTINEL]
    finally:
        native.publish(sessions.record_topic(client_id), b"", retain=True)
        native.close()


def box_spec() -> tuple[Topic, SubscriptionSpec]:
    """A dead-letter destination of its own and the spec of its box."""
    topic = destination_topic(f"dl{uuid.uuid4().hex[:6]}")
    spec = SubscriptionSpec(
        box_name(topic.path[0]), (PathPattern(topic.namespace, topic.path),), QueueLimits()
    )
    return topic, spec


def box_of(inst: Instance, spec: SubscriptionSpec, instance_id: str) -> ClusterHandle:
    """``inst``'s box of ``spec``, its records naming ``instance_id``."""
    inst.adapter.joined_as(instance_id)
    handle = inst.adapter.subscription(spec)
    assert isinstance(handle, ClusterHandle)
    return handle


def letters(inst: Instance, topic: Topic, bodies: list[bytes]) -> None:
    inst.adapter.publish_many(
        [OutboundMessage(topic=topic, body=x, message_id=uuid.uuid4().hex) for x in bodies]
    )


def test_a_departed_instances_box_takes_no_share_of_the_dead_letters(
    cluster: Callable[[], Instance], mqtt_url: str
) -> None:
    """Each instance reads dead letters through a box session of its own, all in one
    ``$share`` group.  Mosquitto hands a shared subscription's messages round robin to
    every session in the group, connected or not (eclipse-mosquitto/mosquitto#1747), so
    an instance gone for good (scaled down, or back with a new data directory, hence a
    new client id) kept taking its share into a session nobody reads.  Retiring it
    (``retire_departed``, which core's leader calls) hands what it had queued to a live
    box, once each, and ends the session: later letters all reach the live box."""
    a = cluster()
    b = cluster()
    topic, spec = box_spec()
    ha, hb = box_of(a, spec, "inst-a"), box_of(b, spec, "inst-b")
    ha.start(Collector())
    a.adapter.close()  # A leaves the cluster for good
    got = Collector()
    hb.start(got)
    bodies = [b"d%d" % i for i in range(8)]
    letters(b, topic, bodies)
    # round robin: some of them wait in A's session until it is retired
    wait_until(lambda: len(got.bodies()) >= 1, 20, what="B's share of the dead letters")
    assert b.adapter.retire_departed(lambda: {"inst-b"}) == [ha.client_id]
    wait_until(lambda: len(got.bodies()) == len(bodies), 20, what="every dead letter in B's box")
    later = [b"e%d" % i for i in range(8)]
    letters(b, topic, later)
    wait_until(lambda: len(got.bodies()) == 16, 20, what="every later dead letter in B's box")
    assert sorted(got.bodies()) == sorted(bodies + later)
    assert not session_present(mqtt_url, ha.client_id)
    assert b.adapter._require_cluster().sessions.recorded(ha.client_id) is None
    assert b.adapter.retire_departed(lambda: {"inst-b"}) == []


def test_retiring_a_departed_box_leaves_the_live_instances_boxes_alone(
    cluster: Callable[[], Instance],
) -> None:
    """L (which runs periodic work) retires D's box: M's box, live, keeps its connection
    and its record, and goes on taking its share; a subscription's session (no box) is
    not touched either."""
    lead, mid, gone = cluster(), cluster(), cluster()
    topic, spec = box_spec()
    hl, hm, hd = box_of(lead, spec, "L"), box_of(mid, spec, "M"), box_of(gone, spec, "D")
    plain = gone.handle("plain1")
    got_l, got_m = Collector(), Collector()
    hl.start(got_l)
    hm.start(got_m)
    hd.start(Collector())
    gone.adapter.close()
    before = hm.connections
    sessions = lead.adapter._require_cluster().sessions
    assert lead.adapter.retire_departed(lambda: {"L", "M"}) == [hd.client_id]
    assert hm.connected and hm.connections == before
    assert sessions.recorded(hm.client_id) == hm.filters
    assert sessions.recorded(hl.client_id) == hl.filters
    assert sessions.recorded(plain.client_id) is not None
    bodies = [b"m%d" % i for i in range(12)]
    letters(lead, topic, bodies)
    wait_until(
        lambda: len(got_l.bodies()) + len(got_m.bodies()) == len(bodies),
        20,
        what="every dead letter in a live box",
    )
    assert got_m.bodies() and got_l.bodies()  # both still in the group
    assert sorted(got_l.bodies() + got_m.bodies()) == sorted(bodies)


def test_a_zombie_whose_box_was_retired_receives_again_and_nothing_is_lost(
    cluster: Callable[[], Instance],
) -> None:
    """A is stalled (its box's reconnect put off, as a SIGSTOP'd instance's is) and
    taken for departed: B retires its box, cutting A's connection off.  Letters
    published meanwhile all reach B.  When A comes back its box finds its session gone
    and makes it again, with its record: A takes its share again, and every letter
    arrives once, in one box or the other."""
    a, b = cluster(), cluster()
    topic, spec = box_spec()
    ha, hb = box_of(a, spec, "inst-a"), box_of(b, spec, "inst-b")
    got_a, got_b = Collector(), Collector()
    ha.start(got_a)
    hb.start(got_b)
    first = [b"f%d" % i for i in range(6)]
    letters(b, topic, first)
    wait_until(
        lambda: len(got_a.bodies()) + len(got_b.bodies()) == len(first), 20, what="the first"
    )
    with ha._lock:
        ha._delay = 3600.0  # A's next reconnect: when the test lets it go
    assert b.adapter.retire_departed(lambda: {"inst-b"}) == [ha.client_id]
    wait_until(lambda: ha._timer is not None, 20, what="A's reconnect put off")
    assert not ha.connected
    meanwhile = [b"m%d" % i for i in range(6)]
    letters(b, topic, meanwhile)
    wait_until(lambda: all(got_b.has(x) for x in meanwhile), 20, what="B took them all")
    with ha._lock:
        ha._schedule(0.0, first=False)  # A wakes up
    assert ha.await_connection(30) and ha.connected
    sessions = b.adapter._require_cluster().sessions
    wait_until(lambda: sessions.recorded(ha.client_id) == ha.filters, 20, what="A's record")
    after = [b"a%d" % i for i in range(10)]
    letters(b, topic, after)
    everything = first + meanwhile + after
    wait_until(
        lambda: len(got_a.bodies()) + len(got_b.bodies()) >= len(everything),
        30,
        what="every letter in a box",
    )
    assert any(got_a.has(x) for x in after), "A takes its share again"
    assert sorted(got_a.bodies() + got_b.bodies()) == sorted(everything)


def test_a_zombie_back_during_the_retirement_loses_nothing(
    cluster: Callable[[], Instance], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A's box holds letters queued while A was stalled; B starts retiring it, and A
    comes back while the first batch is being published again.  The retirement stops
    (not counted as done, the record stays), A receives again, and every letter arrives,
    at most the batch being published twice (docs/scale-out.md, "Departed instances'
    boxes")."""
    a, b = cluster(), cluster()
    topic, spec = box_spec()
    ha, hb = box_of(a, spec, "inst-a"), box_of(b, spec, "inst-b")
    got_a, got_b = Collector(), Collector()
    ha.start(got_a)
    with ha._lock:
        ha._delay = 3600.0  # A's reconnects: when the test lets them go
    hb.start(got_b)
    with ha._lock:  # stalled: off, its session queues
        stalled, ha._conn = ha._conn, None
    assert stalled is not None
    stalled.close()
    bodies = [b"q%d" % i for i in range(10)]
    letters(b, topic, bodies)
    wait_until(lambda: len(got_b.bodies()) >= 1, 20, what="B's share")
    batches: list[int] = []
    republish = box_retire.route_and_publish

    def back_first(node: Any, messages: Any, timeout: float, boxes: Any) -> Any:
        if not batches:
            with ha._lock:
                ha._schedule(0.0, first=False)  # A wakes up and cuts the retirement off
            assert ha.await_connection(30) and ha.connected
        batches.append(len(messages))
        return republish(node, messages, timeout, boxes)

    monkeypatch.setattr(box_retire, "route_and_publish", back_first)
    assert b.adapter.retire_departed(lambda: {"inst-b"}) == []
    assert batches and batches[0] <= box_retire.RETIRE_WINDOW
    sessions = b.adapter._require_cluster().sessions
    assert sessions.recorded(ha.client_id) == ha.filters
    later = [b"z%d" % i for i in range(6)]
    letters(b, topic, later)
    wait_until(
        lambda: set(got_a.bodies() + got_b.bodies()) >= set(bodies + later),
        30,
        what="every letter in a box",
    )
    both = got_a.bodies() + got_b.bodies()
    assert len(both) - len(set(both)) <= batches[0]


def test_a_nack_in_the_callback_while_the_start_waits_for_its_suback_stalls_nothing(
    mqtt_url: str, tmp_path: Path
) -> None:
    """Messages queued in a session arrive with the CONNACK, before the SUBACK a start
    (or a reconnect) waits for while it holds the handle's lock.  A consumer that nacks
    one at once does so on the instance's one network thread; the requeue must not wait
    for the handle's lock there, or that thread (every session of the instance) stands
    still until the start gives up (``subscribe_timeout``, long here)."""
    adapter = MqttAdapter(
        mqtt_url,
        {
            "data_dir": str(tmp_path / "n"),
            "namespaces": {NS: "ns"},
            "topic_prefix": f"n{uuid.uuid4().hex[:8]}",
            "session_expiry": 600,
            "reconnect_min_delay": 0.1,
            "subscribe_timeout": 30,
        },
    )
    adapter.shared_by_instances(lambda name: True)
    adapter.open()
    try:
        spec = SubscriptionSpec("nk1", (PathPattern(NS, ("a",)),), QueueLimits())
        handle = adapter.subscription(spec)
        topic = Topic(NS, ("a",))

        def publish(*bodies: bytes) -> None:
            adapter.publish_many(
                [OutboundMessage(topic=topic, body=b, message_id=uuid.uuid4().hex) for b in bodies]
            )

        publish(b"q1", b"q2")  # queued in the session: they come with the CONNACK
        got: list[bytes] = []

        def consumer(r: Received) -> None:
            if r.redelivered:
                got.append(r.body)
                r.ack()
            else:
                r.nack(requeue=True)  # a first delivery goes back at once

        handle.start(consumer, prefetch=4)
        publish(SENTINEL)
        wait_until(lambda: SENTINEL in got, 20, what="the sentinel, requeued once")
        assert got == [b"q1", b"q2", SENTINEL]
    finally:
        adapter.close()


def test_acks_out_of_order_leave_as_pubacks_in_arrival_order(
    cluster: Callable[[], Instance],
) -> None:
    """Unordered delivery settles messages in any order; a PUBACK leaves only once every
    earlier message was settled (MQTT-4.6.0-2).  Settled but held back behind an
    unsettled one: given again after a stop; the whole run settled: never again."""
    a = cluster()
    held = Collector(hold=True)
    h = a.handle("po1")
    h.start(held, prefetch=5)
    first = [b"a%d" % i for i in range(5)]
    a.publish(*first)
    wait_until(lambda: len(held.got) == 5, 20, what="the window")
    for r in reversed(held.got[1:]):
        r.ack()  # a4..a1 settled, a0 not: nothing may be acknowledged yet
    h.stop()
    again = Collector(hold=True)
    h.start(again, prefetch=5)
    wait_until(lambda: len(again.got) == 5, 20, what="the window again")
    assert again.bodies() == first and all(r.redelivered for r in again.got)
    for r in again.got[1:]:
        r.ack()
    again.got[0].ack()  # the head last: the five PUBACKs leave now
    a.publish(SENTINEL)
    wait_until(lambda: again.has(SENTINEL), 20, what="the sentinel")
    again.got[-1].ack()
    h.stop()
    last = Collector()
    h.start(last, prefetch=5)
    a.publish(b"after")
    wait_until(lambda: last.has(b"after"), 20, what="the next message")
    assert last.bodies() == [b"after"]


def test_a_delete_leaves_neither_the_session_nor_its_record(
    cluster: Callable[[], Instance], mqtt_url: str
) -> None:
    """An Unsubscribe through an instance that does not deliver: the session and its
    retained record (what a native client under the prefix would read) are gone."""
    a, b = cluster(), cluster()
    assert a.adapter._cnode is not None
    sessions = a.adapter._cnode.sessions
    consumer = Collector()
    hb = b.handle("del1")
    hb.start(consumer)
    a.publish(b"one")
    wait_until(lambda: consumer.has(b"one"), 20, what="a delivery through B")
    assert sessions.recorded(hb.client_id) is not None
    a.adapter.delete_subscription("del1")
    wait_until(lambda: hb.unrecorded >= 1, 20, what="B's restart finding no record")
    hb.stop()  # B follows the Unsubscribe
    assert sessions.recorded(hb.client_id) is None
    assert not session_present(mqtt_url, hb.client_id)


def test_a_stop_does_not_wait_for_a_connect_the_broker_does_not_answer(
    tmp_path: Path,
) -> None:
    """Core stops handles on its cluster thread when shards move (``Ownership.lost``):
    a stop must not wait out a start or reconnect that the broker leaves unanswered (a
    listener that never sends a CONNACK here, an overloaded broker in life), or the
    heartbeats wait too and the instance loses every lease."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # the kernel accepts the TCP connection; nobody answers the CONNECT
    hub = Hub("review")
    try:
        port = silent.getsockname()[1]
        settings = parse_settings(
            f"mqtt://127.0.0.1:{port}",
            {"data_dir": str(tmp_path / "s"), "namespaces": {NS: "ns"}, "connect_timeout": 60},
        )
        mapping = MqttMapping(settings.namespaces, settings.topic_prefix)
        sessions = SubscriptionSessions(settings, mapping, "inst", None, None, hub)
        spec = SubscriptionSpec("silent1", (PathPattern(NS, ("a",)),), QueueLimits())
        handle = ClusterHandle(sessions, spec)
        starting = threading.Thread(target=handle.start, args=(Collector(),), daemon=True)
        starting.start()
        wait_until(lambda: handle._pending is not None, 10, what="the start connecting")
        stopped = threading.Event()
        threading.Thread(target=lambda: (handle.stop(), stopped.set()), daemon=True).start()
        wait_until(stopped.is_set, 10, what="the stop, while the CONNACK is awaited")
        # the start gives the connection up too (not after connect_timeout), installs
        # nothing and schedules no reconnect
        wait_until(lambda: not starting.is_alive(), 10, what="the start giving up")
        assert not handle.connected and handle._timer is None
    finally:
        silent.close()
        hub.close()


def test_the_subscription_names_are_those_of_the_session_records(
    cluster: Callable[[], Instance], mqtt_url: str
) -> None:
    """Cluster mode lists its subscriptions from the sessions' retained records (each
    names its subscription), on every instance alike, so an orphan can be found and
    deleted: a session whose delete failed while the broker was away (session and
    record left), and a record whose session was ended by a delete killed before it
    cleared the record.  A record whose name does not hash to its client id (written by
    a native client under the prefix) names nothing; one without a name (written before
    records named their subscription) makes the list unknown (None), not short."""
    a, b = cluster(), cluster()
    assert a.adapter._cnode is not None
    sessions = a.adapter._cnode.sessions
    assert a.adapter.subscription_names() == []
    a.handle("nm1")
    b.handle("nm1")  # a re-attach: one record
    b.handle("nm2")
    assert a.adapter.subscription_names() == ["nm1", "nm2"]
    assert b.adapter.subscription_names() == ["nm1", "nm2"]
    # nm3's delete was killed after it ended the session, before it cleared the record
    gone = sessions.client_id("nm3")
    sessions._record(gone, frozenset({"x/y"}), "nm3")
    native = MqttPublisher(mqtt_url)
    forged = sessions.client_id("nm4")
    try:
        native.publish(sessions.record_topic(forged), b"#name=nm1\nx/#", retain=True)
        assert b.adapter.subscription_names() == ["nm1", "nm2", "nm3"]
        # the orphans, deleted as core deletes a name it no longer stores
        a.adapter.delete_subscription("nm2")
        a.adapter.delete_subscription("nm3")
        assert b.adapter.subscription_names() == ["nm1"]
        assert not session_present(mqtt_url, sessions.client_id("nm2"))
        assert sessions.recorded(gone) is None
        native.publish(sessions.record_topic(forged), b"x/#", retain=True)  # no name line
        assert b.adapter.subscription_names() is None
    finally:
        native.publish(sessions.record_topic(forged), b"", retain=True)
        native.close()
    assert b.adapter.subscription_names() == ["nm1"]


def test_a_re_attach_names_the_subscription_in_a_record_that_does_not(
    cluster: Callable[[], Instance], mqtt_url: str
) -> None:
    """A record written before records named their subscription (the filters alone) is
    written again, naming it, when an instance re-attaches the subscription (at start:
    every instance re-attaches every subscription), without connecting to the session."""
    a = cluster()
    assert a.adapter._cnode is not None
    sessions = a.adapter._cnode.sessions
    h = a.handle("old1")
    consumer = Collector()
    h.start(consumer)
    native = MqttPublisher(mqtt_url)
    try:
        body = "\n".join(sorted(h.filters)).encode()
        native.publish(sessions.record_topic(h.client_id), body, retain=True)
        assert a.adapter.subscription_names() is None
        a.handle("old1")  # the re-attach
        assert a.adapter.subscription_names() == ["old1"]
        a.publish(SENTINEL)
        wait_until(lambda: consumer.has(SENTINEL), 20, what="the sentinel")
        assert h.connections == 1  # the re-attach did not cut the deliverer off
    finally:
        native.close()
        h.stop()


def test_a_second_instance_on_one_data_directory_is_refused(mqtt_url: str, tmp_path: Path) -> None:
    """An instance's client ids (its publisher's, its dead-letter boxes') are kept in its
    data directory: two instances on one directory would connect with the same ids and
    cut each other off at every CONNECT, for ever and silently.  The second is refused,
    naming the directory and the holder; once the first closes, the directory is free."""
    options = {
        "data_dir": str(tmp_path / "shared"),
        "namespaces": {NS: "ns"},
        "topic_prefix": f"d{uuid.uuid4().hex[:8]}",
    }

    def instance() -> MqttAdapter:
        adapter = MqttAdapter(mqtt_url, options)
        adapter.shared_by_instances(lambda name: True)
        return adapter

    first, second = instance(), instance()
    first.open()
    try:
        with pytest.raises(AdapterError) as refused:
            second.open()
        message = str(refused.value)
        assert str(tmp_path / "shared" / "mqtt") in message, message
        assert f"process {os.getpid()}" in message, message
    finally:
        first.close()
    second.open()  # the first one's lock went with its close
    second.close()
