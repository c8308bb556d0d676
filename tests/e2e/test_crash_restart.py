"""The gateway killed (SIGKILL, and SIGTERM for comparison) and restarted on the same data
directory, store and middleware, over HTTP, on every built-in adapter.

Before the kill: a push subscription to a consumer that is DOWN, a paused subscription, a
pull point fed by a subscription, a publisher registration and a subscription with a 1 s
lifetime; N notifications, the last one answered just before the kill.  After the
restart: every resource is still there (GetResourceProperty), the short-lived subscription
expired while the gateway was down (ResourceUnknownFault), the consumer coming up gets all
N (at-least-once: duplicates allowed and reported, nothing missing), GetMessages returns
all N, and ResumeSubscription delivers the paused subscription's N in order.

The module runs a ``wsnmom serve`` (``RunningServer``) of its own per adapter, on a
temporary data directory, shared by the SIGKILL and the SIGTERM test: each kills it and
starts it again (it starts it if a failed test left it stopped), and each works in a topic
namespace of its own.  RabbitMQ, Kafka and MQTT runs use the session's broker (Kafka: also
unique topics and consumer groups per gateway; MQTT: a topic prefix per gateway).
"""

from __future__ import annotations

import os
import signal
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from lxml import etree

from tests.e2e.conftest import Wsn
from tests.fixtures.server import (
    ConsumerServer,
    RunningServer,
    free_port,
    kafka_gateway_url,
    mqtt_gateway_url,
    serving,
)
from tests.support.soap import NS, WSNMOM, epr_address, resource_id
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

N = 50
PAYLOAD_NS = "urn:test:crash"
TOPIC = "tns:crash"

#: the down consumer is retried for ever (every 0.5 s) instead of being given up on
ENV = {"WSNMOM_RETRY__GIVE_UP": "keep", "WSNMOM_RETRY__MAX_DELAY": "0.5"}


@pytest.fixture(
    scope="module",
    params=[
        pytest.param("embedded"),
        pytest.param("rabbitmq", marks=pytest.mark.rabbitmq),
        pytest.param("kafka", marks=pytest.mark.kafka),
        pytest.param("mqtt", marks=pytest.mark.mqtt),
    ],
)
def crash_server(request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    """A gateway of this module's tests only (they kill it), on a temporary data
    directory, one per adapter: a start per test cost as much as the test's own restart."""
    name: str = request.param
    data_dir = Path(tempfile.mkdtemp(prefix=f"wsnmom-crash-{name}-"))
    if name == "embedded":
        url = f"embedded://{data_dir / 'middleware'}"
    elif name == "rabbitmq":
        url = str(request.getfixturevalue("rabbitmq_url"))
    elif name == "mqtt":  # the restarted gateway keeps its data directory: the same session
        url = mqtt_gateway_url(str(request.getfixturevalue("mqtt_url")))
    else:  # the restarted gateway keeps the URL: the same topics and groups
        url = kafka_gateway_url(str(request.getfixturevalue("kafka_url")))
    with serving(RunningServer(name, url, data_dir, extra_env=dict(ENV)), request) as server:
        yield server


@pytest.fixture
def own_server(crash_server: RunningServer) -> RunningServer:
    """``crash_server``, running: a test that failed between its kill and its restart left
    it stopped."""
    if not crash_server.running:
        crash_server.start()
    return crash_server


def ids_of(messages: list[etree._Element]) -> list[int]:
    """The notification numbers carried by wsnt:NotificationMessage elements."""
    return [
        int(m.findtext(f"wsnt:Message/{{{PAYLOAD_NS}}}n", namespaces=NS) or -1) for m in messages
    ]


def at(consumer: ConsumerServer, path: str) -> list[etree._Element]:
    """The wsnt:NotificationMessage elements ``consumer`` received on ``path``."""
    out: list[etree._Element] = []
    for rec in consumer.notifies():
        if rec.path == path and rec.body_child.tag == f"{{{NS['wsnt']}}}Notify":
            out.extend(rec.body_child.findall("wsnt:NotificationMessage", NS))
    return out


def rp(wsn: Wsn, address: str, prop: str, *, validate: bool = True) -> etree._Element | str:
    """GetResourceProperty ``prop`` (a prefixed name); the response or the fault name."""
    body = (
        f'<wsrf-rp:GetResourceProperty xmlns:wsnmom="{WSNMOM}">{prop}</wsrf-rp:GetResourceProperty>'
    )
    ans = wsn.post(address, body, validate=validate)
    if ans.status == 500:
        return str(ans.fault)
    return ans.ok(validate=validate)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_state_and_notifications_survive_a_crash(
    own_server: RunningServer, sig: signal.Signals
) -> None:
    wsn = Wsn(own_server, f"urn:test:crash:{uuid.uuid4().hex[:12]}")
    down_port = free_port()  # nobody listens there until after the restart
    down_address = f"http://127.0.0.1:{down_port}/down"
    paused_consumer = ConsumerServer()
    try:
        pushed = wsn.subscribe(down_address, TOPIC)
        paused = wsn.subscribe(paused_consumer.address("/paused"), TOPIC)
        wsn.post(paused.address, "<wsnt:PauseSubscription/>").ok()
        _, pp = wsn.create_pull_point()
        feeding = wsn.subscribe(pp, TOPIC)
        reg = wsn.post(
            wsn.broker,
            "<wsn-br:RegisterPublisher><wsn-br:PublisherReference><wsa:Address>"
            "http://127.0.0.1:9/publisher</wsa:Address></wsn-br:PublisherReference>"
            "<wsn-br:InitialTerminationTime>PT1H</wsn-br:InitialTerminationTime>"
            "</wsn-br:RegisterPublisher>",
        ).ok()
        reg_ref = reg.find("wsn-br:PublisherRegistrationReference", NS)
        assert reg_ref is not None
        registration = epr_address(reg_ref)
        # 1 s (was 2 s, which cost 2 s of waiting per test): the N Notifies and the kill
        # take 0.2-0.6 s on a quiet machine, so it is alive at the kill and expires while
        # the gateway is down (the wait below); at load, ended by the running gateway
        # before the kill instead, it is just as unknown after the restart
        short = wsn.subscribe(paused_consumer.address("/short"), TOPIC, itt="PT1S")
        short_created = time.monotonic()

        for i in range(N):  # the last Notify is answered right before the kill
            wsn.notify((TOPIC, f'<n xmlns="{PAYLOAD_NS}">{i}</n>'))
        assert own_server.process is not None
        if sig is signal.SIGKILL:
            os.kill(own_server.process.pid, signal.SIGKILL)
        else:
            own_server.process.send_signal(signal.SIGTERM)
        own_server.process.wait(15)
        assert at(paused_consumer, "/paused") == []

        time.sleep(max(0.0, 1.5 - (time.monotonic() - short_created)))
        own_server.start()

        # every resource is back; the 1 s subscription expired while the gateway was down
        for address in (pushed.address, paused.address, feeding.address, pp, registration):
            answer = rp(wsn, address, "wsnt:TerminationTime")
            assert not isinstance(answer, str), (address, answer)
        paused_rp = rp(wsn, paused.address, "wsnmom:Paused", validate=False)
        assert not isinstance(paused_rp, str)
        assert paused_rp.findtext(f"{{{WSNMOM}}}Paused") == "true"
        assert rp(wsn, short.address, "wsnt:TerminationTime") == "ResourceUnknownFault"
        assert resource_id(reg_ref)

        # the barrier: notification N, published after the restart, comes after the N
        # before it in every subscription (the pushed one is the paused one's witness)
        wsn.notify((TOPIC, f'<n xmlns="{PAYLOAD_NS}">{N}</n>'))
        # the consumer comes up: all N arrive (duplicates only as redeliveries)
        consumer = ConsumerServer(down_port)
        try:
            got = wait_until(
                lambda: N in (ids := ids_of(consumer.messages())) and ids,
                timeout=30,
                what=f"the sentinel after all {N} notifications at the consumer that was down",
            )
        finally:
            consumer.close()
        assert set(got) == set(range(N + 1))
        dup_push = sum(c - 1 for c in Counter(got).values())

        # the pull point holds all N
        pulled: list[int] = []
        wait_until(
            lambda: pulled.extend(ids_of(wsn.get_messages(pp))) or N in pulled,
            timeout=30,
            what=f"the sentinel after all {N} notifications in the pull point",
        )
        assert set(pulled) == set(range(N + 1))
        dup_pull = sum(c - 1 for c in Counter(pulled).values())

        # nothing reached the paused subscription; Resume delivers its N in order
        assert at(paused_consumer, "/paused") == []
        wsn.post(paused.address, "<wsnt:ResumeSubscription/>").ok()
        resumed = wait_until(
            lambda: N in (ids := ids_of(at(paused_consumer, "/paused"))) and ids,
            timeout=30,
            what="the sentinel after the resumed ones",
        )
        first_seen = list(dict.fromkeys(resumed))
        assert first_seen == list(range(N + 1))
        dup_resume = len(resumed) - N - 1
        print(
            f"\n[{own_server.adapter} {sig.name}] duplicates (at-least-once redeliveries): "
            f"push {dup_push}, pull point {dup_pull}, resumed {dup_resume}"
        )

        for sub in (pushed, paused, feeding):
            wsn.post(sub.address, "<wsnt:Unsubscribe/>").ok()
        wsn.post(pp, "<wsnt:DestroyPullPoint/>").ok()
        wsn.post(registration, "<wsn-br:DestroyRegistration/>").ok()
    finally:
        paused_consumer.close()
