"""Fixtures of the Spark bridge tests: one local SparkSession for the whole run (a JVM
start costs ~5-10 s; renewed when a test left it unusable), gateways shared by the
bridge tests (waiting for conditions: tests/support/waiting.py; native MQTT publishing:
``mqtt_publisher`` of tests/fixtures/mosquitto.py)."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.spark_session import SparkHolder
from wsnmom.testing.components import missing


def _java_ok() -> str | None:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "no Java runtime (install openjdk-17-jre-headless)"
    return None


@pytest.fixture(scope="session")
def spark_holder() -> Iterator[SparkHolder]:
    """The worker's one ``local[2]`` SparkSession (bridge sources registered), renewed when
    a test left it unusable (tests/support/spark_session.py)."""
    reason = None
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as exc:
        reason = f"the spark extra is not installed ({exc})"
    reason = reason or _java_ok()
    if reason is not None:
        missing(reason)
    holder = SparkHolder("wsnmom-tests", cores=2)
    try:
        yield holder
    finally:
        holder.stop()


@pytest.fixture
def spark(spark_holder: SparkHolder) -> Any:
    """The shared SparkSession, checked (and renewed if need be) before each test."""
    return spark_holder.get()


@pytest.fixture(scope="session")
def rabbit_gateway(rabbitmq_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A gateway on the session's RabbitMQ, shared by the bridge tests."""
    from tests.fixtures.server import RunningServer

    server = RunningServer("rabbitmq", rabbitmq_url, tmp_path_factory.mktemp("gw-rabbit"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def kafka_gateway(kafka_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A gateway on the session's Kafka (its own topic prefix), shared by the bridge tests;
    ``adapter_url`` is also the URL the bridge's Kafka source reads with."""
    from tests.fixtures.server import RunningServer, kafka_gateway_url

    server = RunningServer(
        "kafka", kafka_gateway_url(kafka_url), tmp_path_factory.mktemp("gw-kafka")
    )
    server.start()
    yield server
    server.stop()


def unique_namespace() -> str:
    """A topic namespace of one test (tests share brokers and gateways)."""
    return f"urn:test:spark:{uuid.uuid4().hex[:10]}"
