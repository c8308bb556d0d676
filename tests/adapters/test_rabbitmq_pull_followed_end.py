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

import time
from collections.abc import Iterator

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
    app = wsgi_app(service)
    pp = service.create_pull_point(CreatePullPointRequest())
    buffer = service.registry.pull_points[pp.id].reader
    assert isinstance(buffer, PullBuffer)
    sub = service.subscribe(sub_req(service.pull_point_address(pp.id), topic=simple("t:f")))
    queue = service.adapter.queue_name(sub.id)  # type: ignore[attr-defined]
    service.notify([note("<m>0</m>", simple("t:f"))])
    wait_until(lambda: buffer.buffered() == 1, 10, what="the feed's message buffered")
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
        wait_until(
            lambda: _queued(private_vhost, queue) in (None, 0),
            20,
            what="the subscription's queue without the handed-out message",
        )
        service.notify_pull_point(pp.id, [note("<m>sentinel</m>")])
    after: list[str] = []

    def sentinel() -> bool:
        after.extend(written(app, pp.id))
        return "sentinel" in after or (answer == "cut" and "0" in after)

    wait_until(sentinel, 20, what="what the pull point holds")
    assert after == (["sentinel"] if answer == "written" else ["0"]), after
    assert _queued(private_vhost, queue) in (None, 0)
