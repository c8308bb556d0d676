"""Gateway processes sharing one PostgreSQL store and one middleware as one broker.

The middleware is RabbitMQ unless a test parametrizes the ``middleware`` fixture
(``indirect``) with ``"kafka"`` (the session's Kafka broker, tansu locally; every cluster
gets its own topic prefix, inbox topic and consumer group names, shared by its instances)
or ``"mqtt"`` (also ``"mosquitto"``: the session's MQTT broker, a local Mosquitto with
persistence and a raised ``max_queued_messages``, tests/fixtures/mosquitto.py; every
cluster gets its own topic prefix, shared by its instances, under which its topics and
its subscriptions' broker sessions live).
``cluster(n)`` starts ``n`` ``wsnmom serve`` processes on a fresh database, each with its
own data directory and port, all with one ``public_url`` (a load balancer's address that
nothing listens on): endpoint references name no instance, and :meth:`Cluster.via`
sends a request for a resource to the instance a test chooses.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import requests

from tests.fixtures.brokers import ResolvedBroker
from tests.fixtures.postgres import fresh_database
from tests.fixtures.server import PatientGateway, kafka_gateway_url, mqtt_gateway_url
from wsnmom.client import WsnClient
from wsnmom.testing.gateway import Gateway, free_port

#: the instance header every response and outbound Notify carries
INSTANCE = "WSNMOM-Instance"


class Cluster:
    """``n`` gateways on one store and one middleware (see the module docstring)."""

    def __init__(
        self,
        middleware: str,
        store_url: str,
        adapter_url: str,
        n: int,
        env: dict[str, str],
        base: Path,
        instance_env: Callable[[int], dict[str, str]] | None = None,
    ) -> None:
        self.middleware = middleware
        self.store_url = store_url
        self.public_url = f"http://127.0.0.1:{free_port()}"
        self.gateways: list[Gateway] = []
        for i in range(n):
            gateway = PatientGateway(
                middleware,
                adapter_url,
                base / f"g{i}",
                store_url=store_url,
                extra_env={
                    "WSNMOM_PUBLIC_URL": self.public_url,
                    "WSNMOM_CLUSTER__INSTANCE_ID": f"g{i}",
                    **env,
                    **(instance_env(i) if instance_env is not None else {}),
                },
            )
            self.gateways.append(gateway)

    def start(self) -> None:
        for gateway in self.gateways:
            gateway.start()

    def stop(self) -> None:
        for gateway in self.gateways:
            gateway.stop()

    def via(self, gateway: Gateway, address: str) -> str:
        """``address`` (at the public URL) as sent to ``gateway``."""
        parts = urlsplit(address)
        own = urlsplit(gateway.base_url)
        return urlunsplit(parts._replace(scheme=own.scheme, netloc=own.netloc))

    def client(self, gateway: Gateway) -> WsnClient:
        return WsnClient(gateway.broker_url)

    def instance_of(self, gateway: Gateway) -> str:
        """The instance id ``gateway`` names in its answers."""
        return str(requests.get(gateway.base_url + "/healthz", timeout=5).headers[INSTANCE])


@pytest.fixture
def middleware(request: pytest.FixtureRequest) -> str:
    """The middleware of the test's clusters: ``"rabbitmq"`` (default), ``"kafka"`` or
    ``"mqtt"`` (``"mosquitto"`` is the same)."""
    name = str(getattr(request, "param", "rabbitmq"))
    return "mqtt" if name == "mosquitto" else name


def _adapter_url(request: pytest.FixtureRequest, middleware: str) -> str:
    """The adapter URL every instance of one cluster shares."""
    if middleware == "kafka":
        # one topic prefix, inbox topic and set of consumer groups per cluster, shared by
        # its instances (they are one broker); tansu's watermarks are not exact
        return kafka_gateway_url(str(request.getfixturevalue("kafka_url")))
    if middleware == "mqtt":
        # one topic prefix per cluster, shared by its instances: it names the cluster's
        # subscription sessions (docs/scale-out.md, "MQTT in cluster mode")
        return mqtt_gateway_url(str(request.getfixturevalue("mqtt_url")))
    # on a shared store the RabbitMQ adapter reads pull points with basic.get by itself
    # (its cluster_options), so that every instance answers for every pull point
    # (docs/scale-out.md): the URL does not say so.  It names a 1 s heartbeat: with the
    # 3 s lease of these tests, RabbitMQ must see a stopped instance's connection dead
    # (after 2 to 3 heartbeats) before its successor takes the lease, for the
    # successor's consumer to be the active one by then (single-active-consumer)
    url = str(request.getfixturevalue("rabbitmq_url"))
    return url + ("&" if "?" in url else "?") + "heartbeat=1"


@pytest.fixture
def cluster(
    request: pytest.FixtureRequest, postgres_server: ResolvedBroker, middleware: str
) -> Iterator[Callable[..., Cluster]]:
    """A factory: ``cluster(n, **env)`` starts ``n`` gateways (``env``: their settings;
    ``instance_env=f``: ``f(i)`` adds instance ``i``'s own)."""
    made: list[Cluster] = []
    dirs: list[Path] = []
    databases = []

    def make(
        n: int = 2, instance_env: Callable[[int], dict[str, str]] | None = None, **env: str
    ) -> Cluster:
        base = Path(tempfile.mkdtemp(prefix="wsnmom-cluster-"))
        dirs.append(base)
        database = fresh_database(postgres_server.url)
        databases.append(database)
        store_url = database.__enter__()
        settings = {
            "WSNMOM_CLUSTER__LEASE": "3",
            "WSNMOM_CLUSTER__HEARTBEAT": "0.5",
            "WSNMOM_CLUSTER__POLL": "0.5",
            **env,
        }
        adapter_url = _adapter_url(request, middleware)
        made.append(Cluster(middleware, store_url, adapter_url, n, settings, base, instance_env))
        made[-1].start()
        return made[-1]

    try:
        yield make
    finally:
        for c in made:
            c.stop()
        for database in databases:
            database.__exit__(None, None, None)
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)


#: ``@pytest.mark.parametrize("middleware", BOTH, indirect=True)``: a test on RabbitMQ and
#: on Kafka
BOTH = [
    pytest.param("rabbitmq", marks=pytest.mark.rabbitmq),
    pytest.param("kafka", marks=pytest.mark.kafka),
]

#: the MQTT cluster (a session per subscription on the session's Mosquitto)
MQTT = pytest.param("mqtt", marks=pytest.mark.mqtt)
#: RabbitMQ, Kafka and MQTT
ALL = [*BOTH, MQTT]
#: RabbitMQ and MQTT
RABBIT_AND_MQTT = [BOTH[0], MQTT]

# the HA suite's assertions live in tests/cluster/ha.py: show their values on failure
pytest.register_assert_rewrite("tests.cluster.ha")
