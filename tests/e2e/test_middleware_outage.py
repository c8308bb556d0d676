"""The gateway while its middleware is down (`[middleware]` in docs/configuration.md), against
a private RabbitMQ node that the tests stop and start: operations that need the middleware
answer a SOAP Receiver fault (ResourceUnavailableFault) with HTTP 503 and Retry-After within
seconds, whose text and ``/readyz`` name the cause (the broker closed the connection, then
refused new ones), a burst of them leaves the gateway responsive, nothing acknowledged is
lost, and a gateway started before its node serves once the node is up."""

from __future__ import annotations

import concurrent.futures
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests

from tests.fixtures.brokers import RabbitNode
from tests.fixtures.server import ConsumerServer, RunningServer
from tests.support.soap import content_type, envelope, fault_name, notify_body, subscribe_body
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.rabbitmq, pytest.mark.e2e]

#: short grace and reconnect delays so the tests see both sides of an outage quickly
OUTAGE_ENV = {
    "WSNMOM_MIDDLEWARE__GRACE": "1",
    "WSNMOM_MIDDLEWARE__RETRY_AFTER": "3",
    "WSNMOM_ADAPTER_OPTIONS__RECONNECT_MAX_DELAY": "0.5",
    "WSNMOM_ADAPTER_OPTIONS__OPERATION_TIMEOUT": "2",
    "WSNMOM_ADAPTER_OPTIONS__HEARTBEAT": "2",
}


def outage_gateway(rabbitmq_node: RabbitNode) -> Iterator[RunningServer]:
    """A gateway (not started) on the session's node with ``OUTAGE_ENV``; the node runs
    again afterwards, whatever the test did."""
    data_dir = Path(tempfile.mkdtemp(prefix="wsnmom-outage-"))
    server = RunningServer("rabbitmq", rabbitmq_node.url, data_dir, extra_env=OUTAGE_ENV)
    try:
        yield server
    finally:
        server.stop()
        rabbitmq_node.start()  # whatever the test did, the node runs again for the others


@pytest.fixture
def gateway(rabbitmq_node: RabbitNode) -> Iterator[RunningServer]:
    yield from outage_gateway(rabbitmq_node)


@pytest.fixture
def late_gateway(rabbitmq_node: RabbitNode) -> Iterator[RunningServer]:
    """A second gateway, started by the test while the node is down."""
    yield from outage_gateway(rabbitmq_node)


def post(url: str, body: str, timeout: float = 30.0) -> requests.Response:
    return requests.post(
        url,
        data=envelope(body),
        headers={"Content-Type": content_type()},
        timeout=timeout,
    )


def wait_status(url: str, status: int, timeout: float) -> None:
    wait_until(
        lambda: requests.get(url, timeout=1).status_code == status,
        timeout,
        what=f"{url} to answer {status}",
        interval=0.1,
        errors=(requests.RequestException,),
    )


def readyz_body(url: str) -> str:
    """The text ``/readyz`` answers (any status)."""
    return requests.get(f"{url}/readyz", timeout=5).text


def assert_unavailable(resp: requests.Response) -> None:
    assert resp.status_code == 503, resp.content
    assert resp.headers.get("Retry-After") == "3"
    assert fault_name(resp.content) == "ResourceUnavailableFault"
    assert b"Receiver" in resp.content


def test_outage_faults_fast_keeps_serving_and_loses_nothing(
    gateway: RunningServer,
    late_gateway: RunningServer,
    rabbitmq_node: RabbitNode,
    consumer: ConsumerServer,
    consumer_factory: Callable[[], ConsumerServer],
) -> None:
    """An outage of a gateway's node, and (in the same outage: one node stop and start
    less) a second gateway started while its node is down, which serves once it is up."""
    gateway.start()
    ns = f"urn:test:{uuid.uuid4().hex[:12]}"
    broker = gateway.broker_url
    resp = post(broker, subscribe_body(consumer.address(), "tns:t", ns=ns))
    assert resp.status_code == 200, resp.content
    accepted: list[str] = []

    def notify(text: str) -> requests.Response:
        return post(broker, notify_body(("tns:t", f"<m>{text}</m>"), ns=ns))

    for i in range(5):
        assert notify(f"before{i}").status_code == 202
        accepted.append(f"before{i}")

    rabbitmq_node.stop()
    wait_status(f"{gateway.base_url}/readyz", 503, 30)
    # /readyz names the missing dependency and why: the node closed the connections as it
    # stopped (CONNECTION_FORCED), then refused the reconnections
    refused = f"cannot connect to RabbitMQ at amqp://127.0.0.1:{rabbitmq_node.port}/"
    # the body checked is the one that said so (the reason may change between reads)
    body = wait_until(
        lambda: text if refused in (text := readyz_body(gateway.base_url)) else None,
        20,
        what="/readyz to say that RabbitMQ refuses connections",
        interval=0.1,
    )
    first, *fields = body.splitlines()
    assert first == "not ready: the middleware does not answer", body
    assert [f for f in fields if f.startswith("middleware: rabbitmq: ")] == fields[:1], body
    assert "connection refused" in fields[0] and "CONNECTION_FORCED" in fields[0], body
    assert "guest" not in body, body  # no credentials (the URL's user and password)
    # each operation that needs the middleware answers a fault within 5 s
    for body in (
        notify_body(("tns:t", "<m>during</m>"), ns=ns),
        subscribe_body(consumer.address(), "tns:t", ns=ns),
        "<wsnt:CreatePullPoint/>",
    ):
        started = time.monotonic()
        resp = post(broker, body)
        assert time.monotonic() - started < 5
        assert_unavailable(resp)
        # which middleware (before: "the middleware is not reachable") and why
        assert b"the middleware (rabbitmq) is not reachable: " in resp.content, resp.content
        assert refused.encode() in resp.content, resp.content
        assert b"connection refused" in resp.content, resp.content
        assert b"CONNECTION_FORCED" in resp.content, resp.content
        assert b"guest" not in resp.content, resp.content

    # 30 concurrent Notifies leave /healthz answering within a second
    with concurrent.futures.ThreadPoolExecutor(30) as pool:
        burst = [pool.submit(notify, f"burst{i}") for i in range(30)]
        slowest = 0.0
        while not all(f.done() for f in burst):
            started = time.monotonic()
            assert requests.get(f"{gateway.base_url}/healthz", timeout=5).status_code == 200
            slowest = max(slowest, time.monotonic() - started)
            time.sleep(0.05)
        results = [f.result() for f in burst]
    assert slowest < 1.0, slowest
    for resp in results:
        assert_unavailable(resp)

    # a gateway started before its node is up: alive, not ready, faults what needs the node
    late_gateway.start(wait_for="/healthz")
    assert requests.get(f"{late_gateway.base_url}/readyz", timeout=5).status_code == 503
    wait_until(
        lambda: f"middleware: rabbitmq: {refused}" in readyz_body(late_gateway.base_url),
        20,
        what="/readyz of the gateway started first to say that RabbitMQ refuses connections",
        interval=0.1,
    )
    late_consumer = consumer_factory()
    late, late_ns = late_gateway.broker_url, f"urn:test:{uuid.uuid4().hex[:12]}"
    assert_unavailable(post(late, notify_body(("tns:t", "<m>early</m>"), ns=late_ns)))
    assert_unavailable(post(late, subscribe_body(late_consumer.address(), "tns:t", ns=late_ns)))

    rabbitmq_node.start()
    wait_status(f"{gateway.base_url}/readyz", 200, 60)
    # each /readyz asks RabbitMQ again: "ready" in one answer after the 200, not the next
    wait_until(lambda: readyz_body(gateway.base_url) == "ready\n", 10, what="/readyz: ready")
    deadline = time.monotonic() + 30
    while True:  # the consuming side may need a moment more than the readiness check
        resp = notify("after0")
        if resp.status_code == 202 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert resp.status_code == 202, resp.content
    accepted.append("after0")
    for i in range(1, 5):
        assert notify(f"after{i}").status_code == 202
        accepted.append(f"after{i}")

    # every notification the gateway acknowledged reaches the subscriber
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        got = {m.findtext("{*}Message/{*}m") for m in consumer.messages()}
        if set(accepted) <= got:
            break
        time.sleep(0.2)
    got = {m.findtext("{*}Message/{*}m") for m in consumer.messages()}
    assert set(accepted) <= got, sorted(set(accepted) - got)
    assert not {g for g in got if g and g.startswith(("during", "burst"))}

    # the log says each connection's state changes once each, and nothing of pika's
    lines = gateway.log_path.read_text().splitlines()
    assert not [ln for ln in lines if " pika" in ln]
    for link in ("publisher", "consumer"):
        said = [ln.split(f"{link}: ", 1)[1] for ln in lines if f"rabbitmq: {link}: " in ln]
        assert sum(m.startswith("connection to RabbitMQ lost") for m in said) == 1, said
        assert sum(m.startswith("cannot connect to RabbitMQ (retrying)") for m in said) <= 1
        assert sum(m == "connected to RabbitMQ again" for m in said) == 1, said

    # the gateway started before its node serves once the node is up
    wait_status(f"{late_gateway.base_url}/readyz", 200, 60)
    resp = post(late, subscribe_body(late_consumer.address(), "tns:t", ns=late_ns))
    assert resp.status_code == 200, resp.content
    assert post(late, notify_body(("tns:t", "<m>late</m>"), ns=late_ns)).status_code == 202
    got_late = late_consumer.wait_for_messages(1, 20)
    assert [m.findtext("{*}Message/{*}m") for m in got_late] == ["late"]


def test_overloaded_node_is_refused_as_overloaded_not_unreachable(
    rabbitmq_node: RabbitNode,
) -> None:
    """A node that stops answering while its connections stay open (SIGSTOP: overload as
    the gateway sees it) gets the overload fault: 503, ResourceUnavailableFault, a
    Retry-After, and a text that does not say "not reachable"; the connections are kept
    and the gateway serves as soon as the node answers again (issue 29)."""
    data_dir = Path(tempfile.mkdtemp(prefix="wsnmom-overload-"))
    server = RunningServer(
        "rabbitmq",
        rabbitmq_node.url,
        data_dir,
        # the default heartbeat (30 s) outlasts the pause: the connection is not lost
        extra_env={"WSNMOM_ADAPTER_OPTIONS__OPERATION_TIMEOUT": "1"},
    )
    server.start()
    try:
        rabbitmq_node.pause()
        try:
            started = time.monotonic()
            resp = post(server.broker_url, "<wsnt:CreatePullPoint/>")
            assert time.monotonic() - started < 10
        finally:
            rabbitmq_node.resume()
        assert resp.status_code == 503, resp.content
        assert int(resp.headers["Retry-After"]) >= 1
        assert fault_name(resp.content) == "ResourceUnavailableFault"
        assert b"Receiver" in resp.content
        assert b"overloaded" in resp.content
        assert b"not reachable" not in resp.content
        deadline = time.monotonic() + 30
        while (resp := post(server.broker_url, "<wsnt:CreatePullPoint/>")).status_code != 200:
            assert time.monotonic() < deadline, resp.content
            time.sleep(0.2)
        lines = server.log_path.read_text().splitlines()
        assert not [ln for ln in lines if "connection to RabbitMQ lost" in ln]
    finally:
        rabbitmq_node.resume()
        server.stop()
