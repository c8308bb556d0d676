"""The Kafka gateway killed (SIGKILL) right after a paced stream of acknowledged Notifies
was delivered, while a pull point fed by a subscription holds its messages unread (the
reproduction of issue 22, item 5: that pull point held the head's commit back, and the
push consumer got every message again).  Nothing acknowledged is lost, and the push
consumer gets again at most what it received in the last ``BOUND`` seconds before the
kill (the bound docs/adapters/kafka.md documents)."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("confluent_kafka")

from tests.e2e.conftest import Wsn
from tests.fixtures.server import ConsumerServer, RunningServer, kafka_gateway_url
from tests.fixtures.tansu import TansuNode
from tests.support.soap import FULL, NS
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.kafka, pytest.mark.slow]

#: seconds: a subscription gets again at most what it acknowledged this long before a crash
BOUND = 2.0
#: Notifies per second, for this many seconds: long enough that most of the stream lies
#: outside the bound, however fast the machine is
RATE, SECONDS = 40, 4
SENTINEL = 10**9


def numbers(elements: list) -> list[int]:  # type: ignore[type-arg]
    return [int(m.findtext("wsnt:Message/{urn:n}n", namespaces=NS) or -1) for m in elements]


class Arrivals:
    """How many messages the consumer had at which time (sampled every 10 ms)."""

    def __init__(self, consumer: ConsumerServer) -> None:
        self.consumer = consumer
        self.samples: list[tuple[float, int]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            self.samples.append((time.monotonic(), len(self.consumer.messages())))
            self.stop.wait(0.01)

    def since(self, start: float, end: float) -> int:
        """Messages that arrived between ``start`` and ``end`` (an upper bound: counted
        from the last sample at or before ``start``)."""
        before = max((n for t, n in self.samples if t <= start), default=0)
        at_end = max((n for t, n in self.samples if t <= end), default=0)
        return at_end - before


def test_sigkill_repushes_at_most_the_bound_and_loses_nothing(
    kafka_url: str, consumer: ConsumerServer
) -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="wsnmom-kafka-crash-"))
    server = RunningServer("kafka", kafka_gateway_url(kafka_url), data_dir)
    server.start()
    arrivals = Arrivals(consumer)
    try:
        wsn = Wsn(server, f"urn:test:{uuid.uuid4().hex[:8]}")
        wsn.subscribe(consumer.address("/push"), "tns:crash")
        _, pull_point = wsn.create_pull_point()
        wsn.subscribe(pull_point, "tns:crash")  # nobody reads it before the kill
        total = RATE * SECONDS
        started = time.monotonic()
        for i in range(total):
            time.sleep(max(0.0, started + i / RATE - time.monotonic()))
            wsn.notify(("tns:crash", f'<n xmlns="urn:n">{i}</n>'))
        wait_until(
            lambda: set(range(total)) <= set(numbers(consumer.messages())),
            timeout=30,
            what="every Notify at the push consumer",
        )
        assert server.process is not None
        os.kill(server.process.pid, signal.SIGKILL)
        killed = time.monotonic()
        server.process.wait(15)
        time.sleep(0.05)  # one more arrival sample
        allowed = arrivals.since(killed - BOUND, killed)
        before = len(consumer.messages())

        server.start()
        wsn.notify(("tns:crash", f'<n xmlns="urn:n">{SENTINEL}</n>'))
        wait_until(
            lambda: SENTINEL in numbers(consumer.messages()),
            timeout=30,
            what="the sentinel at the push consumer",
        )
        pushed = numbers(consumer.messages())
        again = len(pushed) - before - 1
        pulled: list[int] = []

        def drained() -> bool:
            pulled.extend(numbers(wsn.get_messages(pull_point)))
            return SENTINEL in pulled

        wait_until(drained, timeout=30, what="the sentinel in the pull point")
        print(
            f"\n{total} Notifies; re-pushed after SIGKILL: {again} (bound: {allowed}, what "
            f"arrived in the last {BOUND:.0f} s); pull point duplicates: "
            f"{len(pulled) - len(set(pulled))}"
        )
        expected = {*range(total), SENTINEL}
        assert set(pushed) == expected  # nothing lost
        assert set(pulled) == expected
        assert Counter(pushed)[SENTINEL] == 1
        assert again <= allowed, (again, allowed)
        # the pull point's messages were never handed out before the kill: none twice
        assert len(pulled) == len(set(pulled))
    finally:
        arrivals.stop.set()
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def test_notify_while_the_broker_stops_answers_503_within_the_grace(
    tansu_factory: Callable[[], TansuNode], consumer: ConsumerServer
) -> None:
    """The broker stops (SIGSTOP) just before a Notify, before the gateway's health probe
    noticed: the Notify is answered with 503 ResourceUnavailableFault within
    ``unavailable_grace`` (2 s), on a known topic and on one the gateway must create; it
    waited the whole publish timeout before (19.1 s measured).  Every Notify answered
    202 is delivered once the broker continues."""
    node = tansu_factory()
    data_dir = Path(tempfile.mkdtemp(prefix="wsnmom-kafka-stop-"))
    server = RunningServer("kafka", kafka_gateway_url(node.url), data_dir)
    server.start()
    try:
        wsn = Wsn(server, f"urn:test:{uuid.uuid4().hex[:8]}")
        wsn.subscribe(consumer.address(), "tns:stop//.", dialect=FULL)
        wsn.notify(("tns:stop", '<n xmlns="urn:n">0</n>'))
        consumer.wait_for_messages(1, timeout=15)
        took: list[float] = []
        node.pause()
        for topic in ("tns:stop", "tns:stop/created-now"):
            started = time.monotonic()
            answer = wsn.post(
                wsn.broker,
                f'<wsnt:Notify><wsnt:NotificationMessage><wsnt:Topic xmlns:tns="{wsn.ns}" '
                f'Dialect="{FULL}">{topic}</wsnt:Topic><wsnt:Message><n xmlns="urn:n">-1</n>'
                "</wsnt:Message></wsnt:NotificationMessage></wsnt:Notify>",
            )
            took.append(time.monotonic() - started)
            assert (answer.status, answer.fault) == (503, "ResourceUnavailableFault")
        print(
            f"\nNotify with the broker stopped answered 503 after {took[0]:.2f} s and "
            f"{took[1]:.2f} s (new topic)"
        )
        # 2 s of grace, plus margin for a loaded machine; 19 s and more before
        assert max(took) < 4.0, took
        node.resume()
        sent = ["0"]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(sent) < 3:
            answer = wsn.post(
                wsn.broker,
                f'<wsnt:Notify><wsnt:NotificationMessage><wsnt:Topic xmlns:tns="{wsn.ns}" '
                f'Dialect="{FULL}">tns:stop</wsnt:Topic><wsnt:Message><n xmlns="urn:n">'
                f"{len(sent)}</n></wsnt:Message></wsnt:NotificationMessage></wsnt:Notify>",
            )
            if answer.status == 202 or answer.status == 200:
                sent.append(str(len(sent)))
            else:
                time.sleep(0.2)
        assert len(sent) == 3
        wait_until(
            lambda: (
                set(sent)
                <= {m.findtext("wsnt:Message/{urn:n}n", namespaces=NS) for m in consumer.messages()}
            ),
            timeout=20,
            what="every acknowledged Notify",
        )
    finally:
        node.resume()
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def test_broker_restarted_empty_skips_nothing_published_after(
    tansu_factory: Callable[[], TansuNode], consumer: ConsumerServer
) -> None:
    """tansu on memory storage, killed and started again empty, under a gateway with a
    push subscription and a pull point fed by a subscription that holds 600
    messages unread: every Notify acknowledged after the restart reaches both (the one
    reset rule of the cursor engine: a log that starts again is read from its first
    record by every cursor, whatever it held in flight)."""
    before = 600
    node = tansu_factory()
    data_dir = Path(tempfile.mkdtemp(prefix="wsnmom-kafka-reset-"))
    server = RunningServer("kafka", kafka_gateway_url(node.url), data_dir)
    server.start()
    try:
        wsn = Wsn(server, f"urn:test:{uuid.uuid4().hex[:8]}")
        wsn.subscribe(consumer.address("/push"), "tns:reset")
        _, pull_point = wsn.create_pull_point()
        wsn.subscribe(pull_point, "tns:reset")
        for start in range(0, before, 20):
            wsn.notify(
                *[("tns:reset", f'<n xmlns="urn:n">{i}</n>') for i in range(start, start + 20)]
            )
        wait_until(
            lambda: len(set(numbers(consumer.messages()))) >= before,
            timeout=30,
            what="the messages before the restart",
        )
        node.restart()
        after: list[int] = []
        number = 100_000
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(after) < before + 50:
            batch = list(range(number, number + 10))
            answer = wsn.post(
                wsn.broker,
                "<wsnt:Notify>"
                + "".join(
                    f'<wsnt:NotificationMessage><wsnt:Topic xmlns:tns="{wsn.ns}" '
                    f'Dialect="{FULL}">tns:reset</wsnt:Topic><wsnt:Message>'
                    f'<n xmlns="urn:n">{n}</n></wsnt:Message></wsnt:NotificationMessage>'
                    for n in batch
                )
                + "</wsnt:Notify>",
            )
            number += 10
            if answer.status in (200, 202):
                after.extend(batch)
            else:
                time.sleep(0.2)
        assert len(after) >= before + 50
        # waits of 90 s: in 2 of 11 CI runs (run43, run51) this test took 35 s instead of
        # 4-7 s, a stall of about 30 s after the restart, as long as these waits were
        # (4 runs at load 10-13 here took 1.0-2.3 s after it). Most likely the first
        # Notify after the restart waiting out librdkafka's 30 s for a topic the empty
        # broker no longer had, fixed in session 16 (docs/adapters/kafka.md, "Topics the
        # cluster lost"); not shown to be this test's stall, so the waits stay
        pushed = wait_until(
            lambda: set(after) <= set(got := numbers(consumer.messages())) and got,
            timeout=90,
            what="every Notify acknowledged after the restart at the push consumer",
        )
        pulled: list[int] = []

        def drained() -> bool:
            pulled.extend(numbers(wsn.get_messages(pull_point)))
            return set(after) <= set(pulled)

        try:
            wait_until(
                drained, timeout=90, what="every Notify acknowledged after it in the pull point"
            )
        finally:
            print(
                f"\n{len(after)} acknowledged after the restart; missing: push "
                f"{len(set(after) - set(pushed))}, pull point {len(set(after) - set(pulled))}"
            )
    finally:
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
