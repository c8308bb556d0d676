"""``wsnmom.testing``: the gateway other projects test against (``start_gateway``, the
``wsnmom_gateway`` pytest fixture, docs/testing.md's examples) and where its middleware
comes from."""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support.threads import serve
from wsnmom.client import NotificationConsumer
from wsnmom.testing import middleware
from wsnmom.testing.gateway import (
    Gateway,
    GatewayFailed,
    free_port,
    listens_on,
    start_gateway,
)
from wsnmom.testing.middleware import MiddlewareUnavailable, resolve_middleware

DOC = Path(__file__).resolve().parents[2] / "docs" / "testing.md"


def _doc_block(marker: str) -> str:
    """The python block of docs/testing.md whose first line is ``# <marker>``."""
    for block in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S):
        if block.startswith(f"# {marker}\n"):
            return str(block)
    raise AssertionError(f"no '# {marker}' block in {DOC}")


def test_start_gateway_embedded_with_settings() -> None:
    with start_gateway("embedded", env={"WSNMOM_TERMINATION__DEFAULT": "PT2M"}) as gateway:
        assert gateway.running and gateway.data_dir.is_dir()
        assert gateway.broker_url == f"http://127.0.0.1:{gateway.port}/wsn/broker"
        assert gateway.adapter_url.startswith("embedded://")
        with gateway.client(namespaces={"t": "urn:t"}) as wsn, NotificationConsumer() as inbox:
            sub = wsn.subscribe(inbox, "t:x")
            assert sub.termination_time is not None
            expected = datetime.now(UTC) + timedelta(minutes=2)
            assert abs(sub.termination_time - expected) < timedelta(seconds=30)
            gateway.restart()
            wsn.notify("<after-restart/>", "t:x")
            assert inbox.get(timeout=10).payload.tag == "after-restart"
        assert "wsnmom broker at" in gateway.log_tail()
    assert not gateway.running
    assert not gateway.data_dir.exists()


def test_start_gateway_keeps_a_given_data_dir(tmp_path: Path) -> None:
    with start_gateway("filelog", data_dir=tmp_path / "gw") as gateway:
        assert gateway.adapter_url == f"filelog://{tmp_path / 'gw'}/log"
        with gateway.client(namespaces={"t": "urn:t"}) as wsn, NotificationConsumer() as inbox:
            wsn.subscribe(inbox, "t:x")
            wsn.notify("<on-filelog/>", "t:x")
            assert inbox.get(timeout=10).payload.tag == "on-filelog"
    assert gateway.log_path.is_file() and (tmp_path / "gw" / "store.db").is_file()


@pytest.mark.rabbitmq
def test_start_gateway_on_rabbitmq(rabbitmq_url: str) -> None:
    with start_gateway(rabbitmq_url) as gateway:
        assert gateway.adapter == "amqp" and gateway.adapter_url == rabbitmq_url
        with gateway.client(namespaces={"t": "urn:t"}) as wsn, NotificationConsumer() as inbox:
            wsn.subscribe(inbox, "t:rabbit")
            wsn.notify("<via-rabbit/>", "t:rabbit")
            assert inbox.get(timeout=10).payload.tag == "via-rabbit"


def test_a_gateway_that_does_not_start_says_why(tmp_path: Path) -> None:
    failing = start_gateway("nosuchscheme://x", data_dir=tmp_path, timeout=20)
    with pytest.raises(GatewayFailed, match="wsnmom serve exited") as info, failing:
        pass  # pragma: no cover
    assert "nosuchscheme" in str(info.value)


# --- middleware -------------------------------------------------------------------------------
def test_middleware_names_and_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_middleware("embedded").url == "embedded://{data_dir}/middleware"
    assert resolve_middleware("filelog").url == "filelog://{data_dir}/log"
    given = resolve_middleware("amqp://u:p@127.0.0.1:5/v")
    assert (given.url, given.source) == ("amqp://u:p@127.0.0.1:5/v", "given")
    monkeypatch.setenv("WSNMOM_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
    from_env = resolve_middleware("rabbitmq")
    assert (from_env.url, from_env.source) == (
        "amqp://guest:guest@127.0.0.1:5672/%2F",
        "env",
    )
    monkeypatch.setenv("WSNMOM_TEST_KAFKA_BOOTSTRAP", "127.0.0.1:9092,127.0.0.1:9093")
    kafka = resolve_middleware("kafka")
    assert (kafka.url, kafka.source) == ("kafka://127.0.0.1:9092,127.0.0.1:9093", "env")
    monkeypatch.setenv("WSNMOM_TEST_MQTT_URL", "mqtt://127.0.0.1:1883")
    mqtt = resolve_middleware("mqtt")
    assert (mqtt.url, mqtt.source) == ("mqtt://127.0.0.1:1883", "env")
    with pytest.raises(MiddlewareUnavailable, match="pass its adapter URL") as info:
        resolve_middleware("nosuch")
    assert "mqtt://host:1883" in str(info.value)


@pytest.mark.parametrize(
    ("name", "variable"),
    [
        ("rabbitmq", "WSNMOM_TEST_AMQP_URL"),
        ("kafka", "WSNMOM_TEST_KAFKA_BOOTSTRAP"),
        ("mqtt", "WSNMOM_TEST_MQTT_URL"),
    ],
)
def test_without_env_or_docker_says_what_to_do(
    monkeypatch: pytest.MonkeyPatch, name: str, variable: str
) -> None:
    monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(middleware, "docker_available", lambda: False)
    with pytest.raises(MiddlewareUnavailable) as info:
        resolve_middleware(name)
    message = str(info.value)
    assert f"no {name} middleware" in message and variable in message and "Docker" in message
    if name == "mqtt":  # the hint is an MQTT URL
        assert f"{variable}=mqtt://host:1883" in message and "amqp" not in message


class _StandInContainer:
    """Records what the testcontainers path does with a container (no Docker here)."""

    made: list[_StandInContainer] = []

    def __init__(self, image: str) -> None:
        self.image, self.port, self.events = image, 5672, ["made"]
        _StandInContainer.made.append(self)

    def start(self) -> None:
        self.events.append("start")

    def stop(self) -> None:
        self.events.append("stop")

    def get_container_host_ip(self) -> str:
        return "127.0.0.1"

    def get_exposed_port(self, port: int) -> int:
        return 40000 + port % 1000


def test_testcontainers_code_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WSNMOM_TEST_AMQP_URL", raising=False)
    monkeypatch.setattr(middleware, "docker_available", lambda: True)
    monkeypatch.setattr(middleware, "import_testcontainer", lambda m, n: _StandInContainer)
    found = resolve_middleware("rabbitmq")
    (container,) = _StandInContainer.made
    assert container.image == middleware.RABBITMQ_IMAGE == "rabbitmq:3.13-alpine"
    assert (found.url, found.source) == ("amqp://guest:guest@127.0.0.1:40672/%2F", "testcontainers")
    found.close()
    found.close()
    assert container.events == ["made", "start", "stop"]


class _StandInKafka:
    """A testcontainers KafkaContainer as far as the code path uses it."""

    made: list[_StandInKafka] = []

    def __init__(self, image: str) -> None:
        self.image, self.kraft, self.events = image, False, ["made"]
        _StandInKafka.made.append(self)

    def with_kraft(self) -> _StandInKafka:
        self.kraft = True
        return self

    def start(self) -> None:
        self.events.append("start")

    def stop(self) -> None:
        self.events.append("stop")

    def get_bootstrap_server(self) -> str:
        return "127.0.0.1:49092"


def test_kafka_testcontainers_code_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WSNMOM_TEST_KAFKA_BOOTSTRAP", raising=False)
    monkeypatch.setattr(middleware, "docker_available", lambda: True)
    monkeypatch.setattr(middleware, "import_testcontainer", lambda m, n: _StandInKafka)
    found = resolve_middleware("kafka")
    (container,) = _StandInKafka.made
    assert container.image == middleware.KAFKA_IMAGE and container.kraft
    assert (found.url, found.source) == ("kafka://127.0.0.1:49092", "testcontainers")
    found.close()
    assert container.events == ["made", "start", "stop"]


# --- the pytest plugin ------------------------------------------------------------------------
@pytest.fixture
def project(pytester: pytest.Pytester) -> Iterator[pytest.Pytester]:
    pytester.makeconftest(_doc_block("conftest.py"))
    pytester.makepyfile(test_alarms=_doc_block("test_alarms.py"))
    yield pytester


def test_fixture_runs_the_documented_example(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CI", raising=False)
    result = project.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


@pytest.mark.parametrize(("ci", "outcome"), [("", {"skipped": 1}), ("true", {"errors": 1})])
def test_fixture_without_middleware(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: str, outcome: dict[str, Any]
) -> None:
    monkeypatch.setenv("CI", ci)
    # in this process: the fixture fails before it starts anything, and
    # test_fixture_runs_the_documented_example runs the plugin in a process of its own
    result = project.runpytest_inprocess(
        "-p", "no:cacheprovider", "-rA", "--wsnmom-adapter", "nosuch"
    )
    result.assert_outcomes(**outcome)
    result.stdout.fnmatch_lines(["*wsnmom_gateway: no built-in way to provide middleware*"])


@pytest.mark.mqtt
def test_fixture_runs_the_documented_example_on_mqtt(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, mqtt_url: str
) -> None:
    """``--wsnmom-adapter mqtt`` with ``WSNMOM_TEST_MQTT_URL``, as the README names it."""
    monkeypatch.setenv("WSNMOM_TEST_MQTT_URL", mqtt_url)
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "--wsnmom-adapter", "mqtt")
    result.assert_outcomes(passed=1)


# --- ports ------------------------------------------------------------------------------------
@pytest.fixture
def occupied() -> Iterator[Callable[[int], None]]:
    """Listen on given ports (as another program would) until the test ends."""
    sockets: list[socket.socket] = []

    def occupy(port: int) -> None:
        s = socket.socket()
        s.bind(("127.0.0.1", port))
        s.listen()
        sockets.append(s)

    yield occupy
    for s in sockets:
        s.close()


def test_a_first_start_moves_off_a_taken_port_a_restart_does_not(
    tmp_path: Path, occupied: Callable[[int], None]
) -> None:
    gateway = Gateway("embedded", f"embedded://{tmp_path / 'mw'}", tmp_path)
    taken = gateway.port
    occupied(taken)  # taken between picking the port and binding it
    try:
        gateway.start()
        assert gateway.running and gateway.port != taken
        assert requests.get(gateway.base_url + "/healthz", timeout=5).status_code == 200
        assert "already in use" in gateway.log_tail()
        moved = gateway.port
        gateway.stop()
        occupied(moved)
        with pytest.raises(GatewayFailed, match="wsnmom serve exited"):
            gateway.start()  # a restart keeps its port: the gateway's addresses hold it
        assert gateway.port == moved and gateway.port_taken()
    finally:
        gateway.stop()


def test_a_given_port_never_moves(tmp_path: Path, occupied: Callable[[int], None]) -> None:
    port = free_port()
    occupied(port)
    gateway = Gateway("embedded", f"embedded://{tmp_path / 'mw'}", tmp_path, port)
    with pytest.raises(GatewayFailed, match="wsnmom serve exited"):
        gateway.start()
    assert gateway.port == port and gateway.port_taken() and not gateway.running


def test_another_server_answering_on_the_port_is_not_taken_for_the_gateway(
    tmp_path: Path,
) -> None:
    """A port picked as free may be taken by another HTTP server before the gateway binds
    it; that server's 200 to ``/readyz`` must not count as the gateway being ready (seen in
    CI: the test then spoke to the other server and got an empty answer to Subscribe)."""

    class Ready(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    other = ThreadingHTTPServer(("127.0.0.1", 0), Ready)
    serve(other)
    try:
        port = other.server_address[1]
        assert requests.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200
        gateway = Gateway("embedded", f"embedded://{tmp_path / 'mw'}", tmp_path, port)
        with pytest.raises(GatewayFailed, match="wsnmom serve exited"):
            gateway.start()
        assert gateway.port_taken() and not gateway.running
    finally:
        other.shutdown()
        other.server_close()


def test_listens_on_sees_only_the_listening_process() -> None:
    with socket.socket() as listening, socket.socket() as bound_only:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        bound_only.bind(("127.0.0.1", 0))
        assert listens_on(os.getpid(), listening.getsockname()[1])
        assert not listens_on(os.getpid(), bound_only.getsockname()[1])
        assert not listens_on(os.getppid(), listening.getsockname()[1])
