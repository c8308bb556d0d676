"""A buffered feed (RabbitMQ's default pull, core's buffer) whose subscription another
instance of a cluster ends while an answer holding the feed's message is on its way.

The other instance is played by the store: the subscription's record is deleted there,
and this instance follows the deletion as its follow thread does
(``Follower.load`` -> ``SubscriptionChanges.forget`` -> ``PullFeeds.detach(here=False)``).
The follow must not wait for the answer (it follows the other changes meanwhile), and
the feed's handle must not stop before the answer settled: stopping it closes its
channel, and RabbitMQ puts the handed-out message back into the subscription's queue (its
acknowledgement, made once the answer was written, is lost).  Then the queue, which this
instance leaves to the ending instance when a message waits in it
(``RabbitMQSubscription.forget``), holds a copy of a message handed out: whatever takes
the subscription's messages afterwards (a drain into the pull point, its dead letters at
an end) makes it a duplicate, or handed out and a dead letter."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from wsnmom.core.model import CreatePullPointRequest
from wsnmom.core.pull_buffer import PullBuffer
from wsnmom.core.service import BrokerService

from tests.adapters.test_rabbitmq_pull_feeds import _service
from tests.core.conftest import note, simple, sub_req
from tests.support.pull_answers import payloads, start_get_messages, written, wsgi_app
from tests.support.waiting import wait_until

pytestmark = pytest.mark.rabbitmq


@pytest.fixture
def buffered(private_vhost: str) -> Iterator[BrokerService]:
    """The default pull (core's buffer)."""
    yield from _service(private_vhost)


def _queued(amqp_url: str, queue: str) -> int | None:
    """Messages ready in ``queue`` (None: no such queue), asked on a connection of its
    own (a passive declaration)."""
    import pika
    from pika.exceptions import ChannelClosedByBroker

    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        ok = conn.channel().queue_declare(queue, passive=True)
        return int(ok.method.message_count)
    except ChannelClosedByBroker as exc:
        if exc.reply_code != 404:
            raise
        return None
    finally:
        if conn.is_open:
            conn.close()


def _one_buffered(service: BrokerService) -> tuple[Any, Any, Any, str]:
    """A pull point fed by a subscription whose one message waits in the buffer: the
    WSGI app, the pull point, the subscription and its queue's name."""
    app = wsgi_app(service)
    pp = service.create_pull_point(CreatePullPointRequest())
    buffer = service.registry.pull_points[pp.id].reader
    assert isinstance(buffer, PullBuffer)
    sub = service.subscribe(sub_req(service.pull_point_address(pp.id), topic=simple("t:f")))
    queue = service.adapter.queue_name(sub.id)  # type: ignore[attr-defined]
    service.notify([note("<m>0</m>", simple("t:f"))])
    wait_until(lambda: buffer.buffered() == 1, 10, what="the feed's message buffered")
    return app, pp, sub, queue


def _only_the_sentinel_follows(
    service: BrokerService, app: Any, pp_id: str, vhost: str, queue: str
) -> None:
    """The written answer's message was acked, not put back into the subscription's queue
    (gone, or left empty for the ending instance), and a sentinel sent to the pull point
    is all it hands out next."""
    wait_until(
        lambda: _queued(vhost, queue) in (None, 0),
        20,
        what="the subscription's queue without the handed-out message",
    )
    service.notify_pull_point(pp_id, [note("<m>sentinel</m>")])
    after: list[str] = []

    def sentinel() -> bool:
        after.extend(written(app, pp_id))
        return "sentinel" in after

    wait_until(sentinel, 20, what="the sentinel")
    assert after == ["sentinel"], after
    assert _queued(vhost, queue) in (None, 0)


@pytest.mark.parametrize("answer", ["written", "cut"])
def test_an_answer_on_its_way_when_another_instance_ends_the_feed_is_handed_out_once(
    buffered: BrokerService, private_vhost: str, answer: str
) -> None:
    """The buffer handed the feed's message out in an answer not yet settled when this
    instance follows the subscription's end through another instance.  The follow
    returns at once; the feed's handle stops once the answer settled (at most
    ``pull_fed.SETTLE_WAIT``, on a thread of its own).  Written: the message was handed
    out, and the subscription's queue does not hold it again.  Cut (not sent): the
    message is kept in the pull point (``Feed.late``) and comes from there, once.
    Before, the follow stopped the handle at once: the written answer's message went back
    into the queue, left (unbound) for the ending instance."""
    service = buffered
    app, pp, sub, queue = _one_buffered(service)
    status, body = start_get_messages(app, pp.id)  # made, not yet sent: unsettled
    try:
        # the other instance deleted the record; this one follows (its follow thread)
        assert service.store.delete_subscription(sub.id)
        began = time.monotonic()
        assert service.follower.load("subscription", sub.id) is None
        followed = time.monotonic() - began
        assert sub.id not in service.registry.subscriptions
        # cut: taken by the server, never written (given back)
        data = b"".join(body) if answer == "written" else next(iter(body))
    finally:
        body.close()
    assert status.startswith("200") and payloads(data) == ["0"], data
    assert followed < 5.0, f"the follow waited {followed:.1f} s for the answer"
    if answer == "written":
        # the feed's handle stopped once the answer settled: the message was acked, not
        # put back into the queue (gone, or left empty for the ending instance)
        _only_the_sentinel_follows(service, app, pp.id, private_vhost, queue)
        return
    after: list[str] = []

    def kept() -> bool:
        after.extend(written(app, pp.id))
        return "0" in after

    wait_until(kept, 20, what="what the pull point holds")
    assert after == ["0"], after
    assert _queued(private_vhost, queue) in (None, 0)


def test_a_second_follow_of_the_end_leaves_the_stop_to_the_first(
    buffered: BrokerService, private_vhost: str
) -> None:
    """Two threads follow the same end (the follow thread, and a request whose
    conditional write found the record gone: ``SubscriptionChanges._reread``), both
    having found the live subscription before either removed it.  The first's detach
    stops the feed's handle once the answer on its way settled, and the adapter forgets
    the subscription after; the second finds the feed detached and must not make the
    adapter forget it at once: that stops consuming before the answer's ack (the
    handed-out message went back into the queue left for the ending instance).  Before,
    the second detach ran its ``then`` (``forget_native``) at once."""
    service = buffered
    app, pp, sub, queue = _one_buffered(service)
    live = service.registry.subscriptions[sub.id]
    status, body = start_get_messages(app, pp.id)  # made, not yet sent: unsettled
    try:
        assert service.store.delete_subscription(sub.id)
        assert service.follower.load("subscription", sub.id) is None
        service.subscriptions.forget(live)  # the second thread, which found it too
        data = b"".join(body)
    finally:
        body.close()
    assert status.startswith("200") and payloads(data) == ["0"], data
    _only_the_sentinel_follows(service, app, pp.id, private_vhost, queue)


def test_the_close_ends_a_followed_end_s_stop_before_it_returns(
    buffered: BrokerService,
) -> None:
    """The broker closes while the stop of a feed whose end another instance made waits
    for an answer on its way: the close stops the handle now and runs what follows
    (the adapter forgets the subscription) before it returns, so no thread of the
    feed's touches the adapter after the close.  Before, the stop's thread went on
    waiting (up to ``pull_fed.SETTLE_WAIT``) and stopped the handle and made the adapter
    forget it after the close."""
    service = buffered
    app, pp, sub, _ = _one_buffered(service)
    status, body = start_get_messages(app, pp.id)  # made, not yet sent: unsettled
    try:
        assert service.store.delete_subscription(sub.id)
        assert service.follower.load("subscription", sub.id) is None
        assert service.adapter.pool.find(sub.id) is not None  # type: ignore[attr-defined]
        began = time.monotonic()
        service.close()
        closed = time.monotonic() - began
        stops = [t.name for t in threading.enumerate() if t.name.startswith("feed-end-")]
        assert stops == [], stops
        assert service.adapter.pool.find(sub.id) is None  # type: ignore[attr-defined]
        assert closed < 5.0, f"the close waited {closed:.1f} s for the answer"
    finally:
        body.close()
    assert status.startswith("200")
