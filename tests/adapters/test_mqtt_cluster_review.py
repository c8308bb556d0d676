"""MQTT in cluster mode, adapter level: defects found in review (issue 23), each on the
session's Mosquitto with two adapters in cluster mode (``Instance``, ``Collector`` and
the ``cluster`` fixture of test_mqtt_cluster.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.adapters import test_mqtt_cluster as base
from tests.adapters.test_mqtt_cluster import SENTINEL, Collector, Instance, session_present
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
