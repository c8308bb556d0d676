"""Core's paths over the adapter shapes, in process (Issue 24 item 1, Issue 27 item 4):
the embedded adapter (a queue per subscription, sole publisher: core routes pull-point
feeds at publish time), the file-log reference adapter (log + cursor: in-order settling,
pull feeds read from the log), and the test adapters of tests/support/shaped_adapters.py
standing for MQTT's session shape (not sole publisher, native pull) and RabbitMQ's queue
shape (not sole publisher, core's pull buffer).  Each test proves one path of core on every
shape: push in order, pause and resume, unsubscribe, renew, a pull point fed by a
subscription (read by the pull point from the subscription's own durable subscription:
core's one pull path, through the middleware's pull or core's pull buffer; routed at
publish time on embedded), with a MessageContent filter, paused and unsubscribed (what
reached the pull point stays), a failing consumer (retry, and across a restart), a Notify
sent to a pull point, unordered delivery past a stalled message, a dead letter after the
last attempt.
The broker e2e tests (tests/e2e/) then only need to prove the middleware, not core again."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from wsnmom.core import errors
from wsnmom.core.model import CreatePullPointRequest, ExpressionSource
from wsnmom.core.pull_reader import PullReader
from wsnmom.core.service import BrokerService

from tests.support.shaped_adapters import QUEUE_SCHEME, SESSION_SCHEME, registered
from tests.support.waiting import wait_until

from .conftest import Broker, RecordingOutbound, note, simple, sub_req, wait_idle

A = "http://127.0.0.1:9/a"
WITNESS = "http://127.0.0.1:9/witness"
SENTINEL = b"<sentinel/>"
XPATH10 = "http://www.w3.org/TR/1999/REC-xpath-19991116"

#: shape -> adapter URL (None: the conftest's embedded adapter)
SHAPES: dict[str, str | None] = {
    "embedded": None,
    "log": "filelog://{tmp}/log?partitions=1",
    "session": SESSION_SCHEME + "://{tmp}/mw",
    "queue": QUEUE_SCHEME + "://{tmp}/mw",
}
#: the shapes whose pull points the middleware serves (no pull buffer in core)
SHAPES_NATIVE_PULL = ("embedded", "session")


@pytest.fixture(scope="module", autouse=True)
def _shaped_adapters() -> Iterator[None]:
    """``testsession://`` and ``testqueue://`` for this module's tests only."""
    with registered():
        yield


@pytest.fixture(params=list(SHAPES))
def shape(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def start(shape: str, make_broker: Callable[..., Broker]) -> Callable[..., Broker]:
    """Start a broker of ``shape`` (keyword arguments: settings overrides)."""

    def make(**overrides: Any) -> Broker:
        return make_broker(adapter_url=SHAPES[shape], limits__max_age=None, **overrides)

    return make


def running(broker: Broker) -> BrokerService:
    assert broker.service is not None
    return broker.service


def body(i: int | str) -> str:
    return f"<m>{i}</m>"


def publish(service: BrokerService, *bodies: str, topic: str = "t:a") -> None:
    service.notify([note(b, simple(topic)) for b in bodies])


def barrier(service: BrokerService, outbound: RecordingOutbound) -> None:
    """A sentinel through the control subscription at WITNESS (on t:a), then every active
    subscription settled what it holds: after this, whatever an active subscription was
    going to deliver of what was published before has reached its consumer."""
    n = outbound.payloads_to(WITNESS).count(SENTINEL)
    publish(service, SENTINEL.decode())
    wait_until(
        lambda: outbound.payloads_to(WITNESS).count(SENTINEL) > n,
        what="the sentinel at the control subscription",
    )
    wait_idle(service)


def test_the_shapes_present_what_core_acts_on(shape: str, start: Callable[..., Broker]) -> None:
    caps = running(start()).adapter.capabilities
    expected = {
        "embedded": ("queue", True, True),
        "log": ("log", False, False),
        "session": ("session", False, True),
        "queue": ("queue", False, False),
    }[shape]
    assert (caps.shape, caps.sole_publisher, caps.native_pull) == expected


def test_push_delivers_in_order(start: Callable[..., Broker], outbound: RecordingOutbound) -> None:
    service = running(start())
    service.subscribe(sub_req(A, topic=simple("t:a")))
    for i in range(4):
        publish(service, *[body(i * 5 + j) for j in range(5)])
    got = outbound.wait_messages(A, 20)
    assert [d.message.payload for d in got] == [body(i).encode() for i in range(20)]


def test_pause_holds_and_resume_delivers(
    start: Callable[..., Broker], outbound: RecordingOutbound
) -> None:
    service = running(start())
    sub = service.subscribe(sub_req(A, topic=simple("t:a")))
    service.subscribe(sub_req(WITNESS, topic=simple("t:a")))
    publish(service, body(0))
    outbound.wait_messages(A, 1)
    service.pause(sub.id)
    publish(service, body(1), body(2))
    barrier(service, outbound)
    assert outbound.payloads_to(A) == [body(0).encode()]  # held while paused
    service.resume(sub.id)
    got = outbound.wait_messages(A, 4)
    assert [d.message.payload for d in got] == [
        body(0).encode(),
        body(1).encode(),
        body(2).encode(),
        SENTINEL,
    ]


def test_unsubscribe_stops_delivery(
    start: Callable[..., Broker], outbound: RecordingOutbound
) -> None:
    service = running(start())
    sub = service.subscribe(sub_req(A, topic=simple("t:a")))
    service.subscribe(sub_req(WITNESS, topic=simple("t:a")))
    publish(service, body(0))
    outbound.wait_messages(A, 1)
    assert sub.id in (service.adapter.subscription_names() or [])
    service.unsubscribe(sub.id)
    publish(service, body(1))
    barrier(service, outbound)
    assert outbound.payloads_to(A) == [body(0).encode()]
    # and neither core nor the middleware keeps anything for it
    assert service.engine.channel(sub.id) is None
    assert sub.id not in (service.adapter.subscription_names() or [])
    with pytest.raises(errors.ResourceUnknown):
        service.get_subscription(sub.id)


def test_a_renewed_subscription_outlives_its_first_termination_time(
    start: Callable[..., Broker], outbound: RecordingOutbound, clock: Any
) -> None:
    service = running(start())
    minute = timedelta(minutes=1)
    renewed = service.subscribe(sub_req(A, topic=simple("t:a"), initial_termination_time=minute))
    ends = service.subscribe(sub_req(WITNESS, topic=simple("t:a"), initial_termination_time=minute))
    service.renew(renewed.id, timedelta(minutes=10))
    clock.advance(minutes=2)
    service.sweep()
    with pytest.raises(errors.ResourceUnknown):
        service.get_subscription(ends.id)  # not renewed: ended by the sweep
    publish(service, body(0))
    assert outbound.wait_messages(A, 1)[0].message.payload == body(0).encode()
    assert service.get_subscription(renewed.id).termination_time is not None


def test_a_pull_point_fed_by_a_subscription(shape: str, start: Callable[..., Broker]) -> None:
    service = running(start())
    pp = service.create_pull_point(CreatePullPointRequest())
    sub = service.subscribe(sub_req(service.pull_point_address(pp.id), topic=simple("t:a")))
    state = service.registry.subscriptions[sub.id]
    # the path core takes for the shape: routed at publish time (sole publisher), else
    # read by the pull point from its own durable subscription, never a delivery channel
    if shape == "embedded":
        assert state.handle is None
    else:
        reader = service.registry.pull_points[pp.id].reader
        assert state.handle is not None and state.feed is reader
        assert isinstance(reader, PullReader) == (shape in SHAPES_NATIVE_PULL)
    assert service.engine.channel(sub.id) is None
    publish(service, *[body(i) for i in range(5)])
    got: list[bytes] = []

    def five() -> bool:
        got.extend(m.payload for m in service.get_messages(pp.id, 2))
        return len(got) >= 5

    wait_until(five, what="5 messages from the pull point")
    assert got == [body(i).encode() for i in range(5)]
    assert service.get_messages(pp.id, None) == []


def test_a_failing_consumer_gets_everything_once_it_answers(
    start: Callable[..., Broker], outbound: RecordingOutbound
) -> None:
    service = running(start(retry__max_attempts=100))
    service.subscribe(sub_req(A, topic=simple("t:a")))
    outbound.down.add(A)
    publish(service, *[body(i) for i in range(3)])
    assert outbound.wait(lambda: sum(c.address == A for c in outbound.attempts) >= 2)
    with outbound.cond:
        outbound.down.discard(A)
    got = outbound.wait_messages(A, 3)
    assert [d.message.payload for d in got] == [body(i).encode() for i in range(3)]


def test_what_a_failing_consumer_did_not_take_comes_after_a_restart(
    start: Callable[..., Broker], outbound: RecordingOutbound
) -> None:
    broker = start(retry__max_attempts=100)
    service = running(broker)
    service.subscribe(sub_req(A, topic=simple("t:a")))
    outbound.down.add(A)
    publish(service, *[body(i) for i in range(3)])
    assert outbound.wait(lambda: any(c.address == A for c in outbound.attempts))
    service = broker.restart()
    with outbound.cond:
        outbound.down.discard(A)
    got = outbound.wait_messages(A, 3)
    assert [d.message.payload for d in got] == [body(i).encode() for i in range(3)]
    publish(service, body(3))
    got = outbound.wait_messages(A, 4)
    assert [d.message.payload for d in got] == [body(i).encode() for i in range(4)]


def test_unordered_delivery_goes_past_a_stalled_message(
    start: Callable[..., Broker], outbound: RecordingOutbound, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = running(start())
    release = threading.Event()
    stalled = threading.Event()
    notify = outbound.notify

    def holding(consumer: Any, soap_version: Any, messages: Any, **kw: Any) -> None:
        if any(d.message.payload == body("one").encode() for d in messages):
            stalled.set()
            assert release.wait(10)
        notify(consumer, soap_version, messages, **kw)

    monkeypatch.setattr(outbound, "notify", holding)
    policy = (("Ordering", "unordered"), ("InFlight", "2"))
    sub = service.subscribe(sub_req(A, topic=simple("t:a"), delivery_policy=policy))
    try:
        publish(service, body("one"))
        assert stalled.wait(10)
        publish(service, body("two"))
        [got] = outbound.wait_messages(A, 1)  # while the first one's answer is held
        assert got.message.payload == body("two").encode()
    finally:
        release.set()
    both = outbound.wait_messages(A, 2)
    assert [d.message.payload for d in both] == [body("two").encode(), body("one").encode()]
    wait_idle(service)
    channel = service.engine.channel(sub.id)
    assert channel is not None and channel.status().delivered == 2


def test_a_message_given_up_is_dead_lettered(
    start: Callable[..., Broker], outbound: RecordingOutbound
) -> None:
    """The last attempt failed: the message is in the dead letters and the subscription
    (its consumer unreachable) ended, as on every shape."""
    service = running(start(retry__max_attempts=2))
    sub = service.subscribe(sub_req(A, topic=simple("t:a")))
    outbound.down.add(A)
    publish(service, body("lost"))
    [letter] = wait_until(service.dead_letters, 10, what="a dead letter")
    assert body("lost").encode() in letter.body
    assert sum(c.address == A for c in outbound.attempts) == 2
    wait_until(lambda: sub.id not in service.registry.subscriptions, what="the subscription to end")
    assert outbound.payloads_to(A) == []


def test_a_fed_pull_point_keeps_what_was_not_taken_across_a_restart(
    start: Callable[..., Broker],
) -> None:
    broker = start()
    service = running(broker)
    pp = service.create_pull_point(CreatePullPointRequest())
    service.subscribe(sub_req(service.pull_point_address(pp.id), topic=simple("t:a")))
    publish(service, *[body(i) for i in range(4)])
    got: list[bytes] = []

    def two() -> bool:
        got.extend(m.payload for m in service.get_messages(pp.id, 2 - len(got)))
        return len(got) >= 2

    wait_until(two, what="2 messages from the pull point")
    service = broker.restart()
    publish(service, body(4))
    rest: list[bytes] = []

    def three() -> bool:
        rest.extend(m.payload for m in service.get_messages(pp.id, None))
        return len(rest) >= 3

    wait_until(three, what="the rest from the pull point after a restart")
    assert got == [body(0).encode(), body(1).encode()]
    assert rest == [body(i).encode() for i in range(2, 5)]


def test_a_notify_sent_to_a_pull_point_is_handed_out_once_across_a_restart(
    shape: str, start: Callable[..., Broker]
) -> None:
    """A Notify sent to the pull point itself: its own queue, read through the middleware's
    pull (native pull) or core's pull buffer (the queue and log shapes)."""
    broker = start()
    service = running(broker)
    pp = service.create_pull_point(CreatePullPointRequest())
    reader = service.registry.pull_points[pp.id].reader
    assert isinstance(reader, PullReader) == (shape in SHAPES_NATIVE_PULL)
    service.notify_pull_point(pp.id, [note(body(i), simple("t:a")) for i in range(4)])
    got: list[bytes] = []

    def two() -> bool:
        got.extend(m.payload for m in service.get_messages(pp.id, 2 - len(got)))
        return len(got) >= 2

    wait_until(two, what="2 messages from the pull point")
    service = broker.restart()
    rest: list[bytes] = []

    def two_more() -> bool:
        rest.extend(m.payload for m in service.get_messages(pp.id, None))
        return len(rest) >= 2

    wait_until(two_more, what="the rest from the pull point after a restart")
    assert got == [body(0).encode(), body(1).encode()]
    assert rest == [body(2).encode(), body(3).encode()]


def _drain_until(service: BrokerService, pp_id: str, last: bytes) -> list[Any]:
    """GetMessages until ``last`` is among what came (every message, in order)."""
    got: list[Any] = []

    def there() -> bool:
        got.extend(service.get_messages(pp_id, None))
        return any(m.payload == last for m in got)

    wait_until(there, what=f"{last!r} from the pull point")
    return got


def _reached(service: BrokerService, pp_id: str, sub_id: str, n: int) -> None:
    """Wait until ``n`` messages of the subscription reached its pull point: in the inbox
    (routed at publish time), core's pull buffer, or the feed the pull point reads."""
    state = service.registry.subscriptions[sub_id]
    reader = service.registry.pull_points[pp_id].reader
    if state.handle is None:
        count = reader.handle.depth
    elif isinstance(reader, PullReader):
        count = state.handle.depth
    else:
        count = reader.buffered
    wait_until(lambda: count() == n, what=f"{n} message(s) in the pull point")


def test_a_pull_point_feed_with_a_content_filter(start: Callable[..., Broker]) -> None:
    """The MessageContent filter is applied and the SubscriptionReference is the feeding
    subscription's, whatever the shape (on embedded too: such a subscription is read by
    the pull point, not routed at publish time)."""
    service = running(start())
    pp = service.create_pull_point(CreatePullPointRequest())
    content = ExpressionSource(XPATH10, "boolean(/*[@keep='1'])", {})
    sub = service.subscribe(
        sub_req(service.pull_point_address(pp.id), topic=simple("t:a"), message_content=content)
    )
    assert service.registry.subscriptions[sub.id].feed is service.registry.pull_points[pp.id].reader
    publish(service, *[f'<m keep="{i % 2}">{i}</m>' for i in range(6)])
    got = _drain_until(service, pp.id, b'<m keep="1">5</m>')
    assert [m.payload for m in got] == [f'<m keep="1">{i}</m>'.encode() for i in (1, 3, 5)]
    address = service.subscription_address(sub.id)
    assert {m.subscription_reference.address for m in got} == {address}


def test_pausing_a_feed_keeps_what_reached_the_pull_point(start: Callable[..., Broker]) -> None:
    service = running(start())
    pp = service.create_pull_point(CreatePullPointRequest())
    sub = service.subscribe(sub_req(service.pull_point_address(pp.id), topic=simple("t:a")))
    publish(service, body(0), body(1))
    _reached(service, pp.id, sub.id, 2)
    service.pause(sub.id)
    publish(service, body(2), body(3))  # held in the subscription while it is paused
    service.notify_pull_point(pp.id, [note("<sentinel/>", simple("t:a"))])
    got = _drain_until(service, pp.id, SENTINEL)
    assert [m.payload for m in got] == [body(0).encode(), body(1).encode(), SENTINEL]
    address = service.subscription_address(sub.id)
    assert [m.subscription_reference.address for m in got[:2]] == [address, address]
    service.resume(sub.id)
    rest = _drain_until(service, pp.id, body(3).encode())
    assert [m.payload for m in rest] == [body(2).encode(), body(3).encode()]


def test_unsubscribing_a_feed_keeps_what_reached_the_pull_point(
    start: Callable[..., Broker],
) -> None:
    service = running(start())
    pp = service.create_pull_point(CreatePullPointRequest())
    sub = service.subscribe(sub_req(service.pull_point_address(pp.id), topic=simple("t:a")))
    publish(service, body(0), body(1))
    _reached(service, pp.id, sub.id, 2)
    service.unsubscribe(sub.id)
    publish(service, body(2))
    service.notify_pull_point(pp.id, [note("<sentinel/>", simple("t:a"))])
    got = _drain_until(service, pp.id, SENTINEL)
    assert [m.payload for m in got] == [body(0).encode(), body(1).encode(), SENTINEL]
    assert sub.id not in (service.adapter.subscription_names() or [])
