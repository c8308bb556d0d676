"""Unordered delivery (issue 25, item 2: ``wsnmom:DeliveryPolicy`` ``Ordering`` unordered,
``InFlight``) on every adapter shape: queue (RabbitMQ, embedded), log (filelog, Kafka on
tansu) and session (MQTT), through a running gateway over HTTP.

* a consumer that holds its answer to message 1 gets messages 2..5 meanwhile (InFlight 4);
* a message the consumer keeps refusing is retried on its own while later ones arrive, and
  is delivered once the consumer takes it;
* at-least-once across a SIGKILL: message 1 held unanswered when the gateway dies (2..5
  delivered and acknowledged out of order) reaches the consumer again after the restart
  (on a log the cursor committed only up to message 1, so 2..5 may come again too).

With an ordered subscription each of these consumers would get nothing past message 1: the
tests fail there.  The gateway is this module's own (it is killed), one per adapter, with
retries that last (50 attempts, 0.5 s apart at most) and a 30 s attempt timeout, so that a
held answer is not given up on while the test waits on a loaded machine.
"""

from __future__ import annotations

import os
import signal
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from tests.e2e.conftest import Wsn
from tests.fixtures.server import (
    ConsumerServer,
    RunningServer,
    kafka_gateway_url,
    mqtt_gateway_url,
    serving,
)
from tests.support.soap import NS, WSNMOM
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

PAYLOAD_NS = "urn:test:unordered"
ENV = {
    "WSNMOM_RETRY__MAX_ATTEMPTS": "50",
    "WSNMOM_RETRY__MAX_DELAY": "0.5",
    "WSNMOM_RETRY__TIMEOUT": "30",
    "WSNMOM_DELIVERY__PER_DESTINATION": "8",
}


@pytest.fixture(
    scope="module",
    params=[
        pytest.param("embedded"),
        pytest.param("rabbitmq", marks=pytest.mark.rabbitmq),
        pytest.param("filelog"),
        pytest.param("kafka", marks=pytest.mark.kafka),
        pytest.param("mqtt", marks=pytest.mark.mqtt),
    ],
)
def own_server(request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    """A gateway of this module only (one test kills it), on a temporary data directory."""
    name: str = request.param
    data_dir = Path(tempfile.mkdtemp(prefix=f"wsnmom-unordered-{name}-"))
    if name == "embedded":
        url = f"embedded://{data_dir / 'middleware'}"
    elif name == "rabbitmq":
        url = str(request.getfixturevalue("rabbitmq_url"))
    elif name == "filelog":
        url = f"filelog://{data_dir / 'log'}"
    elif name == "mqtt":  # the restarted gateway keeps its data directory: the same session
        url = mqtt_gateway_url(str(request.getfixturevalue("mqtt_url")))
    else:  # the restarted gateway keeps the URL: the same topics and groups
        url = kafka_gateway_url(str(request.getfixturevalue("kafka_url")))
    with serving(RunningServer(name, url, data_dir, extra_env=dict(ENV)), request) as server:
        yield server


class ScriptedConsumer(ConsumerServer):
    """A consumer that holds its answer to the first request carrying ``hold`` until
    ``release`` is set, and answers HTTP 500 to requests carrying ``refuse`` while
    ``refusing()`` says so (each refusal is counted).  A request is recorded only when
    it is answered 2xx."""

    def __init__(self) -> None:
        super().__init__()
        self.hold: str | None = None
        self.holding = threading.Event()
        self.release = threading.Event()
        self.refuse: str | None = None
        self.refusing: Callable[[], bool] = lambda: False
        self.refusals = 0
        #: the held request's connection is dropped when released (its gateway died)
        self.drop_held = False

    def _handle(self, handler: BaseHTTPRequestHandler, data: bytes) -> None:
        text = data.decode(errors="replace")
        if self.hold is not None and self.hold in text and not self.holding.is_set():
            self.holding.set()
            self.release.wait(60)
            if self.drop_held:
                handler.close_connection = True
                return
        if self.refuse is not None and self.refuse in text and self.refusing():
            self.refusals += 1
            self._send(handler, 500, b"")
            return
        super()._handle(handler, data)

    def numbers(self, path: str) -> list[str]:
        """The payloads delivered (answered 2xx) on ``path``, in arrival order."""
        out: list[str] = []
        for rec in self.notifies():
            if rec.path == path and rec.body_child.tag == f"{{{NS['wsnt']}}}Notify":
                for m in rec.body_child.findall("wsnt:NotificationMessage", NS):
                    out.append(m.findtext(f"wsnt:Message/{{{PAYLOAD_NS}}}n", namespaces=NS) or "")
        return out


@pytest.fixture
def scripted() -> Iterator[ScriptedConsumer]:
    consumer = ScriptedConsumer()
    try:
        yield consumer
    finally:
        consumer.release.set()
        consumer.close()


def unordered(in_flight: int) -> str:
    return (
        f'<wsnmom:DeliveryPolicy xmlns:wsnmom="{WSNMOM}">'
        "<wsnmom:Ordering>unordered</wsnmom:Ordering>"
        f"<wsnmom:InFlight>{in_flight}</wsnmom:InFlight></wsnmom:DeliveryPolicy>"
    )


def note(wsn: Wsn, topic: str, text: str) -> None:
    wsn.notify((topic, f'<n xmlns="{PAYLOAD_NS}">{text}</n>'))


def test_a_held_answer_to_message_one_holds_back_none_of_the_next_four(
    own_server: RunningServer, scripted: ScriptedConsumer
) -> None:
    wsn = Wsn(own_server, f"urn:test:unordered:{uuid.uuid4().hex[:12]}")
    scripted.hold = ">m1<"
    wsn.subscribe(scripted.address("/held"), "tns:held", policy=unordered(4))
    note(wsn, "tns:held", "m1")
    assert scripted.holding.wait(30), "message 1 never reached the consumer"
    for i in range(2, 6):
        note(wsn, "tns:held", f"m{i}")
    got = wait_until(
        lambda: (
            set(scripted.numbers("/held")) >= {"m2", "m3", "m4", "m5"} and scripted.numbers("/held")
        ),
        30,
        what="messages 2..5 while the answer to message 1 is held",
    )
    assert "m1" not in got  # it is still held
    scripted.release.set()
    got = wait_until(
        lambda: "m1" in (n := scripted.numbers("/held")) and n, 30, what="message 1 answered"
    )
    assert set(got[: got.index("m1")]) == {"m2", "m3", "m4", "m5"}


def test_a_refused_message_is_retried_on_its_own_while_later_ones_arrive(
    own_server: RunningServer, scripted: ScriptedConsumer
) -> None:
    wsn = Wsn(own_server, f"urn:test:unordered:{uuid.uuid4().hex[:12]}")
    later = {"m2", "m3", "m4", "m5"}
    scripted.refuse = ">m1<"
    # refused until every later message has arrived (an ordered subscription never gets
    # there: message 1 would be retried until its attempts run out)
    scripted.refusing = lambda: not later <= set(scripted.numbers("/refused"))
    wsn.subscribe(scripted.address("/refused"), "tns:refused", policy=unordered(4))
    note(wsn, "tns:refused", "m1")
    wait_until(lambda: scripted.refusals >= 1, 30, what="message 1 refused once")
    for i in range(2, 6):
        note(wsn, "tns:refused", f"m{i}")
    got = wait_until(
        lambda: "m1" in (n := scripted.numbers("/refused")) and n,
        60,
        what="message 1 taken after the later ones",
    )
    assert set(got[: got.index("m1")]) == later


def test_a_held_message_is_delivered_again_after_a_sigkill(
    own_server: RunningServer, scripted: ScriptedConsumer
) -> None:
    wsn = Wsn(own_server, f"urn:test:unordered:{uuid.uuid4().hex[:12]}")
    scripted.hold = ">m1<"
    wsn.subscribe(scripted.address("/crash"), "tns:crash", policy=unordered(4))
    note(wsn, "tns:crash", "m1")
    assert scripted.holding.wait(30), "message 1 never reached the consumer"
    for i in range(2, 6):
        note(wsn, "tns:crash", f"m{i}")
    wait_until(
        lambda: set(scripted.numbers("/crash")) >= {"m2", "m3", "m4", "m5"},
        30,
        what="messages 2..5 while the answer to message 1 is held",
    )
    assert own_server.process is not None
    os.kill(own_server.process.pid, signal.SIGKILL)
    own_server.process.wait(15)
    scripted.drop_held = True  # the held answer would go to a dead connection
    scripted.release.set()
    own_server.start()
    got = wait_until(
        lambda: "m1" in (n := scripted.numbers("/crash")) and n,
        60,
        what="message 1 delivered again after the restart",
    )
    assert set(got) == {"m1", "m2", "m3", "m4", "m5"}
