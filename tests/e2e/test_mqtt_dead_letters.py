"""Dead letters live on the MQTT broker (issue 25, item 1: "a topic on Kafka and MQTT"):
on MQTT 5 destination ``name`` is the MQTT topic ``<topic prefix>/wsnmom/dead-letters/name``,
so a plain paho subscriber there receives what the gateway gives up on (published by the
gateway, with the ``wsnmom-dl-*`` context as user properties) and what the queues' limits
drop (published from the queue store's outbox, with the ``wsnmom-dropped-*`` properties),
never retained; the gateway's own box reads the same messages back through its session.
The shared suite (tests/e2e/test_dead_letters.py) covers listing, replay and the metric.
A dead letter the broker refuses for good (here its ACL forbids writing to one
destination) is kept by the gateway instead, listed, counted and replayed as the others,
and does not keep the later ones from the broker.
Cost: one gateway (about 3 s) and three failed attempts at 0.2-0.5 s; one more gateway
and a Mosquitto of its own for the refusal.
"""

from __future__ import annotations

import queue
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

pytest.importorskip("paho.mqtt")

from wsnmom.adapters.mqtt.mapping import MqttMapping
from wsnmom.core.dead_letter_records import destination_topic
from wsnmom.topic_mapping.model import Topic

from tests.e2e.conftest import Wsn
from tests.fixtures.mosquitto import MosquittoNode, close_client, native_client
from tests.fixtures.server import ConsumerServer, RunningServer, free_port, mqtt_gateway_url
from tests.support.dead_letters import letters, policy, wait_letters
from tests.support.soap import NS
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.mqtt]


@pytest.fixture(scope="module")
def gateway(mqtt_url: str) -> Iterator[tuple[RunningServer, str]]:
    """An MQTT 5 gateway whose queues keep one message (drop the oldest), and its topic
    prefix."""
    tag = uuid.uuid4().hex[:10]
    data_dir = Path(tempfile.mkdtemp(prefix="wsnmom-mqtt-dl-"))
    server = RunningServer(
        "mqtt",
        mqtt_gateway_url(mqtt_url, tag),
        data_dir,
        free_port(),
        extra_env={"WSNMOM_LIMITS__MAX_MESSAGES": "1"},
    )
    server.start()
    try:
        yield server, f"g{tag}"
    finally:
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


class Reader:
    """A plain MQTT 5 client subscribed (QoS 1) to one topic, collecting what arrives."""

    def __init__(self, url: str, topic: str) -> None:
        self.messages: queue.Queue[Any] = queue.Queue()
        subscribed = threading.Event()
        self.client = native_client(url)
        self.client.on_message = lambda _c, _u, m: self.messages.put(m)
        self.client.on_subscribe = lambda *_: subscribed.set()
        self.client.subscribe(topic, qos=1)
        assert subscribed.wait(10), "no SUBACK"

    def take(self, n: int) -> list[Any]:
        return [self.messages.get(timeout=30) for _ in range(n)]

    def close(self) -> None:
        close_client(self.client)


def properties(message: Any) -> dict[str, str]:
    return dict(getattr(message.properties, "UserProperty", None) or ())


def test_a_native_subscriber_reads_what_the_gateway_gives_up_on(
    gateway: tuple[RunningServer, str], mqtt_url: str, consumer: ConsumerServer
) -> None:
    server, prefix = gateway
    destination = "n" + uuid.uuid4().hex[:12]
    reader = Reader(mqtt_url, f"{prefix}/wsnmom/dead-letters/{destination}")
    try:
        consumer.mode = "error"
        wsn = Wsn(server, f"urn:test:{uuid.uuid4().hex[:8]}")
        failing = consumer.address("/failing")
        sub = wsn.subscribe(failing, "tns:dl", policy=policy(destination))
        wsn.notify(("tns:dl", '<n xmlns="urn:n">given up</n>'))
        [message] = reader.take(1)
        assert b"given up" in message.payload
        assert not message.retain
        props = properties(message)
        assert props["wsnmom-dl-reason"] == "retries-exhausted"
        assert props["wsnmom-dl-subscription"] == sub.id
        assert props["wsnmom-dl-consumer"] == failing
        assert props["wsnmom-dl-attempts"] == "3"
        assert props["wsnmom-topic-path"] == "dl"
        # and the gateway's box read the same message back from the broker
        [letter] = wait_until(lambda: letters(server, destination), 30, what="the box")
        assert letter["id"] == props["wsnmom-dl-id"]
        assert letter["reason"] == "retries-exhausted"
    finally:
        reader.close()


def test_what_a_queue_limit_drops_reaches_the_broker_through_the_outbox(
    gateway: tuple[RunningServer, str], mqtt_url: str, consumer: ConsumerServer
) -> None:
    server, prefix = gateway
    destination = "o" + uuid.uuid4().hex[:12]
    reader = Reader(mqtt_url, f"{prefix}/wsnmom/dead-letters/{destination}")
    try:
        wsn = Wsn(server, f"urn:test:{uuid.uuid4().hex[:8]}")
        sub = wsn.subscribe(consumer.address("/full"), "tns:full", policy=policy(destination))
        wsn.post(sub.address, "<wsnt:PauseSubscription/>").ok()
        for n in ("first", "second", "third"):
            wsn.notify(("tns:full", f'<n xmlns="urn:n">{n}</n>'))
        got = reader.take(2)
        assert [b"first" in m.payload for m in got] == [True, False]
        assert b"second" in got[1].payload
        for message in got:
            props = properties(message)
            assert props["wsnmom-dropped-reason"] == "overflow"
            assert props["wsnmom-dropped-from"] == sub.id
            assert not message.retain
        found = wait_letters(server, destination, 2, "the box's two dead letters")
        assert len(found) == 2, found
        assert {d["reason"] for d in found} == {"overflow"}
    finally:
        reader.close()


def test_a_dead_letter_the_broker_refuses_for_good_is_kept_and_blocks_no_other(
    mosquitto_factory: Any, consumer: ConsumerServer, consumer_factory: Any
) -> None:
    """The broker's ACL lets the gateway read destination ``refused`` but not write it:
    what subscription A's limit drops there is refused with "not authorized" at each
    attempt.  It is parked in the gateway's own queue of the destination (listed,
    counted, replayable), and what B's limit drops afterwards, behind it in the outbox,
    still reaches the broker."""
    tag = uuid.uuid4().hex[:10]
    ns = f"urn:test:{uuid.uuid4().hex[:8]}"
    mapping = MqttMapping({}, f"g{tag}", dead_letters=True)
    root = mapping.name(Topic(ns, ("a",))).rsplit("/", 1)[0]
    refused, fine = "r" + uuid.uuid4().hex[:12], "f" + uuid.uuid4().hex[:12]

    def dl(name: str) -> str:
        return mapping.name(destination_topic(name))

    node: MosquittoNode = mosquitto_factory(
        acl=(
            f"topic readwrite {root}/#\n"
            f"topic readwrite {dl('default')}\n"
            f"topic readwrite {dl(fine)}\n"
            f"topic read {dl(refused)}\n"
        )
    )
    data_dir = Path(tempfile.mkdtemp(prefix="wsnmom-mqtt-refused-"))
    server = RunningServer(
        "mqtt",
        mqtt_gateway_url(node.url, tag),
        data_dir,
        free_port(),
        extra_env={"WSNMOM_LIMITS__MAX_MESSAGES": "1"},
    )
    server.start()
    reader = Reader(node.url, dl(fine))
    try:
        wsn = Wsn(server, ns)
        a = wsn.subscribe(consumer.address("/a"), "tns:a", policy=policy(refused))
        b = wsn.subscribe(consumer.address("/b"), "tns:b", policy=policy(fine))
        for sub in (a, b):
            wsn.post(sub.address, "<wsnt:PauseSubscription/>").ok()
        for n in ("a1", "a2", "a3"):
            wsn.notify(("tns:a", f'<n xmlns="urn:n">{n}</n>'))
        parked = wait_letters(server, refused, 2, "A's two dead letters, kept by the gateway")
        assert len(parked) == 2, parked
        assert {d["reason"] for d in parked} == {"overflow"}
        assert {d["subscription"] for d in parked} == {a.id}
        for n in ("b1", "b2", "b3"):
            wsn.notify(("tns:b", f'<n xmlns="urn:n">{n}</n>'))
        # behind the refused ones in the outbox, B's reach the broker
        got = reader.take(2)
        assert b">b1<" in got[0].payload and b">b2<" in got[1].payload
        assert {properties(m)["wsnmom-dropped-from"] for m in got} == {b.id}
        wait_until(lambda: len(letters(server, fine)) == 2, 30, what="B's dead letters read back")
        assert [d["id"] for d in letters(server, refused)] == [d["id"] for d in parked]
        text = requests.get(f"{server.base_url}/metrics", timeout=10).text
        assert 'wsnmom_dead_letters_total{reason="overflow",source="middleware"} 4.0' in text
        refusals = server.log_path.read_text().count("dead letter(s) for good")
        assert 1 <= refusals <= 2, server.log_tail()  # once per parking, not per attempt
        # a parked dead letter is replayed like any other
        other = consumer_factory()
        url = f"{server.base_url}/wsn/admin/api/dead-letters/{parked[0]['id']}/replay"
        resp = requests.post(url, json={"consumer": other.address("/r")}, timeout=10)
        assert resp.status_code == 200, resp.text
        [message] = other.wait_for_messages(1, timeout=10)
        assert message.findtext("wsnt:Message/{urn:n}n", namespaces=NS) == "a1"
        assert [d["id"] for d in letters(server, refused)] == [parked[1]["id"]]
    finally:
        reader.close()
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def test_two_gateways_on_one_broker_hold_each_dead_letter_once(
    mqtt_url: str, consumer: ConsumerServer
) -> None:
    """Two gateways of one topic prefix read their destination through one shared
    subscription (``dead_letter_share``): the broker hands each dead letter to one of
    them, so every dead letter is listed by exactly one gateway (each held a copy of
    every one before)."""
    tag = uuid.uuid4().hex[:10]
    destination = "s" + uuid.uuid4().hex[:12]
    env = {"WSNMOM_LIMITS__MAX_MESSAGES": "1", "WSNMOM_DEAD_LETTERS__DESTINATION": destination}
    servers: list[RunningServer] = []
    dirs: list[Path] = []
    try:
        for _ in range(2):
            dirs.append(Path(tempfile.mkdtemp(prefix="wsnmom-mqtt-share-")))
            servers.append(
                RunningServer(
                    "mqtt", mqtt_gateway_url(mqtt_url, tag), dirs[-1], free_port(), extra_env=env
                )
            )
            servers[-1].start()
        wsn = Wsn(servers[0], f"urn:test:{uuid.uuid4().hex[:8]}")
        sub = wsn.subscribe(consumer.address("/shared"), "tns:t")  # the default destination
        wsn.post(sub.address, "<wsnt:PauseSubscription/>").ok()
        wsn.notify(("tns:t", '<n xmlns="urn:n">kept</n>'))
        produced = 0
        # each Notify now drops the one before it into the dead letters, until both
        # gateways hold some (the broker alternates between them)
        while not all(letters(s, destination) for s in servers):
            assert produced < 40, [len(letters(s, destination)) for s in servers]
            produced += 1
            wsn.notify(("tns:t", f'<n xmlns="urn:n">n{produced}</n>'))
            wait_until(
                lambda n=produced: sum(len(letters(s, destination)) for s in servers) >= n,
                30,
                what=f"{produced} dead letter(s)",
            )
        held = [letters(s, destination) for s in servers]
        ids = [d["message_id"] for found in held for d in found]
        assert len(ids) == produced and len(set(ids)) == produced, held
        assert {d["reason"] for found in held for d in found} == {"overflow"}
    finally:
        for server in servers:
            server.stop()
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
