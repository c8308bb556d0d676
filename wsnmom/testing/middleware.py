"""Middleware for a test gateway: an explicit URL, or a throwaway container.

:func:`resolve_middleware` turns an adapter name into the URL a gateway is started with:

``embedded``, ``filelog``
    nothing to resolve: the middleware lives in the gateway's data directory
    (``embedded://<data_dir>/middleware``, ``filelog://<data_dir>/log``);
a URL (``amqp://…``, ``embedded://…``, any scheme an adapter plugin registers)
    used as it is;
``rabbitmq``
    ``$WSNMOM_TEST_AMQP_URL`` when set; otherwise, when a Docker engine answers, a RabbitMQ
    container started with testcontainers (``pip install testcontainers``) and stopped by
    :meth:`Middleware.close`; otherwise :class:`MiddlewareUnavailable` saying what to do.
``kafka``
    ``kafka://$WSNMOM_TEST_KAFKA_BOOTSTRAP`` when that is set (``host:port[,...]``);
    otherwise a Kafka container in KRaft mode (no ZooKeeper) the same way.
``mqtt``
    ``$WSNMOM_TEST_MQTT_URL`` when set (``mqtt://host:port``); otherwise an
    ``eclipse-mosquitto`` container the same way.

The Docker engine is pinged cheaply before testcontainers is touched, so a machine without
Docker gets a clear message instead of testcontainers' connection errors.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = [
    "KAFKA_IMAGE",
    "MOSQUITTO_IMAGE",
    "RABBITMQ_IMAGE",
    "Middleware",
    "MiddlewareUnavailable",
    "docker_available",
    "import_testcontainer",
    "kafka_container",
    "mosquitto_container",
    "rabbitmq_container",
    "resolve_middleware",
]

#: pinned image for the testcontainers path (the module's default is ``:latest``)
RABBITMQ_IMAGE: Final = "rabbitmq:3.13-alpine"
#: environment variable naming an existing RabbitMQ broker for tests
AMQP_URL_VARIABLE: Final = "WSNMOM_TEST_AMQP_URL"
#: pinned image for Kafka containers (KRaft mode, no ZooKeeper)
KAFKA_IMAGE: Final = "confluentinc/cp-kafka:7.6.1"
#: environment variable naming an existing Kafka cluster for tests (``host:port[,...]``)
KAFKA_BOOTSTRAP_VARIABLE: Final = "WSNMOM_TEST_KAFKA_BOOTSTRAP"
#: pinned image for MQTT broker containers
MOSQUITTO_IMAGE: Final = "eclipse-mosquitto:2.0.20"
#: environment variable naming an existing MQTT broker for tests (``mqtt://host:port``)
MQTT_URL_VARIABLE: Final = "WSNMOM_TEST_MQTT_URL"
#: what to set each variable to, in messages
_EXAMPLES: Final = {
    "rabbitmq": "amqp://user:pass@host:5672/vhost",
    "kafka": "host:9092",
    "mqtt": "mqtt://host:1883",
}
#: adapters whose middleware is a directory of the gateway's: their URL, ``{data_dir}`` filled in
IN_DATA_DIR: Final = {
    "embedded": "embedded://{data_dir}/middleware",
    "filelog": "filelog://{data_dir}/log",
}


class MiddlewareUnavailable(Exception):
    """No middleware could be provided (the message says why and what to do)."""


@dataclass
class Middleware:
    """A middleware to start a gateway on."""

    #: the adapter URL; ``{data_dir}`` in it stands for the gateway's data directory
    url: str
    #: where it came from: "data_dir", "given", "env" or "testcontainers"
    source: str
    _finalizers: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def close(self) -> None:
        """Stop whatever was started for it (a container)."""
        while self._finalizers:
            with contextlib.suppress(Exception):
                self._finalizers.pop()()


def docker_available() -> bool:
    """Whether a Docker engine answers a ping (False without the ``docker`` package)."""
    try:
        # imported by name: the repository's docker/ folder would shadow the package
        # for type checkers run from the checkout
        docker: Any = importlib.import_module("docker")
    except ImportError:
        return False
    try:
        client = docker.from_env(timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


def import_testcontainer(module: str, name: str) -> Any:
    """A testcontainers class, from the 4.15+ (``community``) or the older module layout."""
    for path in (f"testcontainers.community.{module}", f"testcontainers.{module}"):
        try:
            return getattr(importlib.import_module(path), name)
        except (ImportError, AttributeError):
            continue
    raise MiddlewareUnavailable(f"testcontainers has no {module}.{name} (install testcontainers)")


def rabbitmq_container(image: str = RABBITMQ_IMAGE) -> Middleware:
    """A RabbitMQ container (needs a Docker engine and testcontainers)."""
    if not docker_available():
        raise MiddlewareUnavailable("no Docker engine answers")
    container_cls = import_testcontainer("rabbitmq", "RabbitMqContainer")
    container = container_cls(image)
    try:
        container.start()
    except Exception as exc:
        raise MiddlewareUnavailable(f"the RabbitMQ container did not start: {exc}") from None
    host = container.get_container_host_ip()
    port = container.get_exposed_port(container.port)
    middleware = Middleware(f"amqp://guest:guest@{host}:{port}/%2F", "testcontainers")
    middleware._finalizers.append(container.stop)
    return middleware


def kafka_container(image: str = KAFKA_IMAGE) -> Middleware:
    """A Kafka container in KRaft mode (needs a Docker engine and testcontainers)."""
    if not docker_available():
        raise MiddlewareUnavailable("no Docker engine answers")
    container = import_testcontainer("kafka", "KafkaContainer")(image)
    with_kraft = getattr(container, "with_kraft", None)
    if with_kraft is not None:
        container = with_kraft()
    try:
        container.start()
    except Exception as exc:
        raise MiddlewareUnavailable(f"the Kafka container did not start: {exc}") from None
    middleware = Middleware(f"kafka://{container.get_bootstrap_server()}", "testcontainers")
    middleware._finalizers.append(container.stop)
    return middleware


def mosquitto_container(image: str = MOSQUITTO_IMAGE) -> Middleware:
    """An MQTT broker container (needs a Docker engine and testcontainers)."""
    if not docker_available():
        raise MiddlewareUnavailable("no Docker engine answers")
    container = import_testcontainer("mqtt", "MosquittoContainer")(image)
    try:
        container.start()
    except Exception as exc:
        raise MiddlewareUnavailable(f"the MQTT broker container did not start: {exc}") from None
    host = container.get_container_host_ip()
    port = container.get_exposed_port(container.MQTT_PORT)
    middleware = Middleware(f"mqtt://{host}:{port}", "testcontainers")
    middleware._finalizers.append(container.stop)
    return middleware


#: how each middleware with a built-in provider is started in a container
_CONTAINERS: Final = {
    "rabbitmq": rabbitmq_container,
    "kafka": kafka_container,
    "mqtt": mosquitto_container,
}


def _from_env(adapter: str) -> tuple[str, str | None]:
    """The variable that names ``adapter``'s existing middleware, and its adapter URL."""
    if adapter == "rabbitmq":
        return AMQP_URL_VARIABLE, os.environ.get(AMQP_URL_VARIABLE) or None
    if adapter == "mqtt":
        return MQTT_URL_VARIABLE, os.environ.get(MQTT_URL_VARIABLE) or None
    hosts = os.environ.get(KAFKA_BOOTSTRAP_VARIABLE)
    return KAFKA_BOOTSTRAP_VARIABLE, f"kafka://{hosts}" if hosts else None


def resolve_middleware(adapter: str) -> Middleware:
    """The middleware for ``adapter`` (a name or an adapter URL); see the module docstring."""
    if "://" in adapter:
        return Middleware(adapter, "given")
    if adapter in IN_DATA_DIR:
        return Middleware(IN_DATA_DIR[adapter], "data_dir")
    if adapter in _CONTAINERS:
        variable, url = _from_env(adapter)
        if url:
            return Middleware(url, "env")
        try:
            return _CONTAINERS[adapter]()
        except MiddlewareUnavailable as exc:
            raise MiddlewareUnavailable(
                f"no {adapter} middleware for the gateway: {variable} is not set and a "
                f"container cannot be started ({exc}); set {variable}={_EXAMPLES[adapter]} or "
                "start a Docker engine"
            ) from None
    raise MiddlewareUnavailable(
        f"no built-in way to provide middleware for adapter {adapter!r}: use embedded, "
        "filelog, rabbitmq, kafka or mqtt, or pass its adapter URL (for example "
        "mqtt://host:1883, kafka://host:9092 or amqp://user:pass@host:5672/vhost)"
    )
