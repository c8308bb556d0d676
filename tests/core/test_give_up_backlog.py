"""A subscription ended because its delivery gave up (``core.subscriptions``,
``Subscriptions.give_up``) leaves its whole backlog in its dead letters, on the queue
shape (the embedded adapter) and the log shape (the file log; Kafka shares its cursor
engine): the batch given up on with its own reason and attempts, every message behind it
(waiting in the middleware or held by the stopped channel) with the same reason and
"subscription ended: ...", each once, and none of them delivered.  A backlog the
middleware refuses keeps the subscription, its delivery stopped, until a sweep ends it.
A subscription feeding a pull point (``core.pull_feeds``) whose filter goes over its
budget does the same, on native pull (the queue, and the session shape against the test
Mosquitto) and on the pull buffer (the log).  The session shape of pushed subscriptions
and every middleware through a gateway: tests/e2e/test_dead_letters.py."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pytest
from wsnmom.core.adapter import HEADER_DROPPED_REASON, OutboundMessage
from wsnmom.core.dead_letter_records import DeadLetter
from wsnmom.core.model import CreatePullPointRequest, ExpressionSource
from wsnmom.core.service import BrokerService

from tests.fixtures.server import mqtt_gateway_url
from tests.support.waiting import wait_until

from .conftest import Broker, RecordingOutbound, note, simple, sub_req

C = "http://127.0.0.1:9/consumer"
XPATH10 = "http://www.w3.org/TR/1999/REC-xpath-19991116"
#: nested location paths: minutes of CPU on BIG, far past the filter budget
CUBIC = "count(//a[count(//a[count(//a) > 0]) > 0]) > 0"
BIG = "<r>" + "<a/>" * 3000 + "</r>"
SHAPES = {
    "queue": "embedded://{tmp}/mw",
    "log": "filelog://{tmp}/log?partitions=1",
}
BEHIND = ("second", "third", "fourth")


def make(make_broker: Any, shape: str, **overrides: Any) -> Broker:
    """A broker on ``shape`` that delivers one message per Notify (what follows the
    first waits behind it) and gives up after two attempts."""
    return make_broker(
        adapter_url=SHAPES[shape],
        delivery__batch_size=1,
        retry__max_attempts=2,
        retry__initial_delay=timedelta(seconds=0.01),
        retry__max_delay=timedelta(seconds=0.05),
        **overrides,
    )


def queue_behind(service: BrokerService, sub_id: str, first: str) -> None:
    """``first`` then ``BEHIND``, published while the subscription is paused, so that
    they are all waiting when delivery starts."""
    service.pause(sub_id)
    for text in (first, *BEHIND):
        service.notify([note(text if text.startswith("<") else f"<m>{text}</m>", simple("t:a"))])
    service.resume(sub_id)


def letters_of(service: BrokerService, count: int, timeout: float = 20) -> list[DeadLetter]:
    """The dead letters once there are ``count`` of them (the box reads them back on
    its own thread), asserting there are no more."""
    letters = wait_until(
        lambda: (d := service.dead_letters()) and len(d) >= count and d,
        timeout,
        what=f"{count} dead letters",
    )
    assert len(letters) == count, [d.body for d in letters]
    return letters


class RefusedBurials:
    """The log adapter of ``broker`` refuses the backlog's dead letters (those with the
    adapter's drop headers; the batch given up on is published by the channel without
    them) while ``refusing``; ``refused``: the size of each refused publish.  The cursor
    retries its burial every 0.2 to 0.4 s."""

    def __init__(self, broker: Broker) -> None:
        adapter = broker.adapter
        engine = adapter.cursor_engine()
        engine.bury_retry_first, engine.bury_retry_max = 0.2, 0.4
        self.refusing = True
        self.refused: list[int] = []
        real = adapter.publish_many

        def publish_many(messages: Sequence[OutboundMessage], timeout: float = 10.0) -> Any:
            if self.refusing and any(HEADER_DROPPED_REASON in m.headers for m in messages):
                self.refused.append(len(messages))
                raise RuntimeError("dead-letter topic refused")
            return real(messages, timeout)

        adapter.publish_many = publish_many


def by_text(letters: Sequence[DeadLetter], texts: Sequence[str]) -> dict[str, DeadLetter]:
    """Each text's one dead letter (asserting each is there exactly once)."""
    found: dict[str, DeadLetter] = {}
    for text in texts:
        mine = [d for d in letters if text.encode() in d.body]
        assert len(mine) == 1, (text, [d.body for d in letters])
        found[text] = mine[0]
    return found


def delivered_texts(outbound: RecordingOutbound) -> list[bytes]:
    return [m.message.payload for call in outbound.delivered for m in call.messages]


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_retries_exhausted_leave_the_whole_backlog_in_the_dead_letters(
    make_broker: Any, outbound: RecordingOutbound, shape: str
) -> None:
    service = make(make_broker, shape).service
    assert service is not None
    outbound.down.add(C)
    sub = service.subscribe(sub_req(C, topic=simple("t:a")))
    queue_behind(service, sub.id, "first")
    wait_until(lambda: sub.id not in service.registry.subscriptions, 20, what="the end")
    letters = letters_of(service, 4)
    found = by_text(letters, ("first", *BEHIND))
    assert found["first"].attempts == 2 and found["first"].last_error == f"{C} is down"
    for text in BEHIND:
        letter = found[text]
        assert letter.last_error == f"subscription ended: consumer unreachable: {C} is down"
        assert letter.time
    assert {d.reason for d in letters} == {"retries-exhausted"}
    assert {d.subscription_id for d in letters} == {sub.id}
    assert {d.consumer for d in letters} == {C}
    assert delivered_texts(outbound) == []
    # every attempt was of "first": nothing behind it was sent, then buried
    assert {m.message.payload for call in outbound.attempts for m in call.messages} == {
        b"<m>first</m>"
    }


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_filter_over_its_budget_leaves_the_whole_backlog_in_the_dead_letters(
    make_broker: Any, outbound: RecordingOutbound, shape: str
) -> None:
    service = make(make_broker, shape, filters__cpu_limit=0.3).service
    assert service is not None
    sub = service.subscribe(
        sub_req(C, topic=simple("t:a"), message_content=ExpressionSource(XPATH10, CUBIC, {}))
    )
    queue_behind(service, sub.id, BIG)
    wait_until(lambda: sub.id not in service.registry.subscriptions, 30, what="the end")
    letters = letters_of(service, 4)
    found = by_text(letters, (BIG, *BEHIND))
    assert found[BIG].attempts == 0 and "cpu_limit" in (found[BIG].last_error or "")
    for text in BEHIND:
        assert (found[text].last_error or "").startswith("subscription ended: ")
    assert {d.reason for d in letters} == {"filter-budget"}
    assert outbound.attempts == []


def test_a_refused_backlog_keeps_the_subscription_until_a_sweep_ends_it(
    make_broker: Any, outbound: RecordingOutbound
) -> None:
    """The log refuses the backlog's dead letters: the batch given up on is a dead
    letter, the subscription stays with its delivery stopped (nothing more is sent to
    the consumer) and the rest waits in the middleware; the sweep after the refusal ends
    it, every message a dead letter once."""
    b = make(make_broker, "log")
    service = b.service
    assert service is not None
    burials = RefusedBurials(b)
    outbound.down.add(C)
    sub = service.subscribe(sub_req(C, topic=simple("t:a")))
    queue_behind(service, sub.id, "first")
    [first] = wait_until(service.dead_letters, 20, what="the batch given up on")
    assert b"first" in first.body and first.reason == "retries-exhausted"
    wait_until(lambda: burials.refused, 20, what="a refused burial")
    wait_until(lambda: sub.id in service.subscriptions._ending, 20, what="the end pending")
    assert sub.id in service.registry.subscriptions
    channel = service.engine.channel(sub.id)
    assert channel is None or not channel.active
    attempts = len(outbound.attempts)
    burials.refusing = False
    service.sweep()
    assert sub.id not in service.registry.subscriptions
    letters = letters_of(service, 4)
    found = by_text(letters, ("first", *BEHIND))
    # buried by the sweep's end, or by the cursor's retry of what the refused end held
    # (the log's drops are "overflow" then: adapters/logbase/burial.py)
    assert {found[t].reason for t in BEHIND} <= {"retries-exhausted", "overflow"}
    assert len(outbound.attempts) == attempts  # delivery stayed stopped
    assert delivered_texts(outbound) == []


def test_a_full_subscription_is_ended_by_the_instance_that_delivers_it(
    make_broker: Any,
) -> None:
    """``limits.on_full = "end"`` with several instances on one store: the sweep of an
    instance ends only the full subscriptions it delivers (whose delivery it stops before
    their backlog goes to the dead letters), the leader's included; the instance that
    delivers one ends it without leading.  (The cluster member's answers are set on the
    context as ``core.service`` sets them from ``core.cluster``.)"""
    service = make(make_broker, "queue", limits__max_messages=3, limits__on_full="end").service
    assert service is not None
    sub = service.subscribe(sub_req(C, topic=simple("t:a")))
    service.pause(sub.id)
    for text in ("first", "second", "third"):  # max_messages: full, nothing dropped
        service.notify([note(f"<m>{text}</m>", simple("t:a"))])
    ctx = service._ctx
    ctx.leads, ctx.delivers = (lambda: True), (lambda _id: False)
    service.sweep()  # the leader, not delivering it
    assert sub.id in service.registry.subscriptions
    assert service.dead_letters() == []
    ctx.leads, ctx.delivers = (lambda: False), (lambda _id: True)
    service.sweep()  # delivering it, not leading
    assert sub.id not in service.registry.subscriptions
    letters = letters_of(service, 3, timeout=10)
    assert {d.reason for d in letters} == {"overflow-end"}
    assert {d.subscription_id for d in letters} == {sub.id}


#: passes the filter at once (one <a/>): what reached the pull point before the breach
EARLY = "<r><a/><e>early</e></r>"
#: the feed's reader per shape: the embedded queue's and MQTT's own pull (MQTT against
#: the test Mosquitto), the file log's buffer
FEEDS = {"queue": "native pull", "session": "native pull", "log": "pull buffer"}


def make_feeding(make_broker: Any, request: pytest.FixtureRequest, shape: str) -> Broker:
    """``make`` with a filter budget, on the session shape too."""
    if shape != "session":
        return make(make_broker, shape, filters__cpu_limit=0.3)
    url = mqtt_gateway_url(str(request.getfixturevalue("mqtt_url"))) + "&data_dir={tmp}/mqtt"
    return make_broker(adapter_url=url, filters__cpu_limit=0.3)


def feeding(service: BrokerService) -> tuple[str, str]:
    """A pull point and a subscription feeding it with the costly filter (ids)."""
    pp = service.create_pull_point(CreatePullPointRequest())
    sub = service.subscribe(
        sub_req(
            service.pull_point_address(pp.id),
            topic=simple("t:a"),
            message_content=ExpressionSource(XPATH10, CUBIC, {}),
        )
    )
    assert service.registry.subscriptions[sub.id].feed is not None
    return pp.id, sub.id


def queue_all(service: BrokerService, sub_id: str) -> None:
    """``EARLY``, ``BIG``, then ``BEHIND``, all waiting in the subscription when its
    feed is read again (MQTT's session queue takes them from Mosquitto asynchronously)."""
    service.pause(sub_id)
    for text in (EARLY, BIG, *BEHIND):
        service.notify([note(text if text.startswith("<") else f"<m>{text}</m>", simple("t:a"))])
    handle = service.registry.subscriptions[sub_id].handle
    assert handle is not None
    wait_until(lambda: (n := handle.depth()) is None or n >= 5, 20, what="the backlog")
    service.resume(sub_id)


def handed_out(service: BrokerService, pp_id: str, maximum: int | None) -> list[bytes]:
    return [m.payload for m in service.get_messages(pp_id, maximum)]


@pytest.mark.parametrize("shape", sorted(FEEDS))
def test_a_feed_over_its_filter_budget_leaves_its_backlog_in_the_dead_letters(
    make_broker: Any, request: pytest.FixtureRequest, shape: str
) -> None:
    """A subscription feeding a pull point (core.pull_feeds; native pull on the queue
    and the session, the buffer on the log) whose filter goes over its budget: what
    reached the pull point before the breach is handed out once, the breaching message
    and every one behind it are dead letters once each, and nothing from the breach on
    is handed out."""
    service = make_feeding(make_broker, request, shape).service
    assert service is not None
    pp_id, sub_id = feeding(service)
    queue_all(service, sub_id)
    handed: list[bytes] = []
    # two at a time: with native pull the answer stops at the breach, the rest waits
    wait_until(
        lambda: (
            handed.extend(handed_out(service, pp_id, 2))
            or sub_id not in service.registry.subscriptions
        ),
        30,
        what="the end",
    )
    letters = letters_of(service, 4)
    # what reached the pull point is kept in it (with the buffer: copied into its inbox)
    wait_until(
        lambda: handed.extend(handed_out(service, pp_id, None)) or handed,
        20,
        what="the early message",
    )
    assert handed == [EARLY.encode()]
    found = by_text(letters, (BIG, *BEHIND))
    # (the buffer's BIG was read once, unsettled: the log counts that as an attempt)
    assert "cpu_limit" in (found[BIG].last_error or "")
    for text in BEHIND:
        assert (found[text].last_error or "").startswith("subscription ended: ")
    assert {d.reason for d in letters} == {"filter-budget"}
    assert {d.subscription_id for d in letters} == {sub_id}
    assert handed_out(service, pp_id, None) == []


def test_a_feed_whose_backlog_is_refused_stays_stopped_until_a_sweep_ends_it(
    make_broker: Any,
) -> None:
    """The log refuses the backlog of a feed its filter ended: the subscription stays,
    its feed stopped (nothing more read into the pull point's buffer), what reached the
    pull point before the breach is still handed out; the sweep after the refusal ends
    it, every message from the breach on a dead letter once."""
    b = make(make_broker, "log", filters__cpu_limit=0.3)
    service = b.service
    assert service is not None
    burials = RefusedBurials(b)
    pp_id, sub_id = feeding(service)
    queue_all(service, sub_id)
    wait_until(lambda: burials.refused, 20, what="a refused burial")
    wait_until(lambda: sub_id in service.subscriptions._ending, 20, what="the end pending")
    assert sub_id in service.registry.subscriptions
    reader = service.registry.pull_points[pp_id].reader
    handle = service.registry.subscriptions[sub_id].handle
    assert handle in reader.feeds(active=False)
    handed = wait_until(lambda: handed_out(service, pp_id, None), 20, what="the early message")
    assert handed == [EARLY.encode()]
    burials.refusing = False
    service.sweep()
    assert sub_id not in service.registry.subscriptions
    letters = letters_of(service, 4)
    found = by_text(letters, (BIG, *BEHIND))
    # buried by the sweep's end, or by the cursor's retry of what the refused end held
    # (the log's drops are "overflow" then: adapters/logbase/burial.py)
    assert {d.reason for d in found.values()} <= {"filter-budget", "overflow"}
    assert handed_out(service, pp_id, None) == []
