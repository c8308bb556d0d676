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

import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import requests

from tests.fixtures.brokers import ResolvedBroker
from tests.fixtures.postgres import fresh_database
from tests.fixtures.server import (
    START_TIMEOUT,
    PatientGateway,
    kafka_gateway_url,
    mqtt_gateway_url,
)
from wsnmom.client import WsnClient
from wsnmom.testing.gateway import Gateway, free_port

#: the instance header every response and outbound Notify carries
INSTANCE = "WSNMOM-Instance"
#: seconds a cluster's gateway may take to become ready: the wait ends when it is; on
#: the shared 2-core machine at load 18 to 28 a start took 16 to over 30 s (the Python
#: imports alone 12 s), as long as the suite gateways' (tests/fixtures/server.py)
START = START_TIMEOUT


def stop_together(gateways: list[Gateway], timeout: float = 15.0) -> None:
    """Stop ``gateways`` gracefully at once: SIGTERM to every live one, then wait for each
    (SIGKILL after ``timeout`` seconds).  Stopped one after the other, each instance left
    would take the shards the one before handed back (and open their deliveries) only to
    hand them back in turn; and the stops' hand-overs would be waited for in a row."""
    live = [g for g in gateways if g.running]
    for gateway in live:
        assert gateway.process is not None
        gateway.process.terminate()
    deadline = time.monotonic() + timeout
    for gateway in live:
        assert gateway.process is not None
        try:
            gateway.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            gateway.process.kill()
            gateway.process.wait(5)


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
            gateway.start(START)

    def stop(self) -> None:
        stop_together(self.gateways)

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


class _Clusters:
    """The clusters one fixture started, with their directories and databases;
    :meth:`close` stops and removes them all."""

    def __init__(self, server_url: str) -> None:
        self.server_url = server_url
        self.made: list[Cluster] = []
        self._dirs: list[Path] = []
        self._databases: list[contextlib.AbstractContextManager[str]] = []

    def make(
        self,
        middleware: str,
        adapter_url: str,
        n: int,
        env: dict[str, str],
        instance_env: Callable[[int], dict[str, str]] | None = None,
    ) -> Cluster:
        """Start ``n`` gateways on a fresh database (``env``: their settings)."""
        base = Path(tempfile.mkdtemp(prefix="wsnmom-cluster-"))
        self._dirs.append(base)
        database = fresh_database(self.server_url)
        self._databases.append(database)
        store_url = database.__enter__()
        settings = {
            "WSNMOM_CLUSTER__LEASE": "3",
            "WSNMOM_CLUSTER__HEARTBEAT": "0.5",
            "WSNMOM_CLUSTER__POLL": "0.5",
            **env,
        }
        made = Cluster(middleware, store_url, adapter_url, n, settings, base, instance_env)
        self.made.append(made)
        made.start()
        return made

    def close(self) -> None:
        stop_together([g for c in self.made for g in c.gateways])
        for database in self._databases:
            database.__exit__(None, None, None)
        for d in self._dirs:
            shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def cluster(
    request: pytest.FixtureRequest, postgres_server: ResolvedBroker, middleware: str
) -> Iterator[Callable[..., Cluster]]:
    """A factory: ``cluster(n, **env)`` starts ``n`` gateways (``env``: their settings;
    ``instance_env=f``: ``f(i)`` adds instance ``i``'s own), stopped after the test."""
    clusters = _Clusters(postgres_server.url)

    def make(
        n: int = 2, instance_env: Callable[[int], dict[str, str]] | None = None, **env: str
    ) -> Cluster:
        return clusters.make(middleware, _adapter_url(request, middleware), n, env, instance_env)

    try:
        yield make
    finally:
        clusters.close()


#: a shared cluster's key: middleware, size and settings
_Key = tuple[str, int, tuple[tuple[str, str], ...]]


@pytest.fixture(scope="module")
def _module_clusters(
    postgres_server: ResolvedBroker,
) -> Iterator[tuple[_Clusters, dict[_Key, Cluster]]]:
    """The clusters :func:`shared_cluster` started for one module, by key; stopped when
    the module's tests are done."""
    clusters = _Clusters(postgres_server.url)
    try:
        yield clusters, {}
    finally:
        clusters.close()


@pytest.fixture
def shared_cluster(
    request: pytest.FixtureRequest,
    middleware: str,
    _module_clusters: tuple[_Clusters, dict[_Key, Cluster]],
) -> Callable[..., Cluster]:
    """``shared_cluster(n, **env)``: as ``cluster(n, **env)``, for tests that leave its
    instances as they found them: they send requests (a SIGSTOP shorter than the lease
    is fine), and stop, kill or reconfigure no instance, except a module's last test on
    the cluster, which may kill one (a test finding an instance dead starts a new
    cluster: the order of the tests decides only the saving).  A module's tests on one
    middleware with the same ``n`` and settings share one cluster, started by the first
    of them (a gateway start is most of such a test's time) and stopped after the
    module.  Each test uses topics, consumer paths and names of its own, so that what
    another test left there (its subscriptions, pull points) never reaches what it
    asserts on."""
    clusters, found = _module_clusters

    def make(n: int = 2, **env: str) -> Cluster:
        key = (middleware, n, tuple(sorted(env.items())))
        known = found.get(key)
        if known is None or not all(g.running for g in known.gateways):
            # a test that failed may have left an instance dead: start a new one
            found[key] = clusters.make(middleware, _adapter_url(request, middleware), n, env)
        return found[key]

    return make


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

# the HA suite's assertions live in tests/cluster/ha.py: show their values on failure
pytest.register_assert_rewrite("tests.cluster.ha")
