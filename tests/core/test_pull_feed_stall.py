"""A buffered feed's message older than ``limits.max_age`` whose dead letter the middleware
does not confirm (core/pull_buffer.py, core/pull_stall.py): the feed stalls at it, neither
handing it out nor settling it, and tries its dead letter again later; once confirmed the
message is settled and the feed goes on.  Before, it was settled as a filtered message:
neither handed out nor a dead letter.  Run on the file log and Kafka (core enforces
``max_age`` there, core's buffer reads the feeds); the buffer's stop while stalled on the
file log adapter itself.  (An operator's purge of a stalled feed is not tested here: on
the logs a purge dead-letters what it drops, which the refusal keeps from being saved.)"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from wsnmom.adapters.filelog.adapter import FileLogAdapter
from wsnmom.core import metrics
from wsnmom.core.adapter import (
    OutboundMessage,
    QueueLimits,
    Received,
    SubscriptionSpec,
)
from wsnmom.core.channel_signals import PrepareLater
from wsnmom.core.later import WORKERS
from wsnmom.core.model import CreatePullPointRequest, Subscription
from wsnmom.core.pull_buffer import PullBuffer
from wsnmom.core.service import BrokerService
from wsnmom.topic_mapping.model import PathPattern, Topic

from tests.fixtures.server import kafka_gateway_url
from tests.support.pull_answers import pulled_until_sentinel
from tests.support.pull_breach import GraveRefusal
from tests.support.waiting import wait_until

from .conftest import Broker, note, simple, sub_req

FILELOG = "filelog://{tmp}/log?partitions=1"


@pytest.fixture(params=["filelog", pytest.param("kafka", marks=pytest.mark.kafka)])
def aged(make_broker: Callable[..., Broker], request: pytest.FixtureRequest) -> Broker:
    """A broker on the file log or Kafka (a gateway of its own on the tansu broker) with
    ``limits.max_age`` = 1 minute."""
    if request.param == "filelog":
        url = FILELOG
    else:
        url = kafka_gateway_url(str(request.getfixturevalue("kafka_url")))
    return make_broker(adapter_url=url, limits__max_age=timedelta(minutes=1))


def expired_count() -> float:
    """``wsnmom_notifications_expired_total`` as /metrics shows it."""
    return metrics.REGISTRY.get_sample_value("wsnmom_notifications_expired_total") or 0.0


def _feeding(b: Broker) -> tuple[BrokerService, str, Subscription]:
    """A pull point and a subscription feeding it (core's buffer reads it)."""
    service: BrokerService = b.service
    pp = service.create_pull_point(CreatePullPointRequest())
    assert isinstance(service.registry.pull_points[pp.id].reader, PullBuffer)
    sub = service.subscribe(sub_req(service.pull_point_address(pp.id), topic=simple("t:a")))
    return service, pp.id, sub


def _old_message(b: Broker, service: BrokerService, sub: Subscription) -> None:
    """``old`` waits in the paused subscription past ``max_age``; the feed is resumed."""
    service.pause(sub.id)
    service.notify([note("<m>old</m>", simple("t:a"))])
    b.clock.advance(minutes=2)
    service.resume(sub.id)


def test_a_feeds_message_past_max_age_whose_dead_letter_is_not_confirmed_is_not_lost(
    aged: Broker,
) -> None:
    """The dead letter of a fed message past ``max_age`` is refused (twice): the message
    stays unsettled, its dead letter is tried again, and once the middleware confirms it
    the message is a dead letter ("max-age"), never handed out; the feed then goes on
    (the sentinel published after it, which waited behind it, is handed out alone)."""
    service, pp_id, sub = _feeding(aged)
    refusal = GraveRefusal(service, refuse=2)
    expired_before = expired_count()
    _old_message(aged, service, sub)
    service.notify([note("<m>sentinel</m>", simple("t:a"))])
    wait_until(service.dead_letters, 10, what="old's dead letter")
    assert refusal.tries >= 3  # refused twice, then confirmed
    assert pulled_until_sentinel(service, pp_id) == [b"<m>sentinel</m>"]
    [letter] = service.dead_letters()
    assert letter.body == b"<m>old</m>" and letter.reason == "max-age"
    # one message past max_age, counted once (before: once per try of its dead letter)
    assert expired_count() - expired_before == 1


def test_a_feed_paused_while_its_dead_letter_is_refused_dead_letters_the_message_once(
    aged: Broker,
) -> None:
    """The feed stalled at a refused dead letter is paused, then resumed: the message went
    back to the subscription with the pause and comes again; once the middleware confirms
    its dead letter it is one dead letter, never handed out, and what the subscription
    received meanwhile follows it."""
    service, pp_id, sub = _feeding(aged)
    refusal = GraveRefusal(service, refuse=10**6)
    _old_message(aged, service, sub)
    wait_until(lambda: refusal.tries >= 1, 10, what="the dead letter refused")
    service.pause(sub.id)
    service.notify([note("<m>sentinel</m>", simple("t:a"))])  # waits in the subscription
    tries = refusal.tries
    service.resume(sub.id)
    wait_until(lambda: refusal.tries > tries, 10, what="the dead letter tried after the resume")
    refusal.refuse = 0
    assert pulled_until_sentinel(service, pp_id) == [b"<m>sentinel</m>"]
    # confirmed before the sentinel was prepared; a Kafka reader may see it a moment later
    wait_until(service.dead_letters, 10, what="old's dead letter")
    [letter] = service.dead_letters()
    assert letter.body == b"<m>old</m>" and letter.reason == "max-age"


def test_a_buffer_stopped_while_a_feed_is_stalled_gets_the_message_again_once(
    tmp_path: Path,
) -> None:
    """The buffer stops while its feed is stalled at a message put off (a pull point's
    purge, its shard handed over) and starts again: the feed's handle gave the message
    and those behind it back, they come again in order, the stalled one is prepared again
    (then dropped: settled in its place) and each later one is handed out once."""
    adapter = FileLogAdapter(f"filelog://{tmp_path / 'log'}?partitions=1")
    adapter.open()
    try:
        patterns = (PathPattern(NS, ("t",)),)
        buffer = PullBuffer(adapter.subscription(SubscriptionSpec("p", (), QueueLimits())), 64)
        put_off = [True]
        prepared: list[bytes] = []

        def prepare(received: Received) -> bytes | None:
            prepared.append(received.body)
            if received.body != b"old":
                return received.body
            if put_off[0]:
                raise PrepareLater(0.05)
            return None

        feed = adapter.subscription(SubscriptionSpec("f", patterns, QueueLimits()))
        buffer.add_feed("f", feed, prepare, active=True)
        buffer.start()
        topic = Topic(NS, ("t",))
        adapter.publish_many(
            [OutboundMessage(topic=topic, body=b, message_id=uuid.uuid4().hex) for b in BODIES]
        )
        wait_until(lambda: prepared.count(b"old") >= 2, 10, what="old put off twice")
        buffer.stop()
        seen = prepared.count(b"old")
        buffer.start()
        wait_until(lambda: prepared.count(b"old") > seen, 10, what="old again after the start")
        put_off[0] = False
        handed: list[bytes] = []

        def sentinel_handed() -> bool:
            handed.extend(r.body for r in buffer.take(100))
            return b"sentinel" in handed

        wait_until(sentinel_handed, 10, what="the sentinel handed out")
        assert handed == [b"m0", b"m1", b"sentinel"]
        buffer.stop()
    finally:
        adapter.close()


def test_fifty_stalled_feeds_wait_without_a_thread_each(tmp_path: Path) -> None:
    """Fifty feeds of one buffer stall at once (a dead-letter outage): their retries wait
    on the process's few shared threads (``core.later``), not on a thread each (a
    ``threading.Timer`` per stall: fifty more threads for as long as the outage lasts)."""
    adapter = FileLogAdapter(f"filelog://{tmp_path / 'log'}?partitions=1")
    adapter.open()
    try:
        patterns = (PathPattern(NS, ("t",)),)
        buffer = PullBuffer(adapter.subscription(SubscriptionSpec("p", (), QueueLimits())), 64)
        prepared: list[bytes] = []

        def prepare(received: Received) -> bytes | None:
            prepared.append(received.body)
            if received.body == b"old":
                raise PrepareLater(30.0)  # refused: tried again in 30 s, after the test
            return received.body

        feeds = 50
        for n in range(feeds):
            handle = adapter.subscription(SubscriptionSpec(f"f{n}", patterns, QueueLimits()))
            buffer.add_feed(f"f{n}", handle, prepare, active=True)
        buffer.start()
        topic = Topic(NS, ("t",))

        def publish(body: bytes) -> None:
            adapter.publish_many(
                [OutboundMessage(topic=topic, body=body, message_id=uuid.uuid4().hex)]
            )

        publish(b"m0")
        handed: list[bytes] = []

        def all_handed() -> bool:
            handed.extend(r.body for r in buffer.take(100))
            return len(handed) == feeds

        wait_until(all_handed, 20, what="m0 from every feed")
        reading = threading.active_count()  # the feeds read, none stalled
        publish(b"old")
        wait_until(lambda: prepared.count(b"old") == feeds, 20, what="every feed stalled")
        assert threading.active_count() - reading <= 1 + WORKERS
        buffer.stop()
    finally:
        adapter.close()


#: what the stopped buffer's feed receives: "old" is put off until the test says
BODIES = [b"old", b"m0", b"m1", b"sentinel"]
NS = "urn:test:pull-feed-stall"


def test_a_message_being_prepared_across_a_pause_and_resume_is_handed_out_once(
    tmp_path: Path,
) -> None:
    """The feed's ``prepare`` of a message (its dead letter being published, which may
    wait up to the publish timeout) outlasts a pause (the feed suspended, its handle
    stopped: the message given back) and a resume (the handle started again: the
    message comes again).  The copy prepared across them is neither put in the buffer
    nor stalled at: the handle's new delivery is, once.  Before, the check after
    ``prepare`` saw the feed read again and took the old copy too: handed out twice (or,
    put off, a stall at the old copy: its dead letter twice)."""
    adapter = FileLogAdapter(f"filelog://{tmp_path / 'log'}?partitions=1")
    adapter.open()
    try:
        patterns = (PathPattern(NS, ("t",)),)
        buffer = PullBuffer(adapter.subscription(SubscriptionSpec("p", (), QueueLimits())), 64)
        held, release = threading.Event(), threading.Event()
        prepared: list[bytes] = []

        def prepare(received: Received) -> bytes | None:
            prepared.append(received.body)
            if len(prepared) == 1:  # the first one outlasts the pause and resume
                held.set()
                release.wait(10)
            return received.body

        feed = adapter.subscription(SubscriptionSpec("f", patterns, QueueLimits()))
        buffer.add_feed("f", feed, prepare, active=True)
        buffer.start()
        topic = Topic(NS, ("t",))
        adapter.publish_many(
            [OutboundMessage(topic=topic, body=b, message_id=uuid.uuid4().hex) for b in BODIES]
        )
        assert held.wait(10)
        # a pause (``PullFeeds.sync``: nothing buffered, no answer on its way) and a resume
        assert buffer.suspend_feed("f") == []
        feed.stop()
        buffer.resume_feed("f")
        release.set()
        handed: list[bytes] = []

        def sentinel_handed() -> bool:
            handed.extend(r.body for r in buffer.take(100))
            return b"sentinel" in handed

        wait_until(sentinel_handed, 10, what="the sentinel handed out")
        assert handed == BODIES, handed
        buffer.stop()
    finally:
        adapter.close()
