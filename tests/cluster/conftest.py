"""Gateway processes sharing one PostgreSQL store and one RabbitMQ as one broker.

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
from wsnmom.client import WsnClient
from wsnmom.testing.gateway import Gateway, free_port

#: the instance header every response and outbound Notify carries
INSTANCE = "WSNMOM-Instance"


class Cluster:
    """``n`` gateways on one store and one RabbitMQ (see the module docstring)."""

    def __init__(
        self, store_url: str, adapter_url: str, n: int, env: dict[str, str], base: Path
    ) -> None:
        self.public_url = f"http://127.0.0.1:{free_port()}"
        self.gateways: list[Gateway] = []
        for i in range(n):
            gateway = Gateway(
                "rabbitmq",
                adapter_url,
                base / f"g{i}",
                store_url=store_url,
                extra_env={
                    "WSNMOM_PUBLIC_URL": self.public_url,
                    "WSNMOM_CLUSTER__INSTANCE_ID": f"g{i}",
                    **env,
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
def cluster(postgres_server: ResolvedBroker, rabbitmq_url: str) -> Iterator[Callable[..., Cluster]]:
    """A factory: ``cluster(n, **env)`` starts ``n`` gateways (``env``: their settings)."""
    made: list[Cluster] = []
    dirs: list[Path] = []
    databases = []

    def make(n: int = 2, **env: str) -> Cluster:
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
        # on a shared store the RabbitMQ adapter reads pull points with basic.get by
        # itself (its cluster_options), so that every instance answers for every pull
        # point (docs/scale-out.md): the URL does not say so
        made.append(Cluster(store_url, rabbitmq_url, n, settings, base))
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
