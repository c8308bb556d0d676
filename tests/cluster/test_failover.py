"""Delivery ownership across gateway processes on one PostgreSQL store and RabbitMQ: periodic
work (expiry) runs on one instance only; the embedded adapter refuses a second instance on
one store, and MQTT 3.1.1 any instance on a shared store.

A kill -9 and a SIGTERM of the deliverer are the HA suites' (``test_ha_rabbitmq.py``,
``test_ha_kafka.py``, ``test_ha_mqtt.py``; issue 23 §2-3): taken over within lease + 2 s
(p95 over the killed instance's subscriptions), nothing lost, every duplicate first
accepted at most 3 s before the kill.  :class:`Stamped` and :func:`numbers` serve the
other modules of tests/cluster."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

from tests.cluster.conftest import INSTANCE, Cluster
from tests.fixtures.brokers import ResolvedBroker
from tests.fixtures.postgres import fresh_database
from tests.fixtures.server import ConsumerServer, PatientGateway, mqtt_gateway_url
from tests.support.waiting import wait_until
from wsnmom.client.errors import ResourceUnknownFault
from wsnmom.client.model import EndpointReference
from wsnmom.testing.gateway import GatewayFailed

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

WSNT = "http://docs.oasis-open.org/wsn/b-2"
TOPIC = "{urn:cluster}failover"


def numbers(consumer: ConsumerServer) -> set[int]:
    """The sequence numbers of every message received."""
    out = set()
    for rec in consumer.notifies():
        for m in rec.body_child.findall(f"{{{WSNT}}}NotificationMessage/{{{WSNT}}}Message"):
            out.add(int("".join(m.itertext()).strip()))
    return out


class Stamped(ConsumerServer):
    """A consumer that notes when each request arrived (monotonic seconds) and from which
    instance."""

    def __init__(self) -> None:
        self.arrivals: list[tuple[float, str]] = []
        super().__init__()

    def _handle(self, handler, data: bytes) -> None:  # type: ignore[no-untyped-def]
        self.arrivals.append((time.monotonic(), handler.headers.get(INSTANCE, "")))
        super()._handle(handler, data)


@pytest.mark.rabbitmq
def test_expiry_runs_on_one_instance_only(
    cluster: Callable[..., Cluster], consumer: ConsumerServer
) -> None:
    c = cluster(2, WSNMOM_TERMINATION__SWEEP_INTERVAL="0.2")
    a, b = c.gateways
    subs = [
        c.client(a).subscribe(
            consumer.address(f"/{i}"), TOPIC, initial_termination_time=timedelta(seconds=2)
        )
        for i in range(4)
    ]

    def gone_everywhere() -> bool:
        for gateway in (a, b):
            for sub in subs:
                try:
                    c.client(gateway).subscription(
                        EndpointReference(c.via(gateway, sub.address))
                    ).properties()
                except ResourceUnknownFault:
                    continue
                return False
        return True

    wait_until(gone_everywhere, 20, what="every subscription expired on both instances")

    def swept() -> bool:
        logs = [g.log_path.read_text() for g in (a, b)]
        return all(any(f"subscription {s.id} expired" in text for text in logs) for s in subs)

    wait_until(swept, 10, what="the sweep's log lines")
    for sub in subs:
        line = f"subscription {sub.id} expired"
        assert sum(g.log_path.read_text().count(line) for g in (a, b)) == 1


@pytest.mark.parametrize(
    ("adapter", "refusal"),
    [
        ("embedded", "serves one instance only"),
        # MQTT runs in cluster mode on a shared store only with MQTT 5 (docs/scale-out.md)
        pytest.param("mqtt", "only with MQTT 5", marks=pytest.mark.mqtt),
    ],
)
def test_a_second_instance_of_an_adapter_with_local_queues_is_refused(
    request: pytest.FixtureRequest, postgres_server: ResolvedBroker, adapter: str, refusal: str
) -> None:
    """The embedded adapter keeps subscriptions' queued messages in one process's data
    directory: a second live instance on one store is refused.  MQTT 3.1.1 has no
    cluster mode: refused on a shared store from the first instance on."""
    base = Path(tempfile.mkdtemp(prefix=f"wsnmom-{adapter}-"))
    if adapter == "mqtt":
        url = mqtt_gateway_url(str(request.getfixturevalue("mqtt_url"))) + "&protocol=3.1.1"
        urls = [mqtt_gateway_url(str(request.getfixturevalue("mqtt_url"))), url]
    else:
        urls = [f"embedded://{base}/a", f"embedded://{base}/b"]
    try:
        with fresh_database(postgres_server.url) as store:
            first = PatientGateway(adapter, urls[0], base / "a", store_url=store)
            second = PatientGateway(adapter, urls[1], base / "b", store_url=store)
            first.start()
            try:
                with pytest.raises(GatewayFailed) as failed:
                    second.start()  # the wait ends when the refused instance exits
                assert refusal in str(failed.value)
                assert first.running
            finally:
                second.stop()
                first.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)
