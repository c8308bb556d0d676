"""The gateway on MQTT over HTTP, beyond the shared e2e suite: native interop both ways with
plain paho clients (MQTT 5 and 3.1.1, non-XML bodies included), GetCurrentMessage of
retained messages (one retained by a native client too), a paused subscription that
accumulates more than 1,000 messages, Mosquitto restarted under a running stream, and the
gateway killed (SIGKILL) in the middle of a native stream."""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests
from lxml import etree

pytest.importorskip("paho.mqtt")

import paho.mqtt.client as mqtt

from tests.e2e.conftest import Wsn
from tests.fixtures.mosquitto import MosquittoNode, close_client, native_client
from tests.fixtures.server import (
    ConsumerServer,
    RunningServer,
    free_port,
    mqtt_gateway_url,
)
from tests.support.soap import (
    CONCRETE,
    NATIVE_BODIES,
    NS,
    WSNMOM,
    check_native_bodies,
    subscribe_body,
)
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.mqtt]

#: WS topics of this namespace are the MQTT topics after the gateway's prefix
NATIVE = "urn:wsnmom:native"
SOAP12 = "http://www.w3.org/2003/05/soap-envelope"


def start_gateway(url: str, data_dir: Path | None = None, **env: str) -> RunningServer:
    directory = data_dir or Path(tempfile.mkdtemp(prefix="wsnmom-mqtt-e2e-"))
    server = RunningServer("mqtt", url, directory, free_port(), extra_env=dict(env))
    server.start()
    return server


def stop_gateway(server: RunningServer) -> None:
    server.stop()
    shutil.rmtree(server.data_dir, ignore_errors=True)


@pytest.fixture(scope="module", params=["5", "3.1.1"], ids=["gateway-mqtt5", "gateway-mqtt311"])
def tagged(request: pytest.FixtureRequest, mqtt_url: str) -> Iterator[tuple[RunningServer, str]]:
    """A gateway of this module (MQTT 5 or 3.1.1 to the broker) and its topic prefix."""
    tag = uuid.uuid4().hex[:10]
    server = start_gateway(mqtt_gateway_url(mqtt_url, tag) + f"&protocol={request.param}")
    server.extra_env["protocol"] = request.param  # only for the tests to read
    try:
        yield server, f"g{tag}"
    finally:
        stop_gateway(server)


def protocol_of(server: RunningServer) -> str:
    return server.extra_env["protocol"]


def concrete(wsn: Wsn, consumer: str, path: str) -> str:
    return wsn.subscribe(consumer, f"tns:{path}", dialect=CONCRETE).address


# -- interop ------------------------------------------------------------------------------


@pytest.mark.parametrize("client_protocol", ["5", "3.1.1"])
def test_native_messages_reach_ws_n_consumers(
    tagged: tuple[RunningServer, str],
    mqtt_url: str,
    consumer: ConsumerServer,
    client_protocol: str,
) -> None:
    server, prefix = tagged
    wsn = Wsn(server, NATIVE)
    path = f"orders/o{uuid.uuid4().hex[:6]}"
    concrete(wsn, consumer.address(), path)
    client = native_client(mqtt_url, client_protocol)
    try:
        for body in NATIVE_BODIES:
            client.publish(f"{prefix}/{path}", body, qos=1).wait_for_publish(5)
    finally:
        close_client(client)
    check_native_bodies(consumer.wait_for_messages(3, timeout=15), path)


@pytest.mark.parametrize("client_protocol", ["5", "3.1.1"])
def test_notify_reaches_native_subscribers(
    tagged: tuple[RunningServer, str], mqtt_url: str, client_protocol: str
) -> None:
    server, prefix = tagged
    wsn = Wsn(server, NATIVE)
    path = f"orders/o{uuid.uuid4().hex[:6]}"
    got: list[mqtt.MQTTMessage] = []
    arrived = threading.Event()

    def on_message(client: mqtt.Client, userdata: object, message: mqtt.MQTTMessage) -> None:
        got.append(message)
        arrived.set()

    subscribed = threading.Event()
    client = native_client(mqtt_url, client_protocol)
    client.on_message = on_message
    client.on_subscribe = lambda *args: subscribed.set()
    try:
        client.subscribe(f"{prefix}/{path}", qos=1)
        assert subscribed.wait(10)  # the SUBACK: the broker routes to the subscriber now
        wsn.notify((f"tns:{path}", '<s xmlns="urn:o">42</s>'), dialect=CONCRETE)
        assert arrived.wait(10)
    finally:
        close_client(client)
    (message,) = got
    body = etree.fromstring(message.payload)
    assert (body.tag, body.text) == ("{urn:o}s", "42")
    if protocol_of(server) == "5" and client_protocol == "5":
        props = dict(message.properties.UserProperty)
        assert props["wsnmom-topic-ns"] == NATIVE
        assert props["wsnmom-topic-path"] == path
        assert message.properties.ContentType == "application/xml"
        assert message.properties.PayloadFormatIndicator == 1


def test_a_topic_mqtt_cannot_name_is_a_sender_fault(
    tagged: tuple[RunningServer, str], consumer: ConsumerServer
) -> None:
    """A topic whose MQTT name would exceed 65,535 bytes: TopicNotSupportedFault (Sender)
    to Notify and Subscribe alike (it was SubscribeCreationFailedFault, Receiver, "the
    middleware refused", for the Subscribe), with a schema-valid detail."""
    server, _ = tagged
    wsn = Wsn(server, NATIVE)
    topic = "tns:" + "x" * 70_000
    notify = (
        f'<wsnt:Notify><wsnt:NotificationMessage><wsnt:Topic xmlns:tns="{NATIVE}" '
        f'Dialect="{CONCRETE}">{topic}</wsnt:Topic><wsnt:Message><x/></wsnt:Message>'
        "</wsnt:NotificationMessage></wsnt:Notify>"
    )
    # the module's gateway served other tests before: only what it logged from here on
    logged_before = len(server.log_path.read_bytes())
    for body in (notify, subscribe_body(consumer.address(), topic, ns=NATIVE)):
        answer = wsn.post(wsn.broker, body)  # validates the fault's detail
        assert (answer.status, answer.fault) == (500, "TopicNotSupportedFault"), answer.data
        code = etree.fromstring(answer.data).findtext(f".//{{{SOAP12}}}Code/{{{SOAP12}}}Value")
        assert code is not None and code.endswith(":Sender"), answer.data
    assert b"Traceback" not in server.log_path.read_bytes()[logged_before:]


# -- retained messages ----------------------------------------------------------------------


def test_get_current_message_reads_retained_messages(
    tagged: tuple[RunningServer, str], mqtt_url: str, consumer: ConsumerServer
) -> None:
    server, prefix = tagged
    wsn = Wsn(server, NATIVE)
    path = f"door/d{uuid.uuid4().hex[:6]}"
    gcm = (
        f'<wsnt:GetCurrentMessage><wsnt:Topic xmlns:tns="{NATIVE}" Dialect="{CONCRETE}">'
        f"tns:{path}</wsnt:Topic></wsnt:GetCurrentMessage>"
    )
    assert wsn.post(wsn.broker, gcm).fault == "NoCurrentMessageOnTopicFault"
    client = native_client(mqtt_url)
    try:
        info = client.publish(f"{prefix}/{path}", b'{"open": true}', qos=1, retain=True)
        info.wait_for_publish(5)
    finally:
        close_client(client)
    current = wsn.post(wsn.broker, gcm).ok()
    wrapper = current.find(f"{{{WSNMOM}}}NativeMessage")
    assert wrapper is not None and json.loads(wrapper.text or "") == {"open": True}
    # a new subscription does not get the retained message as a notification
    concrete(wsn, consumer.address(), path)
    wsn.notify((f"tns:{path}", '<state xmlns="urn:d">closed</state>'), dialect=CONCRETE)
    # the barrier: the Notify after the subscription comes after a retained message would
    messages = wait_until(
        lambda: (
            (got := consumer.messages())
            and got[-1].find("wsnt:Message/{urn:d}state", NS) is not None
            and got
        ),
        10,
        what="the notification after the subscription",
    )
    assert len(messages) == 1
    current = wsn.post(wsn.broker, gcm).ok()
    assert current.findtext("{urn:d}state") == "closed"


# -- accumulation -------------------------------------------------------------------------


def test_paused_subscription_gets_more_than_a_thousand_on_resume(
    tagged: tuple[RunningServer, str], consumer: ConsumerServer
) -> None:
    server, _ = tagged
    if protocol_of(server) != "5":
        pytest.skip("the gateway's queues behave alike on MQTT 3.1.1")
    wsn = Wsn(server, f"urn:test:{uuid.uuid4().hex[:8]}")
    sub = wsn.subscribe(consumer.address(), "tns:burst")
    wsn.post(sub.address, "<wsnt:PauseSubscription/>").ok()
    witness = wsn.subscribe(consumer.address(), "tns:burst")  # the barrier
    total = 1_200
    for start in range(0, total, 100):
        wsn.notify(*[("tns:burst", f'<n xmlns="urn:n">{i}</n>') for i in range(start, start + 100)])
    wsn.notify(("tns:burst", "<sentinel/>"))
    consumer.wait_for_sentinel(witness.address, timeout=60)
    assert consumer.messages_for(sub.address) == []
    wsn.post(sub.address, "<wsnt:ResumeSubscription/>").ok()
    messages = consumer.wait_for_sentinel(sub.address, timeout=60)
    numbers = [int(m.findtext("wsnt:Message/{urn:n}n", namespaces=NS) or -1) for m in messages]
    assert list(dict.fromkeys(numbers)) == [*range(total), -1]  # -1: the sentinel, last


# -- the broker and the gateway going away --------------------------------------------------


def numbers_at(consumer: ConsumerServer) -> set[int]:
    return {
        int(m.findtext("wsnt:Message/{urn:n}n", namespaces=NS) or -1) for m in consumer.messages()
    }


@pytest.mark.slow
def test_mosquitto_restart_mid_stream_loses_nothing_acknowledged(
    mosquitto_factory: Callable[..., MosquittoNode], consumer: ConsumerServer
) -> None:
    node = mosquitto_factory()
    server = start_gateway(mqtt_gateway_url(node.url), WSNMOM_MIDDLEWARE__GRACE="1")
    try:
        wsn = Wsn(server, f"urn:test:{uuid.uuid4().hex[:8]}")
        wsn.subscribe(consumer.address(), "tns:stream")
        acked: list[int] = []
        refused: list[float] = []
        stop = threading.Event()

        def publish() -> None:
            i = 0
            while not stop.is_set():
                started = time.monotonic()
                answer = wsn.post(
                    wsn.broker,
                    f'<wsnt:Notify><wsnt:NotificationMessage><wsnt:Topic xmlns:tns="{wsn.ns}" '
                    'Dialect="http://docs.oasis-open.org/wsn/t-1/TopicExpression/Simple">'
                    f'tns:stream</wsnt:Topic><wsnt:Message><n xmlns="urn:n">{i}</n>'
                    "</wsnt:Message></wsnt:NotificationMessage></wsnt:Notify>",
                )
                if answer.status == 202:
                    acked.append(i)
                else:
                    assert answer.status == 503 and answer.fault == "ResourceUnavailableFault"
                    refused.append(time.monotonic() - started)
                    time.sleep(0.05)
                i += 1

        publisher = threading.Thread(target=publish)
        publisher.start()
        try:
            wait_until(lambda: len(acked) >= 50, timeout=20, what="50 acknowledged")
            node.restart()
            before = len(acked)
            wait_until(lambda: len(acked) >= before + 100, timeout=30, what="100 more acknowledged")
        finally:
            stop.set()
            publisher.join(30)
        wait_until(
            lambda: set(acked) <= numbers_at(consumer), timeout=30, what="every acknowledged"
        )
        # a Notify during the outage failed fast (if the gateway noticed it at all: a quick
        # restart may fall within the grace period)
        assert not refused or max(refused) < 5.0, refused
    finally:
        stop_gateway(server)


@pytest.mark.slow
def test_gateway_sigkill_mid_native_stream_loses_nothing(
    mqtt_url: str, consumer: ConsumerServer
) -> None:
    tag = uuid.uuid4().hex[:10]
    server = start_gateway(mqtt_gateway_url(mqtt_url, tag))
    try:
        wsn = Wsn(server, NATIVE)
        concrete(wsn, consumer.address(), "meter")
        client = native_client(mqtt_url)
        total = 600
        try:
            for i in range(total):
                if i == total // 3:
                    assert server.process is not None
                    os.kill(server.process.pid, signal.SIGKILL)
                    server.process.wait(10)
                body = f'<n xmlns="urn:n">{i}</n>'.encode()
                client.publish(f"g{tag}/meter", body, qos=1).wait_for_publish(5)
            server.start()
        finally:
            close_client(client)
        wait_until(
            lambda: numbers_at(consumer) >= set(range(total)),
            timeout=30,
            what=f"all {total} natively published messages",
        )
    finally:
        stop_gateway(server)


def readyz(server: RunningServer) -> tuple[int, str]:
    """``/readyz``'s status and text (it asks the middleware each time: a loaded
    machine's time, not 2 s)."""
    answer = requests.get(server.base_url + "/readyz", timeout=10)
    return answer.status_code, answer.text


@pytest.mark.slow
def test_broker_down_answers_503_fast_then_serves_again(
    mosquitto_factory: Callable[..., MosquittoNode],
) -> None:
    node = mosquitto_factory()
    server = start_gateway(mqtt_gateway_url(node.url), WSNMOM_MIDDLEWARE__GRACE="1")
    try:
        wsn = Wsn(server, f"urn:test:{uuid.uuid4().hex[:8]}")
        wsn.notify(("tns:t", "<x/>"))
        node.stop()
        wait_until(
            lambda: readyz(server)[0] == 503,
            timeout=10,
            what="/readyz 503 while the broker is down",
        )
        # /readyz names the middleware and why: the connection was lost, then refused
        refused = f"cannot connect to the MQTT broker 127.0.0.1:{node.port}: connection refused"
        # the body checked is the one that said so (the reason may change between reads)
        body = wait_until(
            lambda: text if refused in (text := readyz(server)[1]) else None,
            timeout=30,
            what="/readyz to say that the broker refuses connections",
        )
        assert body.splitlines()[0] == "not ready: the middleware does not answer", body
        assert body.splitlines()[1].startswith(f"middleware: mqtt: {refused}"), body
        # Mosquitto closes its connections as it stops (with a DISCONNECT where it sends one)
        assert (
            "(before that, the connection was lost)" in body
            or "(before that, the broker closed the connection (" in body
        ), body
        started = time.monotonic()
        answer = wsn.post(
            wsn.broker,
            f'<wsnt:Notify><wsnt:NotificationMessage><wsnt:Topic xmlns:tns="{wsn.ns}" '
            'Dialect="http://docs.oasis-open.org/wsn/t-1/TopicExpression/Simple">tns:t'
            "</wsnt:Topic><wsnt:Message><x/></wsnt:Message></wsnt:NotificationMessage>"
            "</wsnt:Notify>",
        )
        assert (answer.status, answer.fault) == (503, "ResourceUnavailableFault")
        # refused once the 1 s grace is over, not held while the broker stays down
        assert time.monotonic() - started < 6.0
        assert f"the middleware (mqtt) is not reachable: {refused}".encode() in answer.data
        node.start()
        # one answer both 200 and "ready" (each /readyz asks the middleware again)
        wait_until(
            lambda: readyz(server) == (200, "ready\n"),
            timeout=15,
            what="/readyz 200 once the broker is back",
        )
        wsn.notify(("tns:t", "<x/>"))
    finally:
        stop_gateway(server)


@pytest.mark.slow
def test_gateway_started_before_its_broker_serves_once_it_is_up(mqtt_url: str) -> None:
    node = MosquittoNode()  # not started yet: nothing listens on its port
    directory = Path(tempfile.mkdtemp(prefix="wsnmom-mqtt-e2e-"))
    server = RunningServer("mqtt", mqtt_gateway_url(node.url), directory, free_port())
    try:
        server.start(wait_for="/healthz")
        assert requests.get(server.base_url + "/readyz", timeout=10).status_code == 503
        # the reason: nothing listens on the broker's port (what the last attempt to open
        # the adapter met)
        refused = [
            f"middleware: mqtt: cannot connect to the MQTT broker 127.0.0.1:{node.port}: "
            "connection refused"
        ]
        wait_until(
            lambda: (
                requests.get(server.base_url + "/readyz", timeout=2).text.splitlines()[1:]
                == refused
            ),
            timeout=10,
            what=f"/readyz to say {refused}",
        )
        node.start()
        wait_until(
            lambda: requests.get(server.base_url + "/readyz", timeout=2).status_code == 200,
            timeout=30,
            what="/readyz 200 once the broker is up",
        )
        Wsn(server, f"urn:test:{uuid.uuid4().hex[:8]}").notify(("tns:t", "<x/>"))
    finally:
        stop_gateway(server)
        node.cleanup()
