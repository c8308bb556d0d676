"""One slow consumer never delays another: tarpit consumers (loopback sockets that accept
connections and never answer) against a healthy consumer, through the real outbound SOAP
client; and the lanes' concurrency limit and circuit breaker on their own.

Tarpits here answer nothing for ``retry.timeout`` (4 s); the healthy consumer must have its
notification well before that (2 s bound: generous for a loaded machine, far below what a
shared pool blocked by the tarpits gives)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from wsnmom.core.lanes import BreakerSettings, Lanes, LaneState, Outcome, destination_key
from wsnmom.core.model import EndpointReference, SubscribeRequest
from wsnmom.soap_frontend.client import SoapClient

from tests.fixtures.server import ConsumerServer
from tests.support.waiting import FINE, wait_until

from .conftest import Broker, note, simple

TIMEOUT = 4.0
HEALTHY_WITHIN = 2.0


class Tarpit:
    """A loopback port whose connections complete (kernel backlog) and are never
    answered, nor even accepted; ``connections()`` counts the ones made to it."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.sock = socket.socket()
        self.sock.bind((host, 0))
        self.sock.listen(512)
        self.port = int(self.sock.getsockname()[1])

    def address(self, path: str = "/t") -> str:
        return f"http://{self.host}:{self.port}{path}"

    def connections(self) -> int:
        """Connections accepted so far (taken from the backlog, then held open)."""
        self.sock.setblocking(False)
        taken = 0
        try:
            while True:
                conn, _ = self.sock.accept()
                self._held.append(conn)
                taken += 1
        except BlockingIOError:
            pass
        self.total += taken
        return self.total

    total = 0
    _held: list[socket.socket]

    def close(self) -> None:
        for conn in getattr(self, "_held", []):
            conn.close()
        self.sock.close()


@pytest.fixture
def tarpits() -> Iterator[Callable[..., Tarpit]]:
    made: list[Tarpit] = []

    def make(host: str = "127.0.0.1") -> Tarpit:
        t = Tarpit(host)
        t._held = []
        t.total = 0
        made.append(t)
        return t

    yield make
    for t in made:
        t.close()


@pytest.fixture
def soap_broker(make_broker: Any) -> Iterator[Callable[..., Broker]]:
    """Brokers delivering through a real ``SoapClient`` each; at the end each broker is
    stopped, then its client closed (its keep-alive connections held a request thread
    of the consumer server each, left behind)."""
    made: list[tuple[Broker, SoapClient]] = []

    def make(**overrides: Any) -> Broker:
        settings: dict[str, Any] = {
            "retry__timeout": TIMEOUT,
            "retry__max_attempts": 100,
            "retry__give_up": "keep",
            "delivery__workers": 4,
            **overrides,
        }
        soap = SoapClient()
        b: Broker = make_broker(soap=soap, **settings)
        made.append((b, soap))
        return b

    yield make
    for b, soap in made:
        b.stop()
        soap.close()


def _subscribe(b: Broker, address: str, topic: str) -> str:
    assert b.service is not None
    return b.service.subscribe(SubscribeRequest(EndpointReference(address), topic=simple(topic))).id


def _healthy_delay(b: Broker, healthy: ConsumerServer, pits: list[Tarpit], stuck: int) -> float:
    """Publish to the tarpits, wait until ``stuck`` deliveries hang in them, then publish
    to the healthy consumer: seconds until it has its notification."""
    assert b.service is not None
    b.service.notify([note("<m>pit</m>", simple("t:pit"))])
    wait_until(
        lambda: sum(p.connections() for p in pits) >= stuck, TIMEOUT, what="stuck deliveries"
    )
    started = time.monotonic()
    b.service.notify([note("<m>1</m>", simple("t:ok"))])
    # checked every 20 ms (not the back-off): the time read next is the delay measured
    wait_until(healthy.messages, TIMEOUT * 3, what="the healthy consumer's message", interval=FINE)
    return time.monotonic() - started


def test_subscriptions_to_one_tarpit_do_not_delay_a_healthy_consumer(
    soap_broker: Callable[..., Broker], consumer: ConsumerServer, tarpits: Callable[..., Tarpit]
) -> None:
    """16 subscriptions to one consumer that never answers (more than the 4 shared
    threads): its lane runs at most ``per_destination`` of them at once."""
    b = soap_broker()
    pit = tarpits()
    for i in range(16):
        _subscribe(b, pit.address(f"/t{i}"), "t:pit")
    _subscribe(b, consumer.address("/healthy"), "t:ok")
    share = b.settings.delivery.workers // 2  # per_destination's default
    assert _healthy_delay(b, consumer, [pit], share) < HEALTHY_WITHIN
    assert pit.connections() == share  # never more than its lane's share at once
    assert b.service is not None and b.service.engine.thread_count() == 4


def test_many_tarpit_destinations_do_not_delay_a_healthy_consumer(
    soap_broker: Callable[..., Broker], consumer: ConsumerServer, tarpits: Callable[..., Tarpit]
) -> None:
    """40 distinct consumers (on 40 loopback hosts) that never answer hold every one of the
    4 threads; the engine starts more threads once they have all been stuck for
    ``slow_after``."""
    b = soap_broker()
    pits = [tarpits(f"127.0.0.{10 + i}") for i in range(40)]
    for pit in pits:
        _subscribe(b, pit.address(), "t:pit")
    _subscribe(b, consumer.address("/healthy"), "t:ok")
    assert _healthy_delay(b, consumer, pits, 4) < HEALTHY_WITHIN
    assert b.service is not None
    assert 4 < b.service.engine.thread_count() <= b.settings.delivery.max_workers


def test_an_open_circuit_takes_no_threads_and_the_retry_policy_still_ends(
    soap_broker: Callable[..., Broker], consumer: ConsumerServer, tarpits: Callable[..., Tarpit]
) -> None:
    """After ``breaker_failures`` attempts without an answer in time the destination's
    circuit opens:
    no further connections while it is open (its subscriptions fail at once, holding no
    thread), a healthy consumer is served at once, and give-up still ends the
    subscriptions with SubscriptionEnd once their attempts are used up."""
    b = soap_broker(
        retry__timeout=1.0,
        retry__max_attempts=4,
        retry__give_up="end",
        retry__initial_delay=timedelta(seconds=0.1),
        retry__max_delay=timedelta(seconds=0.2),
        delivery__breaker_failures=2,
        delivery__breaker_open=timedelta(seconds=30),
    )
    assert b.service is not None
    pit = tarpits()
    watcher = consumer.address("/ends")
    _subscribe(b, watcher, topic="t:ends")
    subs = [
        b.service.subscribe(
            SubscribeRequest(
                EndpointReference(pit.address(f"/t{i}")),
                topic=simple("t:pit"),
                subscription_end_topic=simple("t:ends"),
            )
        ).id
        for i in range(6)
    ]
    b.service.notify([note("<m>1</m>", simple("t:pit"))])
    key = destination_key(pit.address())
    assert key is not None

    def lane_open() -> bool:
        lane = b.service.engine.lanes.get(key) if b.service else None
        return lane is not None and lane.state is LaneState.OPEN

    wait_until(lane_open, 10, what="the tarpit's circuit to open")
    made = pit.connections()
    # two at once (per_destination); one more may start between the two failures
    assert made <= 2 * 2
    # every subscription runs out of attempts while the circuit stays open: ended, with
    # SubscriptionEnd, and no new connection to the tarpit
    wait_until(lambda: not set(subs) & set(b.service.registry.subscriptions), 15, what="give-up")
    ends = consumer.wait_for_messages(len(subs), timeout=10)
    assert len(ends) == len(subs)
    # none while it is open: what the tarpit counts now is at most what could be on its
    # way when it opened (a connection started before the second failure is counted by
    # the tarpit when it accepts it, which may be after ``made`` was read)
    assert pit.connections() <= 2 * 2
    assert b.service.engine.thread_count() == b.settings.delivery.workers


# -- lanes on their own -----------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_lane_concurrency_and_release_order() -> None:
    lanes = Lanes(2)
    a = lanes.enter("http://h:1", ("a", 0))
    b = lanes.enter("http://h:1", ("b", 0))
    assert a is not None and a is b
    assert lanes.enter("http://h:1", ("c", 0)) is None  # waits in the lane
    assert lanes.enter("http://h:1", ("d", 0)) is None
    assert lanes.enter("http://other:1", ("x", 0)) is not None  # other lanes unaffected
    assert lanes.leave(a) == [("c", 0)]  # made ready again, in arrival order
    assert lanes.enter("http://h:1", ("c", 0)) is a
    assert lanes.enter("http://h:1", ("e", 0)) is None  # full again
    assert lanes.leave(a) == [("d", 0)]
    assert lanes.leave(a) == [("e", 0)]
    assert a.active == 0 and not a.waiting


def test_breaker_opens_probes_doubles_and_closes() -> None:
    clock = Clock()
    lanes = Lanes(4, BreakerSettings(failures=2, open_for=5, max_open=12), clock)
    lane = lanes.enter("http://h:1", ("a", 0))
    assert lane is not None
    lanes.report(lane, Outcome.TIMED_OUT)
    assert lanes.admit(lane) is None and lane.state is LaneState.CLOSED
    for _ in range(5):  # refused or reset at once: holds nothing, neither counts nor resets
        lanes.report(lane, Outcome.FAILED_FAST)
    assert lane.state is LaneState.CLOSED and lane.failures == 1
    lanes.report(lane, Outcome.TIMED_OUT)
    assert lane.state is LaneState.OPEN
    assert lanes.admit(lane) == pytest.approx(5)
    clock.now += 5
    assert lanes.admit(lane) is None  # the probe
    assert lane.state is LaneState.HALF_OPEN
    assert lanes.admit(lane) == pytest.approx(5)  # others wait for the probe
    lanes.report(lane, Outcome.TIMED_OUT)
    assert lane.state is LaneState.OPEN and lane.interval == 10
    clock.now += 10
    assert lanes.admit(lane) is None
    lanes.report(lane, Outcome.FAILED_FAST)  # a probe refused at once fails it too
    assert lane.interval == 12  # capped
    clock.now += 12
    assert lanes.admit(lane) is None
    lanes.report(lane, Outcome.ANSWERED)  # any answer closes it
    assert lane.state is LaneState.CLOSED and lane.failures == 0
    assert lanes.states() == {LaneState.CLOSED: 1, LaneState.OPEN: 0, LaneState.HALF_OPEN: 0}
    lanes.leave(lane)
    lanes.sweep()
    assert lanes.get("http://h:1") is None


@pytest.mark.parametrize(
    ("address", "key"),
    [
        ("http://127.0.0.1:8080/a", "http://127.0.0.1:8080"),
        ("http://127.1:8080/b", "http://127.0.0.1:8080"),
        ("HTTP://Consumer.Example/x", "http://consumer.example:80"),
        ("https://[::1]/x", "https://[::1]:443"),
        ("http://[::1", None),
    ],
)
def test_destination_key(address: str, key: str | None) -> None:
    assert destination_key(address) == key


def test_threads_started_for_slow_deliveries_end_when_idle() -> None:
    from wsnmom.core.delivery import DeliveryEngine

    engine = DeliveryEngine(workers=1, slow_after=0.05, idle_exit=0.3)
    release = threading.Event()
    try:
        handles = []
        for i in range(3):
            handle = _Handle()
            channel = engine.open_channel(
                f"c{i}",
                handle,
                lambda r: r,
                lambda batch: release.wait(5),
                lambda reason: None,
                destination=f"http://h{i}:1",
            )
            channel.start()
            handles.append(handle)
        for handle in handles:
            handle.deliver()
        wait_until(lambda: engine.thread_count() == 3, 5, what="threads for the stuck deliveries")
        release.set()
        wait_until(lambda: engine.thread_count() == 1, 5, what="the extra threads to end")
    finally:
        release.set()
        engine.close()


class _Handle:
    """A subscription handle that hands one message to its callback on demand."""

    def __init__(self) -> None:
        self.callback: Any = None

    def start(self, callback: Any, *, prefetch: int) -> None:
        self.callback = callback

    def stop(self) -> None:
        self.callback = None

    def deliver(self) -> None:
        self.callback(_Message())


class _Message:
    body = b""

    def ack(self) -> None:
        pass

    def nack(self, *, requeue: bool = True) -> None:
        pass


def test_many_ports_of_one_host_hold_at_most_the_hosts_share(
    soap_broker: Callable[..., Broker], consumer: ConsumerServer, tarpits: Callable[..., Tarpit]
) -> None:
    """Issue 22, item 2: 24 subscriptions, each to its own never-answering port of one
    host (127.0.0.2).  Each port is a destination of its own, so ``per_destination`` alone
    let them take every thread; the host's lane lets ``per_host`` of them run at once.
    The tarpits hold their connections for the whole test (a 60 s timeout), and a healthy
    consumer on another host still gets its notification while they do."""
    b = soap_broker(retry__timeout=60.0)
    pits = [tarpits("127.0.0.2") for _ in range(24)]
    for pit in pits:
        _subscribe(b, pit.address(), "t:pit")
    _subscribe(b, consumer.address("/healthy"), "t:ok")
    assert b.service is not None
    per_host = b.service.engine.lanes.per_host
    assert per_host < b.settings.delivery.workers
    b.service.notify([note("<m>pit</m>", simple("t:pit"))])
    wait_until(lambda: sum(p.connections() for p in pits) >= per_host, 10, what="the host's share")
    b.service.notify([note("<m>1</m>", simple("t:ok"))])
    consumer.wait_for_messages(1, timeout=30)
    # every place of the host is still held (nothing timed out), and no more were taken
    assert sum(p.connections() for p in pits) == per_host


def test_many_ports_each_timing_out_once_open_the_host_and_hold_no_thread(
    soap_broker: Callable[..., Broker], consumer: ConsumerServer, tarpits: Callable[..., Tarpit]
) -> None:
    """Issue 22, item 2: 48 never-answering ports of one host, each a destination of its
    own that times out once.  The host's circuit opens after ``breaker_failures`` timeouts
    over all its ports (counting only ports whose own circuits had opened, each of the 48
    had to time out three times first: a minute here), so the host then holds no delivery
    thread and no port of it is connected again, while a healthy consumer on another host
    gets its notification."""
    b = soap_broker(retry__timeout=1.0, delivery__breaker_open=timedelta(minutes=5))
    pits = [tarpits("127.0.0.2") for _ in range(48)]
    for pit in pits:
        _subscribe(b, pit.address(), "t:pit")
    _subscribe(b, consumer.address("/healthy"), "t:ok")
    assert b.service is not None
    lanes = b.service.engine.lanes
    b.service.notify([note("<m>pit</m>", simple("t:pit"))])

    def host_open_and_idle() -> bool:
        host = lanes.host(destination_key(pits[0].address()) or "")
        return host is not None and host.state is LaneState.OPEN and host.active == 0

    wait_until(host_open_and_idle, 15, what="the host's circuit open, its deliveries done")
    b.service.notify([note("<m>1</m>", simple("t:ok"))])
    consumer.wait_for_messages(1, timeout=30)
    # the first per_host timed out; only those that entered while they did got through
    failures = b.settings.delivery.breaker_failures
    assert sum(p.connections() for p in pits) <= lanes.per_host + failures - 1


def test_owner_lane_limits_one_identitys_deliveries() -> None:
    lanes = Lanes(4, per_owner=2)
    a = lanes.enter("http://h1:1", ("a", 0), "mallory")
    b = lanes.enter("http://h2:1", ("b", 0), "mallory")
    assert a is not None and b is not None
    assert lanes.enter("http://h3:1", ("c", 0), "mallory") is None  # the owner's share
    assert lanes.enter("http://h3:1", ("d", 0), "alice") is not None  # others unaffected
    assert lanes.leave(a, "mallory") == [("c", 0)]


def test_host_lane_limits_ports_and_opens_when_its_destinations_do() -> None:
    clock = Clock()
    lanes = Lanes(2, BreakerSettings(failures=2, open_for=5, max_open=20), clock, per_host=3)
    held = [lanes.enter(f"http://h:{port}", (port, 0)) for port in (1, 2, 3)]
    assert all(lane is not None for lane in held)
    assert lanes.enter("http://h:4", (4, 0)) is None  # the host's share is taken
    assert lanes.enter("http://other:4", (5, 0)) is not None
    for lane in held:
        assert lane is not None
        assert lanes.leave(lane) == ([(4, 0)] if lane is held[0] else [])
    # two ports stop answering: each one's own circuit opens after two timeouts
    for port in (1, 2):
        lane = lanes.get(f"http://h:{port}")
        assert lane is not None
        lanes.report(lane, Outcome.TIMED_OUT)
        lanes.report(lane, Outcome.TIMED_OUT)
        assert lane.state is LaneState.OPEN
    host = lanes.host("http://h:9")
    assert host is not None and host.state is LaneState.OPEN
    fresh = lanes.enter("http://h:9", (9, 0))
    assert fresh is not None
    assert lanes.admit(fresh) == pytest.approx(5)  # a new port of that host waits too
    clock.now += 5
    assert lanes.admit(fresh) is None  # the host's probe
    lanes.report(fresh, Outcome.ANSWERED)  # any answer from the host closes it
    assert host.state is LaneState.CLOSED
    assert lanes.admit(fresh) is None


def test_host_opens_after_timeouts_of_several_ports_and_an_answer_resets_them() -> None:
    clock = Clock()
    lanes = Lanes(2, BreakerSettings(failures=3, open_for=5, max_open=20), clock, per_host=3)

    def once(key: str, outcome: Outcome) -> None:
        lane = lanes.enter(key, (key, 0))
        assert lane is not None
        lanes.report(lane, outcome)
        lanes.leave(lane)

    # two ports time out, a third answers: the count starts again
    once("http://g:1", Outcome.TIMED_OUT)
    once("http://g:2", Outcome.TIMED_OUT)
    once("http://g:3", Outcome.ANSWERED)
    once("http://g:4", Outcome.TIMED_OUT)
    once("http://g:5", Outcome.TIMED_OUT)
    g = lanes.host("http://g:1")
    assert g is not None and g.state is LaneState.CLOSED
    # three ports of h time out once each: no port's own circuit opens, the host's does
    for port in (1, 2, 3):
        once(f"http://h:{port}", Outcome.TIMED_OUT)
        lane = lanes.get(f"http://h:{port}")
        assert lane is not None and lane.state is LaneState.CLOSED
    h = lanes.host("http://h:1")
    assert h is not None and h.state is LaneState.OPEN
    fresh = lanes.enter("http://h:99", (99, 0))
    assert fresh is not None
    assert lanes.admit(fresh) == pytest.approx(5)
    clock.now += 5
    assert lanes.admit(fresh) is None  # the probe
    lanes.report(fresh, Outcome.TIMED_OUT)
    assert h.state is LaneState.OPEN and h.interval == pytest.approx(10)
    # one dead port among live ones: its own circuit opens, not its host's
    for _ in range(3):
        once("http://d:1", Outcome.TIMED_OUT)
    d1, d = lanes.get("http://d:1"), lanes.host("http://d:1")
    assert d1 is not None and d1.state is LaneState.OPEN
    assert d is not None and d.state is LaneState.CLOSED
    # fast failures (refused connections) hold no thread: they do not count
    once("http://f:1", Outcome.FAILED_FAST)
    once("http://f:2", Outcome.FAILED_FAST)
    once("http://f:3", Outcome.FAILED_FAST)
    f = lanes.host("http://f:1")
    assert f is not None and f.state is LaneState.CLOSED
