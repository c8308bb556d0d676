"""MQTT cluster mode over TLS with a user name and password (``mqtts://user:pw@...``,
``ca_certs``): the subscription sessions' own client (adapters/mqtt/sub_client.py) uses
the options the adapter's paho connections use.  A private Mosquitto with a TLS listener
and a password file; certificates from ``trustme``."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("paho.mqtt")

from wsnmom.adapters.mqtt.adapter import MqttAdapter
from wsnmom.adapters.mqtt.cluster_handle import ClusterHandle, SubscriptionSessions
from wsnmom.adapters.mqtt.config import parse_settings
from wsnmom.adapters.mqtt.hub import Hub
from wsnmom.adapters.mqtt.mapping import MqttMapping
from wsnmom.core.adapter import (
    CredentialsRefused,
    OutboundMessage,
    QueueLimits,
    SubscriptionSpec,
)
from wsnmom.topic_mapping.model import PathPattern, Topic

from tests.adapters.test_mqtt_cluster import NS, SENTINEL, Collector
from tests.fixtures.mosquitto import MosquittoNode
from tests.support.tls import Certificates
from tests.support.waiting import wait_until

pytestmark = pytest.mark.mqtt


@pytest.fixture
def tls_node(
    mosquitto_factory: Callable[..., MosquittoNode], tmp_path: Path
) -> tuple[MosquittoNode, Certificates]:
    certs_dir = tmp_path / "certs"
    certs_dir.mkdir()
    certs = Certificates(certs_dir)
    node = mosquitto_factory(users={"gw": "s3cret"})
    node.stop()
    server = certs.path("server")  # key and certificate chain in one PEM file
    with node.config.open("a") as config:
        config.write(f"cafile {certs.path('ca')}\ncertfile {server}\nkeyfile {server}\n")
    node.start()
    return node, certs


def test_a_subscription_session_over_tls_with_a_password_delivers(
    tls_node: tuple[MosquittoNode, Certificates], tmp_path: Path
) -> None:
    node, certs = tls_node
    adapter = MqttAdapter(
        f"mqtts://gw:s3cret@127.0.0.1:{node.port}",
        {
            "data_dir": str(tmp_path / "i0"),
            "namespaces": {NS: "ns"},
            "topic_prefix": f"t{uuid.uuid4().hex[:8]}",
            "ca_certs": certs.path("ca"),
        },
    )
    adapter.shared_by_instances(lambda name: True)
    adapter.open()
    try:
        spec = SubscriptionSpec("tls1", (PathPattern(NS, ("a",)),), QueueLimits())
        handle = adapter.subscription(spec)
        assert isinstance(handle, ClusterHandle)
        consumer = Collector()
        handle.start(consumer, prefetch=4)
        bodies = [b"m%d" % i for i in range(10)]
        topic = Topic(NS, ("a",))
        adapter.publish_many(
            [
                OutboundMessage(topic=topic, body=b, message_id=uuid.uuid4().hex)
                for b in [*bodies, SENTINEL]
            ]
        )
        wait_until(lambda: consumer.has(SENTINEL), 30, what="the sentinel over TLS")
        assert consumer.bodies() == [*bodies, SENTINEL]
        assert handle.connected
    finally:
        adapter.close()


def test_a_wrong_password_is_refused_as_wrong_credentials(
    tls_node: tuple[MosquittoNode, Certificates], tmp_path: Path
) -> None:
    node, certs = tls_node
    settings = parse_settings(
        f"mqtts://gw:wrong@127.0.0.1:{node.port}",
        {"data_dir": str(tmp_path / "s"), "namespaces": {NS: "ns"}, "ca_certs": certs.path("ca")},
    )
    hub = Hub("tls-test", tls=True)
    try:
        sessions = SubscriptionSessions(
            settings,
            MqttMapping(settings.namespaces, settings.topic_prefix),
            "inst",
            None,
            None,
            hub,
        )
        spec = SubscriptionSpec("tls2", (PathPattern(NS, ("a",)),), QueueLimits())
        with pytest.raises(CredentialsRefused, match="refused the gateway's login"):
            ClusterHandle(sessions, spec).start(Collector())
    finally:
        hub.close()
