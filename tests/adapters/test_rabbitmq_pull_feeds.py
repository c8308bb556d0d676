"""Core's one pull path on RabbitMQ with ``pull = "get"`` (issue 24 item 1, issue 29): a
pull point fed by a subscription is read from the subscription's own queue by GetMessages
(``basic.get``), rendered for that subscription; no copy goes into the pull point's queue
and no consumer is started for the feed.  A pause keeps what reached the pull point; with
the default pull (core's buffer) a resume right after it keeps the subscription's order."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from wsnmom.adapters.rabbitmq import RabbitMQAdapter
from wsnmom.core.model import CreatePullPointRequest
from wsnmom.core.outbound_policy import OutboundPolicy
from wsnmom.core.pull_buffer import PullBuffer
from wsnmom.core.pull_reader import PullReader
from wsnmom.core.service import BrokerService
from wsnmom.core.store_sqlite import SqliteStore
from wsnmom.topic_mapping.topic_set import TopicSet

from tests.core.conftest import (
    FakeClock,
    RecordingOutbound,
    documentation_address,
    make_settings,
    note,
    simple,
    sub_req,
)
from tests.support.pull_answers import cut, held_answer, pulled, written_up_to, wsgi_app
from tests.support.pull_breach import BIG, EARLY, buffered_feed, queued_feed
from tests.support.waiting import wait_until

pytestmark = pytest.mark.rabbitmq


@pytest.fixture
def service(private_vhost: str) -> Iterator[BrokerService]:
    url = private_vhost + ("&" if "?" in private_vhost else "?") + "pull=get"
    yield from _service(url)


@pytest.fixture
def buffered(private_vhost: str) -> Iterator[BrokerService]:
    """The default pull (core's buffer), holding at most 2 messages per handle."""
    yield from _service(private_vhost, limits__get_messages_cap=2)


@pytest.fixture
def budgeted(private_vhost: str) -> Iterator[BrokerService]:
    """The default pull (core's buffer), a filter budget of 0.2 CPU s at nice 0."""
    yield from _service(private_vhost, filters__cpu_limit=0.2, filters__costly_nice=0)


@pytest.fixture
def budgeted_get(private_vhost: str) -> Iterator[BrokerService]:
    """``pull = "get"``, a filter budget of 0.2 CPU s at nice 0."""
    url = private_vhost + ("&" if "?" in private_vhost else "?") + "pull=get"
    yield from _service(url, filters__cpu_limit=0.2, filters__costly_nice=0)


def _service(url: str, **overrides: object) -> Iterator[BrokerService]:
    adapter = RabbitMQAdapter(url)
    adapter.open()
    settings = make_settings(limits__max_age=None, **overrides)
    store = SqliteStore(str(Path(tempfile.mkdtemp(prefix="wsnmom-rmqfeeds-")) / "store.db"))
    svc = BrokerService(
        settings,
        adapter,
        store,
        RecordingOutbound(),
        topic_set=TopicSet(fixed=False),
        clock=FakeClock(),
        demand_interval=0.2,
        outbound_policy=OutboundPolicy(settings.outbound, resolver=documentation_address),
    )
    svc.start()
    try:
        yield svc
    finally:
        svc.close()  # the service leaves its adapter and store to their owner
        adapter.close()  # left open, it retried its vhost, deleted after the test, for ever
        store.close()


def test_get_messages_reads_the_feeding_subscriptions_queue(service: BrokerService) -> None:
    pp = service.create_pull_point(CreatePullPointRequest())
    sub = service.subscribe(sub_req(service.pull_point_address(pp.id), topic=simple("t:a")))
    live = service.registry.pull_points[pp.id]
    state = service.registry.subscriptions[sub.id]
    assert isinstance(live.reader, PullReader) and state.feed is live.reader
    assert service.engine.channel(sub.id) is None  # no delivery channel
    assert state.handle is not None and not state.handle.consuming
    service.notify([note(f"<m>{i}</m>", simple("t:a")) for i in range(3)])
    wait_until(lambda: state.handle.depth() == 3, 10, what="3 messages in the subscription's queue")
    assert live.handle.depth() == 0  # nothing was copied into the pull point's queue
    messages = service.get_messages(pp.id, None)
    assert [m.payload for m in messages] == [f"<m>{i}</m>".encode() for i in range(3)]
    address = service.subscription_address(sub.id)
    assert {m.subscription_reference.address for m in messages} == {address}
    assert state.handle.depth() == 0


def test_a_pause_keeps_what_reached_the_pull_point(service: BrokerService) -> None:
    pp = service.create_pull_point(CreatePullPointRequest())
    sub = service.subscribe(sub_req(service.pull_point_address(pp.id), topic=simple("t:a")))
    state = service.registry.subscriptions[sub.id]
    service.notify([note(f"<m>{i}</m>", simple("t:a")) for i in range(2)])
    wait_until(lambda: state.handle.depth() == 2, 10, what="2 messages in the subscription")
    service.pause(sub.id)
    service.notify([note("<m>2</m>", simple("t:a"))])  # waits in the subscription
    service.notify_pull_point(pp.id, [note("<sentinel/>", simple("t:a"))])
    assert pulled(service, pp.id, 3) == [b"<m>0</m>", b"<m>1</m>", b"<sentinel/>"]
    service.resume(sub.id)
    assert pulled(service, pp.id, 1) == [b"<m>2</m>"]


def test_a_resume_right_after_a_pause_keeps_the_order_with_the_buffer(
    buffered: BrokerService,
) -> None:
    service = buffered
    pp = service.create_pull_point(CreatePullPointRequest())
    buffer = service.registry.pull_points[pp.id].reader
    assert isinstance(buffer, PullBuffer)
    # the inbox's share of the buffer is full: what the pause keeps in the inbox waits
    service.notify_pull_point(pp.id, [note(f"<i>{i}</i>", simple("t:r")) for i in range(2)])
    wait_until(lambda: buffer.buffered() == 2, 10, what="the inbox's 2 messages buffered")
    sub = service.subscribe(sub_req(service.pull_point_address(pp.id), topic=simple("t:r")))
    service.notify([note(f"<m>{i}</m>", simple("t:r")) for i in range(3)])
    wait_until(lambda: buffer.buffered() == 4, 10, what="the feed's 2 messages buffered")
    service.pause(sub.id)  # <m>0</m>, <m>1</m> reached the pull point: kept in its inbox
    service.resume(sub.id)
    service.notify([note("<sentinel/>", simple("t:r"))])
    wait_until(
        lambda: buffer.holding_back(sub.id) or buffer.buffered() >= 4,
        10,
        what="the resumed feed held back or read",
    )
    got: list[bytes] = []

    def seen() -> bool:
        got.extend(m.payload for m in service.get_messages(pp.id, None))
        return b"<sentinel/>" in got

    wait_until(seen, 10, what="the sentinel at the pull point")
    fed = [p for p in got if p.startswith((b"<m>", b"<sentinel"))]
    assert fed == [b"<m>0</m>", b"<m>1</m>", b"<m>2</m>", b"<sentinel/>"]


def _cut_then_written(service: BrokerService) -> tuple[list[str], list[str]]:
    """Four messages into a new pull point; an answer cut on its way (its body made, the
    server's write never returned), then what written answers hand out up to a sentinel."""
    app = wsgi_app(service)
    pp = service.create_pull_point(CreatePullPointRequest())
    service.notify_pull_point(pp.id, [note(f"<m>{i}</m>") for i in range(4)])
    first: list[str] = []

    def answered() -> bool:
        first.extend(cut(app, pp.id))
        return bool(first)

    wait_until(answered, 10, what="an answer holding messages")
    service.notify_pull_point(pp.id, [note("<m>sentinel</m>")])
    return first, written_up_to(app, pp.id, "sentinel", 10)


def test_pull_get_an_answer_cut_on_its_way_comes_again(service: BrokerService) -> None:
    """``pull = "get"``: the gets are acknowledged only after the write (no auto-ack)."""
    first, after = _cut_then_written(service)
    assert first  # the cut answer held messages, and none of them is lost
    assert after == ["0", "1", "2", "3", "sentinel"]


def test_buffered_pull_an_answer_cut_on_its_way_comes_again(buffered: BrokerService) -> None:
    first, after = _cut_then_written(buffered)
    assert first
    assert after == ["0", "1", "2", "3", "sentinel"]  # given back at the head of the buffer


def test_an_answer_on_its_way_when_the_feed_ends_is_not_dead_lettered(
    budgeted: BrokerService,
) -> None:
    """The buffer handed a feed's message out in an answer not yet settled (the server
    still sending it) when the feed's filter goes over its budget: the end's stop of the
    feed's handle waits for that answer's settlement, so the message is handed out and
    not also sent to the dead letters with the backlog (its acknowledgement made after
    the handle's channel closed was lost: RabbitMQ had put it back into the queue)."""
    service = budgeted
    feed, _ = buffered_feed(service)
    with feed.held_answer() as held:  # made, not yet sent: unsettled
        feed.notify(BIG)  # over the budget: the subscription ends
        # the end reached the feed's handle: waiting for the answer, or (the defect)
        # stopped it and sent the backlog to the dead letters
        feed.wait_until_the_end_waits(or_else=service.dead_letters)
        held.write()
    assert held.holds(b"early"), held.data
    # BIG comes behind anything put back into the subscription's queue before it
    wait_until(
        lambda: [d for d in service.dead_letters() if b"<a/><a/>" in d.body],
        30,
        what="BIG's dead letter",
    )
    feed.wait_for_the_end()
    assert [d.body[:20] for d in service.dead_letters()] == [BIG.encode()[:20]]


@pytest.mark.parametrize(
    "events",
    [
        "pause write resume",
        "pause resume write",
        "pause resume pause write resume",
        "pause resume pause resume write",
    ],
)
def test_an_answer_on_its_way_at_a_pause_is_handed_out_once(
    buffered: BrokerService, events: str
) -> None:
    """The buffer handed a feed's message out in an answer not yet settled (the server
    still sending it) when the subscription is paused (and resumed, before or after the
    answer is written, and paused and resumed again meanwhile): the pause's stop of the
    feed's handle waits for that answer's settlement, so the message does not come again
    after the resume (its acknowledgement made after the handle's channel closed was
    lost: RabbitMQ had put it back into the queue), and a resume meanwhile reads the feed
    once its handle stopped."""
    service = buffered
    app = wsgi_app(service)
    pp = service.create_pull_point(CreatePullPointRequest())
    buffer = service.registry.pull_points[pp.id].reader
    assert isinstance(buffer, PullBuffer)
    sub = service.subscribe(sub_req(service.pull_point_address(pp.id), topic=simple("t:p")))
    service.notify([note("<m>0</m>", simple("t:p"))])
    wait_until(lambda: buffer.buffered() == 1, 10, what="the feed's message buffered")
    with held_answer(app, pp.id) as held:  # made, not yet sent: unsettled
        for event in events.split():
            if event == "pause":
                service.pause(sub.id)
            elif event == "resume":
                service.resume(sub.id)
            else:
                held.write()
    assert held.holds(b"<m>0</m>"), held.data
    service.notify([note("<m>sentinel</m>", simple("t:p"))])
    assert written_up_to(app, pp.id, "sentinel") == ["sentinel"]


def test_another_feed_is_served_while_an_end_waits_for_an_answer(
    budgeted: BrokerService,
) -> None:
    """While a feed's end waits for an answer on its way (``PullBuffer.wait_settled``),
    the other feeds' pauses, resumes and messages go on (the wait held the lock that
    serialises every feed's changes: up to ``SETTLE_WAIT`` for all of them)."""
    service = budgeted
    feed, buffer = buffered_feed(service)
    other_pp = service.create_pull_point(CreatePullPointRequest())
    other_address = service.pull_point_address(other_pp.id)
    other = service.subscribe(sub_req(other_address, topic=simple("t:o")))
    with feed.held_answer() as held:  # made, not yet sent: unsettled
        feed.notify(BIG)  # over the budget: the subscription ends
        feed.wait_until_the_end_waits()
        service.pause(other.id)
        service.resume(other.id)
        service.notify([note("<m>other</m>", simple("t:o"))])
        assert pulled(service, other_pp.id, 1) == [b"<m>other</m>"]
        assert buffer.settling(feed.sub_id)  # all that while the end waited
        held.write()
    assert held.holds(b"early"), held.data
    feed.wait_for_the_end()
    assert [d.body[:20] for d in service.dead_letters()] == [BIG.encode()[:20]]


@pytest.mark.parametrize("answer", ["written", "cut"])
def test_pull_get_an_answer_taken_before_the_feeds_end_is_handed_out_or_a_dead_letter(
    budgeted_get: BrokerService, answer: str
) -> None:
    """``pull = "get"``: an answer took a feed's message, then its filter went over its
    budget and the subscription ends (its backlog buried, its queue deleted) while the
    answer is on its way.  Written, the message is handed out; not written, it is a dead
    letter (given back into the queue the end deleted, it was lost); once either way."""
    service = budgeted_get
    feed, handle = queued_feed(service, EARLY)
    with feed.held_answer() as held:  # taken, not yet settled
        feed.notify(BIG)
        wait_until(lambda: handle.depth() == 1, 10, what="BIG in the queue")
        assert service.get_messages(feed.pp_id, None) == []  # meets BIG: over the budget
        # the end waits for the answer (``PullReader.wait_settled``), or is done
        feed.wait_until_the_end_waits(or_else=feed.ended)
        held.settle(answer)
    assert held.holds(b"early"), held.data
    feed.check_handed_out_or_a_dead_letter_once(answer)


def test_a_purge_while_an_end_waits_for_an_answer_leaves_the_feed_stopped(
    budgeted: BrokerService,
) -> None:
    """An operator purges a subscription whose filter ended it while the end waits for an
    answer on its way: what was waiting is dropped and the feed stays stopped, so a
    message published after the purge waits in the subscription and goes to its dead
    letters with the backlog.  Before, the purge started the feed again: the ending
    feed's ``prepare`` dropped each message it then read and the buffer settled it as
    filtered, so the message was neither handed out nor a dead letter."""
    service = budgeted
    feed, buffer = buffered_feed(service)
    after = "<r><a/><e>after-the-purge</e></r>"
    with feed.held_answer() as held:  # made, not yet sent: unsettled
        feed.notify(BIG)  # over the budget: the subscription ends
        feed.wait_until_the_end_waits()
        service.purge_subscription(feed.sub_id)
        feed.notify(after)
        assert buffer.settling(feed.sub_id)  # the end still waits
        held.write()
    assert held.holds(b"early"), held.data
    feed.wait_for_the_end()
    assert [d.body for d in service.dead_letters()] == [after.encode()]


@pytest.mark.parametrize("answer", ["written", "cut"])
def test_pull_get_the_answer_that_meets_the_breach_hands_out_or_dead_letters_what_it_took(
    budgeted_get: BrokerService, answer: str
) -> None:
    """``pull = "get"``: one answer takes a feed's message, then meets the message whose
    filter goes over its budget (the subscription's end waits for the answer) before the
    answer is sent.  Written, the earlier message is handed out; not written, it is a dead
    letter (it was acknowledged when the answer met the breach: lost); once either way."""
    service = budgeted_get
    feed, _ = queued_feed(service, EARLY, BIG)
    with feed.held_answer() as held:  # takes EARLY, meets BIG: over the budget
        # the end waits for the answer (``PullReader.wait_settled``), or is done
        feed.wait_until_the_end_waits(or_else=feed.ended)
        held.settle(answer)
    assert held.holds(b"early"), held.data
    feed.check_handed_out_or_a_dead_letter_once(answer)
