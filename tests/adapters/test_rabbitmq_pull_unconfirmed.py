"""A pull point's feeds on RabbitMQ when something under them fails: a dead letter the
middleware does not confirm leaves its message unsettled (it goes to the dead letters
later, with the subscription's backlog), while it waits for RabbitMQ the other feeds'
pauses are answered, and a paused buffered feed whose background stop fails is read again
after a Resume made meanwhile."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from wsnmom.core.adapter import AdapterError, OutboundMessage
from wsnmom.core.dead_letter_records import DEAD_LETTER_NAMESPACE
from wsnmom.core.model import CreatePullPointRequest, ExpressionSource
from wsnmom.core.pull_buffer import PullBuffer
from wsnmom.core.pull_reader import PullReader
from wsnmom.core.service import BrokerService

from tests.adapters.test_rabbitmq_pull_feeds import _service, budgeted_get
from tests.core.conftest import note, simple, sub_req
from tests.support.pull_answers import held_answer, pulled, written_up_to, wsgi_app
from tests.support.pull_breach import BIG, CUBIC, XPATH10, GraveRefusal, queued_feed
from tests.support.waiting import wait_until

pytestmark = pytest.mark.rabbitmq

__all__ = ["budgeted_get"]  # the fixture, used by name


@pytest.fixture
def buffered(private_vhost: str) -> Iterator[BrokerService]:
    """The default pull (core's buffer)."""
    yield from _service(private_vhost)


def test_pull_get_a_breaching_message_whose_dead_letter_is_not_confirmed_is_not_lost(
    budgeted_get: BrokerService,
) -> None:
    """``pull = "get"``: GetMessages takes the message whose filter goes over its budget,
    and RabbitMQ does not confirm its dead letter.  The message stays unsettled (given back
    into the subscription's queue) and goes to the dead letters with the backlog as the
    subscription ends.  Before, it was acknowledged all the same: neither handed out nor a
    dead letter."""
    service = budgeted_get
    feed, _ = queued_feed(service, BIG)
    refusal = GraveRefusal(service, refuse=1)
    assert service.get_messages(feed.pp_id, None) == []  # meets BIG: over the budget
    feed.wait_for_the_end()
    wait_until(lambda: len(service.dead_letters()) >= 1, 15, what="BIG's dead letter")
    assert refusal.tries >= 2  # refused at the breach, taken with the backlog
    assert [d.body[:20] for d in service.dead_letters()] == [BIG.encode()[:20]]
    service.notify_pull_point(feed.pp_id, [note("<m>sentinel</m>")])
    assert pulled(service, feed.pp_id, 1) == [b"<m>sentinel</m>"]  # nothing kept in the inbox


class HeldGrave:
    """The next publish to a dead-letter topic waits (as one RabbitMQ does not confirm
    waits, up to the publish timeout) until ``release`` is set, then is refused;
    ``entered`` is set once it waits.  The later ones go through."""

    def __init__(self, service: BrokerService) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        adapter: Any = service.adapter
        real = adapter.publish_many

        def held(messages: Sequence[OutboundMessage], timeout: float = 10.0) -> Any:
            grave = any(m.topic.namespace == DEAD_LETTER_NAMESPACE for m in messages)
            if grave and not self.entered.is_set():
                self.entered.set()
                self.release.wait(60)
                raise AdapterError("dead letters not confirmed")
            return real(messages, timeout=timeout)

        adapter.publish_many = held


def test_pull_get_another_feeds_pause_is_answered_while_a_dead_letter_publish_waits(
    budgeted_get: BrokerService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``pull = "get"``: GetMessages meets the message whose filter goes over its budget
    and publishes its dead letter, which RabbitMQ is slow to confirm; the subscription's
    end waits for that read (``PullReader.suspend_feed``) before its backlog goes.  A
    Pause of a subscription feeding another pull point is answered meanwhile.  Before,
    the end waited holding the lock that serialises every feed's changes: the Pause was
    answered only once the dead-letter publish timed out."""
    service = budgeted_get
    pp = service.create_pull_point(CreatePullPointRequest())
    reader = service.registry.pull_points[pp.id].reader
    assert isinstance(reader, PullReader)
    content = ExpressionSource(XPATH10, CUBIC, {})
    address = service.pull_point_address(pp.id)
    sub = service.subscribe(sub_req(address, topic=simple("t:e"), message_content=content))
    other_pp = service.create_pull_point(CreatePullPointRequest())
    other_address = service.pull_point_address(other_pp.id)
    other = service.subscribe(sub_req(other_address, topic=simple("t:o")))
    handle = service.registry.subscriptions[sub.id].handle
    assert handle is not None
    service.notify([note(BIG, simple("t:e"))])
    wait_until(lambda: handle.depth() == 1, 10, what="BIG in the queue")
    grave = HeldGrave(service)
    ending = threading.Event()
    real_suspend = PullReader.suspend_feed

    def suspend(self: PullReader, name: str, **kwargs: Any) -> Any:
        if name == sub.id:
            ending.set()  # the end's stop: waits for the read burying BIG
        return real_suspend(self, name, **kwargs)

    monkeypatch.setattr(PullReader, "suspend_feed", suspend)
    with ThreadPoolExecutor(2) as pool:
        try:
            got = pool.submit(service.get_messages, pp.id, None)  # meets BIG
            assert grave.entered.wait(30), "no dead-letter publish"
            wait_until(ending.is_set, 30, what="the end waiting for the read")
            paused = pool.submit(service.pause, other.id)
            wait_until(paused.done, 20, what="the other feed's Pause answered")
            assert not got.done()  # all that while the dead-letter publish waited
        finally:
            grave.release.set()
        paused.result()
        got.result(timeout=30)  # answered; BIG goes to the dead letters (below)
    wait_until(lambda: sub.id not in service.registry.subscriptions, 30, what="the end")
    wait_until(lambda: service.dead_letters(), 15, what="BIG's dead letter (the backlog)")
    assert [d.body[:20] for d in service.dead_letters()] == [BIG.encode()[:20]]
    service.resume(other.id)
    service.notify([note("<m>other</m>", simple("t:o"))])
    assert pulled(service, other_pp.id, 1) == [b"<m>other</m>"]


@pytest.mark.parametrize("start_fails", [False, True])
def test_a_resume_while_a_paused_feeds_stop_fails_reads_the_feed(
    buffered: BrokerService, start_fails: bool
) -> None:
    """A buffered feed is paused while an answer holding its message is on its way (its
    handle stops once that answer settles, on a thread of its own) and resumed meanwhile;
    that stop fails (the broker connection dropped during it), and with ``start_fails``
    so does the start after it (tried again, ``pull_feed_stops.START_RETRY`` later).  The
    feed is read again.  Before, the failed stop skipped the Resume's start: the feed
    stayed unread until the next pause and resume."""
    service = buffered
    app = wsgi_app(service)
    pp = service.create_pull_point(CreatePullPointRequest())
    buffer = service.registry.pull_points[pp.id].reader
    assert isinstance(buffer, PullBuffer)
    sub = service.subscribe(sub_req(service.pull_point_address(pp.id), topic=simple("t:p")))
    handle: Any = service.registry.subscriptions[sub.id].handle
    service.notify([note("<m>0</m>", simple("t:p"))])
    wait_until(lambda: buffer.buffered() == 1, 10, what="the feed's message buffered")
    real_stop = handle.stop
    failed = threading.Event()

    def stop() -> None:
        if threading.current_thread().name.startswith("feed-pause-") and not failed.is_set():
            failed.set()
            real_stop()  # what it held goes back, as when the connection drops
            raise AdapterError("connection lost while stopping")
        real_stop()

    handle.stop = stop
    real_start = handle.start
    refused_start = threading.Event()

    def start(*args: Any, **kwargs: Any) -> None:
        if start_fails and failed.is_set() and not refused_start.is_set():
            refused_start.set()
            raise AdapterError("RabbitMQ unreachable")
        real_start(*args, **kwargs)

    handle.start = start
    with held_answer(app, pp.id) as held:  # made, not yet sent: unsettled
        service.pause(sub.id)
        service.resume(sub.id)
        held.write()
    assert held.holds(b"<m>0</m>"), held.data
    wait_until(failed.is_set, 20, what="the paused feed's stop failing")
    service.notify([note("<m>sentinel</m>", simple("t:p"))])
    assert written_up_to(app, pp.id, "sentinel") == ["sentinel"]
    assert refused_start.is_set() is start_fails
