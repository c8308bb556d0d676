"""The single-instance MQTT adapter on descriptors that ``select()`` cannot watch.

A gateway process holding more than about a thousand descriptors (HTTP keep-alive
clients, outbound connections) gives the adapter's new sockets numbers of 1024 and above;
paho's own network loop (``loop_start``) waits with ``select.select``, which refuses
those, so a session on it never completes a connection (measured before the fix: "the
MQTT broker ... did not accept a connection within 10s" at ``open``).  Here every
descriptor below 1100 is held before the adapter opens, and the adapter must subscribe,
deliver, lose its broker, reconnect (new sockets, again above the limit) and deliver
again."""

from __future__ import annotations

from collections.abc import Callable

import pytest

pytest.importorskip("paho.mqtt")

from wsnmom.adapters.mqtt.adapter import MqttAdapter

from tests.adapters.test_mqtt import (
    SENTINEL,
    acknowledged_at_the_broker,
    make,
    message,
    pattern,
    subscribe,
    until_sentinel,
)
from tests.adapters.test_mqtt_cluster_descriptors import ABOVE, high_descriptors
from tests.fixtures.mosquitto import MosquittoNode
from tests.support.descriptors import DescriptorHold
from tests.support.waiting import wait_until

pytestmark = pytest.mark.mqtt

__all__ = ["high_descriptors", "make"]  # fixtures used by name


def _descriptors(adapter: MqttAdapter) -> list[int]:
    """The descriptors of the adapter's connections (session and publisher)."""
    node = adapter._node  # where its sockets are
    assert node is not None
    socks = [node.session.link.client.socket(), node.publisher.link.client.socket()]
    return [s.fileno() for s in socks if s is not None]


def test_the_session_above_descriptor_1023_delivers_and_reconnects_after_a_broker_restart(
    make: Callable[..., MqttAdapter],
    mosquitto_factory: Callable[..., MosquittoNode],
    high_descriptors: DescriptorHold,
) -> None:
    node = mosquitto_factory()
    high_descriptors.refill()  # what closed since the hold began (see DescriptorHold)
    adapter = make(node.url, reconnect_max_delay=0.5)
    fds = _descriptors(adapter)
    assert len(fds) == 2 and min(fds) > ABOVE, fds
    handle = subscribe(adapter, pattern("fd"))
    adapter.publish_many([message("fd", b"before %d" % i) for i in range(5)])
    adapter.publish(message("fd", SENTINEL))
    assert [m.body for m in until_sentinel(handle)] == [b"before %d" % i for i in range(5)]

    acknowledged_at_the_broker(adapter)
    high_descriptors.refill()
    node.restart()
    wait_until(adapter.available, 20, what="the adapter back after the broker's restart")
    fds = _descriptors(adapter)
    assert len(fds) == 2 and min(fds) > ABOVE, fds
    adapter.publish_many([message("fd", b"after %d" % i) for i in range(5)])
    fresh = subscribe(adapter, pattern("new"))
    adapter.publish(message("new", b"fresh"))
    adapter.publish_many([message("fd", SENTINEL), message("new", SENTINEL)])
    assert [m.body for m in until_sentinel(handle)] == [b"after %d" % i for i in range(5)]
    assert [m.body for m in until_sentinel(fresh)] == [b"fresh"]
