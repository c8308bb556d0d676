"""One W3C trace context followed through each middleware (issue 25, item 3): a Notify's
HTTP ``traceparent``/``tracestate`` reaches a native consumer of RabbitMQ (pika), Kafka
(confluent-kafka, on tansu) and MQTT 5 (paho) under its own header name, and a WS-N push
consumer of the same topic; a message published natively with a ``traceparent`` keeps it
to the WS-N consumer (HTTP header and ``wsnmom:Messages`` block).

MQTT 3.1.1 has no user properties: a gateway on 3.1.1 carries no application headers, so
the trace context stops at the broker both ways, shown by a gateway of its own
(docs/operations.md, "Tracing")."""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from lxml import etree

from tests.fixtures.server import ConsumerServer, Received, RunningServer, mqtt_gateway_url
from tests.support.soap import CONCRETE, content_type, envelope, notify_body
from tests.support.waiting import wait_until

from .conftest import Wsn

pytestmark = pytest.mark.e2e

WSNMOM = "urn:wsnmom:ns:1"
NOTIFY_TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
NOTIFY_STATE = "congo=t61rcWkgMzE"
NATIVE_TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@dataclass
class Native:
    """One middleware seen by its own client: the WS-N topic namespace and path that name
    a native destination, a consumer of it and a publisher to it."""

    namespace: str
    path: str
    #: the next message the native consumer got: (body, headers), or None
    take: Callable[[], tuple[bytes, dict[str, str]] | None]
    #: publish natively (body, headers)
    put: Callable[[bytes, dict[str, str]], None]


def _prefix(server: RunningServer) -> str:
    found = re.search(r"topic_prefix=([^&]+)", server.adapter_url)
    assert found, server.adapter_url
    return found.group(1)


def _rabbitmq(server: RunningServer, request: pytest.FixtureRequest) -> Iterator[Native]:
    import pika

    connection = pika.BlockingConnection(
        pika.URLParameters(request.getfixturevalue("rabbitmq_url"))
    )
    channel = connection.channel()
    exchange = f"trace-{uuid.uuid4().hex[:10]}"
    channel.exchange_declare(exchange, "topic", durable=True)
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(queue, exchange, "#")

    def take() -> tuple[bytes, dict[str, str]] | None:
        method, props, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return None
        return body, {k: v for k, v in (props.headers or {}).items() if isinstance(v, str)}

    def put(body: bytes, headers: dict[str, str]) -> None:
        props = pika.BasicProperties(content_type="application/xml", headers=headers)
        channel.basic_publish(exchange, "orders.placed", body, props)

    try:
        yield Native(f"urn:wsnmom:native:{exchange}", "orders/placed", take, put)
    finally:
        channel.exchange_delete(exchange)
        connection.close()


def _kafka(server: RunningServer, request: pytest.FixtureRequest) -> Iterator[Native]:
    from confluent_kafka import Consumer, Producer, TopicPartition

    bootstrap = request.getfixturevalue("kafka_bootstrap")
    leaf = f"t{uuid.uuid4().hex[:8]}"
    topic = f"{_prefix(server)}.orders.{leaf}"
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex})
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    assigned: list[bool] = []

    def take() -> tuple[bytes, dict[str, str]] | None:
        if not assigned:  # the topic exists once the gateway has published to it
            consumer.assign([TopicPartition(topic, 0, 0)])
            assigned.append(True)
        record = consumer.poll(0.5)
        if record is None or record.error() is not None:
            return None
        return record.value(), {k: (v or b"").decode() for k, v in record.headers() or []}

    def put(body: bytes, headers: dict[str, str]) -> None:
        producer.produce(topic, body, key=b"o", headers=list(headers.items()))
        assert producer.flush(10) == 0

    try:
        yield Native("urn:wsnmom:native", f"orders/{leaf}", take, put)
    finally:
        consumer.close()


def _mqtt(server: RunningServer, request: Any) -> Generator[Native, None, None]:
    from tests.fixtures.mosquitto import MqttPublisher, close_client, native_client

    url = request.getfixturevalue("mqtt_url")
    path = f"orders/t{uuid.uuid4().hex[:8]}"
    topic = f"{_prefix(server)}/{path}"
    got: list[tuple[bytes, dict[str, str]]] = []
    subscribed = threading.Event()
    client = native_client(url, "5")
    client.on_message = lambda c, u, m: got.append(
        (m.payload, dict(getattr(m.properties, "UserProperty", [])))
    )
    client.on_subscribe = lambda *args: subscribed.set()
    client.subscribe(topic, qos=1)
    assert subscribed.wait(10), "no SUBACK"
    publisher = MqttPublisher(url, "5")
    try:
        yield Native(
            "urn:wsnmom:native",
            path,
            lambda: got.pop(0) if got else None,
            lambda body, headers: publisher.publish(topic, body, headers, "application/xml"),
        )
    finally:
        publisher.close()
        close_client(client)


_NATIVE = {"rabbitmq": _rabbitmq, "kafka": _kafka, "mqtt": _mqtt}


@pytest.fixture
def native(wsnmom_server: RunningServer, request: pytest.FixtureRequest) -> Iterator[Native]:
    yield from _NATIVE[wsnmom_server.adapter](wsnmom_server, request)


def _pushed(received: list[Received]) -> dict[str, tuple[dict[str, str], str | None]]:
    """Payload text -> (its wsnmom:Messages headers, the HTTP ``traceparent`` of its
    request when it was the first message of that request's batch, else None: the HTTP
    headers carry the trace context of a batch's first message)."""
    out: dict[str, tuple[dict[str, str], str | None]] = {}
    for rec in received:
        messages = rec.body_child.findall("{*}NotificationMessage")
        blocks = rec.header(f"{{{WSNMOM}}}Messages")
        infos = list(blocks[0]) if blocks else [etree.Element("none")] * len(messages)
        for i, (message, info) in enumerate(zip(messages, infos, strict=True)):
            payload = message.find("{*}Message")
            assert payload is not None
            text = "".join(payload.itertext())
            http = rec.headers.get("traceparent") if i == 0 else None
            out[text] = ({h.get("name") or "": h.text or "" for h in info}, http)
    return out


@pytest.mark.parametrize(
    "wsnmom_server",
    [
        pytest.param("rabbitmq", marks=pytest.mark.rabbitmq),
        pytest.param("kafka", marks=pytest.mark.kafka),
        pytest.param("mqtt", marks=pytest.mark.mqtt),
    ],
    indirect=True,
)
def test_a_traceparent_travels_from_notify_to_native_consumers_and_back(
    wsnmom_server: RunningServer, native: Native, consumer: ConsumerServer
) -> None:
    wsn = Wsn(wsnmom_server, native.namespace)
    wsn.subscribe(consumer.address(), f"tns:{native.path}", dialect=CONCRETE)

    # 1. a Notify with the trace context as HTTP headers
    body = notify_body((f"tns:{native.path}", "<v>from-notify</v>"), ns=wsn.ns, dialect=CONCRETE)
    resp = wsn.http.post(
        wsn.broker,
        data=envelope(body),
        headers={
            "Content-Type": content_type(),
            "traceparent": NOTIFY_TRACE,
            "tracestate": NOTIFY_STATE,
        },
    )
    assert resp.status_code in (200, 202), resp.content
    raw, headers = wait_until(native.take, timeout=20, what="the native consumer's message")
    element = etree.fromstring(raw)
    assert (element.tag, element.text) == ("v", "from-notify")
    assert headers["traceparent"] == NOTIFY_TRACE
    assert headers["tracestate"] == NOTIFY_STATE

    # 2. a natively published message with its own trace context
    native.put(b"<v>from-native</v>", {"traceparent": NATIVE_TRACE, "origin": "plc-7"})

    wait_until(
        lambda: {"from-notify", "from-native"} <= set(_pushed(consumer.received)),
        timeout=20,
        what="both messages at the WS-N consumer",
    )
    pushed = _pushed(consumer.received)
    block, http = pushed["from-notify"]
    assert block["traceparent"] == NOTIFY_TRACE and block["tracestate"] == NOTIFY_STATE
    assert http == NOTIFY_TRACE  # published first: the first message of its request
    block, http = pushed["from-native"]
    assert block["traceparent"] == NATIVE_TRACE and block["origin"] == "plc-7"
    assert http in (NATIVE_TRACE, None)  # None: it went in one request after from-notify


@pytest.mark.mqtt
def test_a_gateway_on_mqtt_3_1_1_carries_no_trace_context(
    mqtt_url: str, consumer: ConsumerServer, tmp_path: Path
) -> None:
    """MQTT 3.1.1 has no user properties: the Notify's message reaches a native MQTT 5
    subscriber without its ``traceparent``, and a native message's ``traceparent`` (sent as
    an MQTT 5 user property) does not reach the WS-N consumer through a 3.1.1 gateway."""
    tag = uuid.uuid4().hex[:10]
    server = RunningServer(
        "mqtt", mqtt_gateway_url(mqtt_url, tag) + "&protocol=3.1.1", tmp_path / "gw"
    )
    server.start()
    clients: Generator[Native, None, None] | None = None
    try:
        clients = _mqtt(server, _Fixtures(mqtt_url=mqtt_url))  # kept: closing ends them
        native = next(clients)
        wsn = Wsn(server, native.namespace)
        wsn.subscribe(consumer.address(), f"tns:{native.path}", dialect=CONCRETE)
        body = notify_body((f"tns:{native.path}", "<v>n</v>"), ns=wsn.ns, dialect=CONCRETE)
        resp = wsn.http.post(
            wsn.broker,
            data=envelope(body),
            headers={"Content-Type": content_type(), "traceparent": NOTIFY_TRACE},
        )
        assert resp.status_code in (200, 202), resp.content
        raw, headers = wait_until(native.take, timeout=20, what="the native subscriber's message")
        assert etree.fromstring(raw).text == "n"
        assert "traceparent" not in headers and headers == {}
        native.put(b"<v>m</v>", {"traceparent": NATIVE_TRACE})
        wait_until(
            lambda: {"n", "m"} <= set(_pushed(consumer.received)),
            timeout=20,
            what="both messages at the WS-N consumer",
        )
        pushed = _pushed(consumer.received)
        assert "traceparent" not in pushed["n"][0] and "traceparent" not in pushed["m"][0]
        assert {r.headers.get("traceparent") for r in consumer.received} == {None}
    finally:
        if clients is not None:
            clients.close()
        server.stop()


class _Fixtures:
    """What :func:`_mqtt` asks of a pytest request, for a gateway of the test's own."""

    def __init__(self, **values: str) -> None:
        self.values = values

    def getfixturevalue(self, name: str) -> str:
        return self.values[name]
