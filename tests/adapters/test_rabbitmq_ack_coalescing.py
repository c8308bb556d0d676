"""RabbitMQ adapter: acks from other threads share the connection thread's wake-ups
(``Link.settle``, issue 29 / docs/performance.md F26), against a real node.

GetMessages and push delivery ack on request and delivery threads; each ack used to wake
the connection's I/O thread unless a wake-up was already pending, so a stream of acks a
little slower than the loop cost one wake-up (a self-pipe write on the acking thread) and
one socket write each.  Now, once a write carried several, the loop collects on a short
timer and the acks made meanwhile wake nothing.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable

import pytest
from wsnmom.adapters.rabbitmq import _settles
from wsnmom.adapters.rabbitmq.adapter import RabbitMQAdapter, RabbitMQSubscription
from wsnmom.core.adapter import OutboundMessage, Received, SubscriptionSpec
from wsnmom.topic_mapping.model import PathPattern, Topic

from tests.support.waiting import wait_until

pytestmark = pytest.mark.rabbitmq

MESSAGES = 1000
#: the windows within which settlements ride on a flush without a wake-up of their own,
#: widened from the adapter's milliseconds (tuned by ``bench.ab``): the tests count what
#: the mechanism saves, and on a loaded 2-core machine the acking thread can wait longer
#: than 2 or 10 ms for a core between two acks, which made those counts the scheduler's
LINGER = 0.1
HOLD = 2.0


def test_a_stream_of_acks_costs_few_wake_ups_and_every_ack_reaches_the_broker(
    make_adapter: Callable[..., RabbitMQAdapter],
    private_vhost: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_settles, "SETTLE_LINGER", LINGER)
    adapter = make_adapter(private_vhost)
    ns = f"urn:test:rabbit-acks:{uuid.uuid4().hex}"
    topic = Topic(ns, ("t",))
    handle = adapter.subscription(
        SubscriptionSpec(name="acks", patterns=(PathPattern(ns, ("t",)),))
    )
    assert isinstance(handle, RabbitMQSubscription)
    held: list[Received] = []
    lock = threading.Lock()

    def hold(received: Received) -> None:  # on the connection's thread: no ack here
        with lock:
            held.append(received)

    handle.start(hold, prefetch=MESSAGES)
    adapter.publish_many(
        [
            OutboundMessage(topic=topic, body=b"<m>%d</m>" % i, message_id=f"m{i}")
            for i in range(MESSAGES)
        ]
    )
    wait_until(lambda: len(held) == MESSAGES, 30, what=f"{MESSAGES} deliveries held")
    before = adapter.stats()

    # a stream paced by the connection's thread, not by the clock: two acks, then wait
    # until that thread has run a callback queued after them (so it took any wake-up
    # they asked for first).  Without the linger every pair is then a wake-up and a
    # write of its own however fast or slow the machine is; with it, one wake-up starts
    # the stream and the timer's flushes carry the rest.  (A sleep between pairs let a
    # busy loop coalesce by itself: the test passed on a loaded machine with the linger
    # removed.)
    for i in range(0, MESSAGES, 2):
        held[i].ack()
        held[i + 1].ack()
        loop_turn(handle)
    # stop() closes the consumer's channel, which requeues whatever is still unacked:
    # the pending acks must be written before the close
    handle.stop()
    after = adapter.stats()

    settles = after["settles"] - before["settles"]
    writes = after["settle_writes"] - before["settle_writes"]
    wakeups = after["settle_wakeups"] - before["settle_wakeups"]
    assert settles == MESSAGES
    # without the linger: at least one wake-up and one write per pair (MESSAGES / 2;
    # two when the loop ran between the pair's acks);
    # with it, a write per LINGER of the stream and a wake-up only where a timer's flush
    # found fewer than two acks (the acking thread was away longer than LINGER)
    assert writes * 4 <= settles, (settles, writes, wakeups)
    assert wakeups * 4 <= settles, (settles, writes, wakeups)
    # every ack reached the broker before the channel closed: nothing came back
    assert handle.depth() == 0
    handle.delete()


def loop_turn(handle: RabbitMQSubscription) -> None:
    """Wait until ``handle``'s connection thread has run a callback queued now: every
    callback queued before it (a settle's wake-up) has run too."""
    turned = threading.Event()
    handle.link.call_soon(turned.set)
    assert turned.wait(30), "the connection's I/O thread did not run for 30 s"


READS = 60


def test_acks_of_handed_out_gets_ride_on_the_next_get_and_all_reach_the_broker(
    make_adapter: Callable[..., RabbitMQAdapter],
    private_vhost: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GetMessages on ``pull = "get"``: each answer's messages are got with manual acks and
    acked after the answer's write, one answer at a time; those acks used to wake the
    connection's thread once each (a lone ack finds no flush scheduled).  Now the get
    that handed them out schedules one, and the next get writes what is pending first."""
    monkeypatch.setattr(_settles, "SETTLE_HOLD", HOLD)
    adapter = make_adapter(private_vhost)
    ns = f"urn:test:rabbit-get-acks:{uuid.uuid4().hex}"
    topic = Topic(ns, ("t",))
    spec = SubscriptionSpec(name="get-acks", patterns=(PathPattern(ns, ("t",)),))
    handle = adapter.subscription(spec)
    assert isinstance(handle, RabbitMQSubscription)
    adapter.publish_many(
        [
            OutboundMessage(topic=topic, body=b"<m>%d</m>" % i, message_id=f"m{i}")
            for i in range(READS)
        ]
    )
    wait_until(lambda: handle.depth() == READS, 30, what=f"{READS} messages queued")
    before = adapter.stats()
    bodies: list[bytes] = []
    for _ in range(READS):  # one message per answer, acked before the next read
        got = handle.hand_out(1)
        assert len(got) == 1
        bodies.append(bytes(got[0].body))
        got[0].ack()
    after = adapter.stats()
    assert bodies == [b"<m>%d</m>" % i for i in range(READS)]
    settles = after["settles"] - before["settles"]
    wakeups = after["settle_wakeups"] - before["settle_wakeups"]
    assert settles == READS
    # one wake-up per ack before; an ack later than the hold after its get still wakes
    # (at most once per HOLD seconds of the loop here)
    assert wakeups * 2 <= settles, (settles, wakeups)
    # every ack was written: closing the connection requeued nothing (the sentinel,
    # read through a new connection, is alone)
    adapter.close()
    again = make_adapter(private_vhost)
    handle = again.subscription(spec)
    assert isinstance(handle, RabbitMQSubscription)
    again.publish_many([OutboundMessage(topic=topic, body=b"<sentinel/>", message_id="s")])
    assert handle.depth() == 1  # confirmed; a close's requeue came before it
    got = handle.hand_out(10)
    assert [bytes(r.body) for r in got] == [b"<sentinel/>"]
    got[0].ack()
    handle.delete()
