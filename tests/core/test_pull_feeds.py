"""Subscriptions feeding a pull point on a log-shaped middleware are read by the pull
point directly (core/pull_feeds.py, core/pull_buffer.py): no copy through the middleware,
each message rendered for its subscription, at least once, pause and the subscription's
end keep what reached the pull point, filtered messages settled in order, purges.  Run on
the file-log reference adapter (native_pull False, not sole publisher)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from lxml import etree
from wsnmom.core import pull_buffer
from wsnmom.core.adapter import HEADER_MESSAGE_ID, Received, SubscriptionHandle
from wsnmom.core.model import CreatePullPointRequest, ExpressionSource, PullPoint, Subscription
from wsnmom.core.pull_buffer import PullBuffer
from wsnmom.core.service import BrokerService

from tests.support.pull_answers import payloads as answer_payloads
from tests.support.pull_answers import start_get_messages, wsgi_app
from tests.support.waiting import wait_until

from .conftest import Broker, note, simple, sub_req

FILELOG = "filelog://{tmp}/log?partitions=1"
XPATH = "http://www.w3.org/TR/1999/REC-xpath-19991116"


@pytest.fixture
def log_broker(make_broker: Callable[..., Broker]) -> Broker:
    return make_broker(adapter_url=FILELOG, limits__max_age=None)


class PublishCounter:
    """Counts what the service publishes into the middleware, per call."""

    def __init__(self, service: BrokerService) -> None:
        self.calls: list[int] = []
        adapter = service.adapter
        original = adapter.publish_many

        def publish_many(messages: Any, timeout: float = 10.0) -> Any:
            self.calls.append(len(messages))
            return original(messages, timeout)

        adapter.publish_many = publish_many  # type: ignore[method-assign]


def drain(service: BrokerService, pp_id: str, n: int, timeout: float = 5.0) -> list[Any]:
    """At least ``n`` messages from the pull point (all it handed out meanwhile)."""
    out: list[Any] = []

    def enough() -> bool:
        out.extend(service.get_messages(pp_id, None))
        return len(out) >= n

    wait_until(enough, timeout, what=f"{n} message(s) from the pull point")
    return out


def payloads(messages: list[Any]) -> list[bytes]:
    return [m.payload for m in messages]


SENTINEL = b"<sentinel/>"


def until_sentinel(
    service: BrokerService, pp_id: str, sub_address: str, sentinel: bytes = SENTINEL
) -> list[Any]:
    """Every message the pull point hands out until ``sentinel`` from the subscription at
    ``sub_address`` is among them (a barrier: what was published before it and must reach
    the pull point has, per subscription, reached it)."""
    got: list[Any] = []

    def seen() -> bool:
        got.extend(service.get_messages(pp_id, None))
        return any(
            m.subscription_reference.address == sub_address and m.payload == sentinel for m in got
        )

    wait_until(seen, what=f"the <sentinel/> of {sub_address} at the pull point")
    return got


def of(messages: list[Any], sub_address: str) -> list[bytes]:
    """The payloads of ``messages`` that came through the subscription at ``sub_address``."""
    return [m.payload for m in messages if m.subscription_reference.address == sub_address]


def wait_buffered(service: BrokerService, pp_id: str, n: int, timeout: float = 5.0) -> None:
    buffer = service.registry.pull_points[pp_id].reader
    assert isinstance(buffer, PullBuffer)
    wait_until(lambda: buffer.buffered() >= n, timeout, what=f"{n} message(s) buffered")
    assert buffer.buffered() == n


def fed_pull_point(
    service: BrokerService, topic: str, count: int
) -> tuple[PullPoint, Subscription]:
    """A pull point, a subscription on ``topic`` feeding it, and ``count`` notifications
    ``<m>0</m>``... published in one Notify and buffered in the pull point."""
    pp = service.create_pull_point(CreatePullPointRequest())
    sub = service.subscribe(sub_req(service.pull_point_address(pp.id), topic=simple(topic)))
    service.notify([note(f"<m>{i}</m>", simple(topic)) for i in range(count)])
    wait_buffered(service, pp.id, count)
    return pp, sub


def test_fed_messages_take_no_trip_through_the_middleware(log_broker: Broker) -> None:
    service = log_broker.service
    assert service is not None
    pp = service.create_pull_point(CreatePullPointRequest())
    address = service.pull_point_address(pp.id)
    one = service.subscribe(sub_req(address, topic=simple("t:f")))
    two = service.subscribe(sub_req(address, topic=simple("t:f")))
    assert service.registry.subscriptions[one.id].feed is not None
    assert service.engine.channel(one.id) is None  # no delivery channel
    counter = PublishCounter(service)
    service.notify([note("<x>1</x>", simple("t:f"))])
    got = drain(service, pp.id, 2)
    assert counter.calls == [1]  # the Notify itself, no copies into the inbox
    refs = sorted(m.subscription_reference.address for m in got)
    assert refs == sorted(service.subscription_address(s.id) for s in (one, two))
    assert payloads(got) == [b"<x>1</x>"] * 2


def test_fed_messages_not_handed_out_come_again_after_a_restart(log_broker: Broker) -> None:
    service = log_broker.service
    assert service is not None
    pp = service.create_pull_point(CreatePullPointRequest())
    service.subscribe(sub_req(service.pull_point_address(pp.id), topic=simple("t:r")))
    service.notify([note(f"<n>{i}</n>", simple("t:r")) for i in range(5)])
    wait_buffered(service, pp.id, 5)
    assert payloads(service.get_messages(pp.id, 2)) == [b"<n>0</n>", b"<n>1</n>"]
    service = log_broker.restart()
    rest = drain(service, pp.id, 3)
    # what was handed out is settled; the rest (buffered, unsettled) comes again
    assert payloads(rest) == [b"<n>2</n>", b"<n>3</n>", b"<n>4</n>"]
    assert service.get_messages(pp.id, None) == []


def test_pause_keeps_what_reached_the_pull_point(log_broker: Broker) -> None:
    service = log_broker.service
    assert service is not None
    pp, sub = fed_pull_point(service, "t:p", 2)
    service.pause(sub.id)
    mine = service.subscription_address(sub.id)
    # the barrier: a witness on the same topic and pull point gets a sentinel after <m>2</m>
    witness = service.subscription_address(
        service.subscribe(sub_req(service.pull_point_address(pp.id), topic=simple("t:p"))).id
    )
    service.notify([note("<m>2</m>", simple("t:p"))])  # accumulates in the subscription
    service.notify([note("<sentinel/>", simple("t:p"))])
    got = until_sentinel(service, pp.id, witness)
    # the copies kept in the inbox still carry the subscription's reference
    assert of(got, mine) == [b"<m>0</m>", b"<m>1</m>"]
    assert of(got, witness) == [b"<m>2</m>", SENTINEL]
    service.resume(sub.id)
    service.notify([note("<sentinel>2</sentinel>", simple("t:p"))])
    got = until_sentinel(service, pp.id, mine, b"<sentinel>2</sentinel>")
    # nothing twice: the held message and sentinel, then the new sentinel
    assert of(got, mine) == [b"<m>2</m>", SENTINEL, b"<sentinel>2</sentinel>"]
    # and after a restart nothing comes again either: all of it was settled
    service = log_broker.restart()
    service.notify([note("<sentinel>3</sentinel>", simple("t:p"))])
    got = until_sentinel(service, pp.id, mine, b"<sentinel>3</sentinel>")
    assert of(got, mine) == [b"<sentinel>3</sentinel>"]


def test_unsubscribe_keeps_what_reached_the_pull_point(log_broker: Broker) -> None:
    service = log_broker.service
    assert service is not None
    pp, sub = fed_pull_point(service, "t:u", 1)
    witness = service.subscription_address(
        service.subscribe(sub_req(service.pull_point_address(pp.id), topic=simple("t:u"))).id
    )
    mine = service.subscription_address(sub.id)
    service.unsubscribe(sub.id)
    service.notify([note("<m>1</m>", simple("t:u")), note("<sentinel/>", simple("t:u"))])
    got = until_sentinel(service, pp.id, witness)
    assert of(got, mine) == [b"<m>0</m>"]
    assert of(got, witness) == [b"<m>1</m>", SENTINEL]


def test_an_answer_not_sent_after_unsubscribe_comes_again_from_the_inbox(
    log_broker: Broker,
) -> None:
    """The answer took the feed's messages, the subscription ended while it was being
    sent, then it was not sent: its messages are kept in the pull point (the inbox, in
    order, with the subscription's reference), not given back into the deleted
    subscription."""
    service = log_broker.service
    assert service is not None
    pp, sub = fed_pull_point(service, "t:c", 3)
    app = wsgi_app(service)
    status, body = start_get_messages(app, pp.id)
    assert status.startswith("200")
    assert answer_payloads(next(iter(body))) == ["0", "1", "2"]  # made, write pending
    mine = service.subscription_address(sub.id)
    service.unsubscribe(sub.id)
    body.close()  # never written: given back
    got = drain(service, pp.id, 3, timeout=15)
    assert of(got, mine) == [b"<m>0</m>", b"<m>1</m>", b"<m>2</m>"]
    # once: a Notify into the pull point's inbox behind the kept copies is the barrier
    service.notify_pull_point(pp.id, [note("<sentinel/>")])
    assert payloads(drain(service, pp.id, 1)) == [SENTINEL]


def test_an_answer_not_sent_after_a_pause_comes_again_once_after_the_resume(
    log_broker: Broker,
) -> None:
    """The pause stopped the feed's handle, which gave the answer's messages back to the
    subscription: after the resume they come once, in order (no copy in the inbox)."""
    service = log_broker.service
    assert service is not None
    pp, sub = fed_pull_point(service, "t:q", 2)
    app = wsgi_app(service)
    _, body = start_get_messages(app, pp.id)
    assert answer_payloads(next(iter(body))) == ["0", "1"]
    service.pause(sub.id)
    body.close()  # never written: given back
    service.resume(sub.id)
    service.notify([note("<sentinel/>", simple("t:q"))])
    mine = service.subscription_address(sub.id)
    got = until_sentinel(service, pp.id, mine)
    assert of(got, mine) == [b"<m>0</m>", b"<m>1</m>", SENTINEL]


def test_filtered_messages_are_settled_and_never_handed_out(log_broker: Broker) -> None:
    service = log_broker.service
    assert service is not None
    pp = service.create_pull_point(CreatePullPointRequest())
    content = ExpressionSource(XPATH, "boolean(/*[@keep='1'])", {})
    sub = service.subscribe(
        sub_req(service.pull_point_address(pp.id), topic=simple("t:c"), message_content=content)
    )
    service.notify([note(f'<m keep="{i % 2}">{i}</m>', simple("t:c")) for i in range(10)])
    got = drain(service, pp.id, 5)
    assert [etree.fromstring(m.payload).text for m in got] == ["1", "3", "5", "7", "9"]
    handle = service.registry.subscriptions[sub.id].handle
    assert handle is not None
    # everything was settled in order: nothing waits, nothing comes again after a restart
    assert service.registry.pull_points[pp.id].reader.buffered() == 0
    service = log_broker.restart()
    mine = service.subscription_address(sub.id)
    service.notify([note('<sentinel keep="1"/>', simple("t:c"))])
    got = until_sentinel(service, pp.id, mine, b'<sentinel keep="1"/>')
    assert [m.payload for m in got] == [b'<sentinel keep="1"/>']


def test_purging_the_pull_point_drops_what_its_feeds_hold(log_broker: Broker) -> None:
    service = log_broker.service
    assert service is not None
    pp, sub = fed_pull_point(service, "t:x", 3)
    service.purge_pull_point(pp.id)
    service.notify([note("<m>after</m>", simple("t:x")), note("<sentinel/>", simple("t:x"))])
    mine = service.subscription_address(sub.id)
    assert payloads(until_sentinel(service, pp.id, mine)) == [b"<m>after</m>", SENTINEL]
    # purging the subscription keeps what already reached the pull point
    service.notify([note("<m>kept</m>", simple("t:x"))])
    wait_buffered(service, pp.id, 1)
    service.purge_subscription(sub.id)
    assert payloads(drain(service, pp.id, 1)) == [b"<m>kept</m>"]


# --------------------------------------------------------------------------- the buffer alone


class _Msg(Received):
    def __init__(self, n: int, log: list[int]) -> None:
        self.n = n
        self._log = log
        self.topic = None  # type: ignore[assignment]
        self.body = b"%d" % n
        self.headers = {}
        self.content_type = "application/xml"
        self.redelivered = False

    def ack(self) -> None:
        self._log.append(self.n)

    def nack(self, requeue: bool = True) -> None:
        raise AssertionError("a feed's message is never given back by the buffer")


class _Handle(SubscriptionHandle):
    def __init__(self, name: str) -> None:
        self.name = name
        self.callback: Callable[[Received], None] | None = None
        self.stops = 0

    def start(self, on_message: Callable[[Received], None], prefetch: int = 64) -> None:
        self.callback = on_message

    def stop(self) -> None:
        self.callback = None
        self.stops += 1

    def pull(self, max_messages: int, timeout: float = 0.0) -> list[Received]:
        return []

    def depth(self) -> int | None:
        return 0

    def delete(self) -> None:
        return None


def test_buffer_settles_a_feeds_filtered_messages_in_arrival_order() -> None:
    settled: list[int] = []
    buffer = PullBuffer(_Handle("inbox"), prefetch=100)
    buffer.start()
    feed = _Handle("feed")
    # even numbers are for the pull point, odd ones are dropped by the feed's filters
    buffer.add_feed("feed", feed, lambda r: None if r.n % 2 else r.n, active=True)  # type: ignore[attr-defined]
    assert feed.callback is not None
    for n in (1, 3, 0, 5, 2, 7):
        feed.callback(_Msg(n, settled))
    assert settled == [1, 3]  # nothing of the feed waited before them: settled at once
    assert buffer.buffered() == 2
    first = buffer.take(1)
    assert [r.message for r in first] == [0]  # type: ignore[attr-defined]
    assert settled == [1, 3, 0]
    rest = buffer.take(10)
    assert [r.message for r in rest] == [2]  # type: ignore[attr-defined]
    assert settled == [1, 3, 0, 5, 2, 7]  # 5 after 0, 7 after 2: arrival order
    assert buffer.buffered() == 0


def test_a_suspended_feed_gives_back_its_waiting_messages_and_ignores_new_ones() -> None:
    settled: list[int] = []
    buffer = PullBuffer(_Handle("inbox"), prefetch=100)
    buffer.start()
    feed = _Handle("feed")
    buffer.add_feed("feed", feed, lambda r: r.n, active=True)  # type: ignore[attr-defined]
    assert feed.callback is not None
    callback = feed.callback
    for n in range(3):
        callback(_Msg(n, settled))
    waiting = buffer.suspend_feed("feed")
    assert [w.message for w in waiting] == [0, 1, 2]
    callback(_Msg(3, settled))  # delivered before its handle stopped: not buffered
    assert buffer.buffered() == 0 and settled == []
    buffer.resume_feed("feed")
    assert feed.callback is not None
    feed.callback(_Msg(4, settled))
    assert [r.message for r in buffer.take(10)] == [4]  # type: ignore[attr-defined]


def test_wait_settled_lasts_until_the_answers_that_took_the_feeds_messages_settle() -> None:
    """Before a subscription's backlog goes to its dead letters its feed's handle stops
    once the answers on their way that took its messages were settled or given back
    (``PullBuffer.wait_settled``): an ack made after the stop would be lost."""
    settled: list[int] = []
    buffer = PullBuffer(_Handle("inbox"), prefetch=100)
    buffer.start()
    feed = _Handle("feed")
    buffer.add_feed("feed", feed, lambda r: r.n, active=True)  # type: ignore[attr-defined]
    assert feed.callback is not None
    for n in range(2):
        feed.callback(_Msg(n, settled))
    _, first = buffer.hand_out(1)
    _, second = buffer.hand_out(1)
    assert not buffer.wait_settled("feed", 0)
    done: list[bool] = []
    waiter = threading.Thread(target=lambda: done.append(buffer.wait_settled("feed")))
    waiter.start()
    wait_until(lambda: buffer.settling("feed"), 5, what="the wait")
    first.settle()
    assert buffer.settling("feed")  # the second answer is still on its way
    second.give_back()  # not sent: back at the head of the buffer
    waiter.join(5)
    assert done == [True] and settled == [0] and buffer.buffered() == 1
    assert buffer.wait_settled("feed", 0) and buffer.wait_settled("gone", 0)


def test_feeds_arriving_from_many_threads_are_all_handed_out_once() -> None:
    settled: list[int] = []
    lock = threading.Lock()
    buffer = PullBuffer(_Handle("inbox"), prefetch=10_000)
    buffer.start()
    feeds = [_Handle(f"f{i}") for i in range(8)]
    for i, feed in enumerate(feeds):
        buffer.add_feed(f"f{i}", feed, lambda r: r.n, active=True)  # type: ignore[attr-defined]

    def run(i: int) -> None:
        callback = feeds[i].callback
        assert callback is not None
        for k in range(500):
            msg = _Msg(i * 1000 + k, settled)
            msg.ack = lambda m=msg: (lock.acquire(), settled.append(m.n), lock.release())  # type: ignore[method-assign]
            callback(msg)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    taken: list[int] = []
    while any(t.is_alive() for t in threads) or buffer.buffered():
        taken += [r.message for r in buffer.take(64)]  # type: ignore[attr-defined]
    for t in threads:
        t.join()
    assert sorted(taken) == sorted(i * 1000 + k for i in range(8) for k in range(500))
    assert sorted(settled) == sorted(taken)
    for i in range(8):  # each feed's messages in its order
        mine = [n for n in taken if n // 1000 == i]
        assert mine == sorted(mine)


def test_a_resume_right_after_a_pause_keeps_the_subscriptions_order(
    make_broker: Callable[..., Broker],
) -> None:
    # the buffer holds at most 2 messages per handle (the inbox's and each feed's)
    broker = make_broker(adapter_url=FILELOG, limits__max_age=None, limits__get_messages_cap=2)
    service = broker.service
    assert service is not None
    pp = service.create_pull_point(CreatePullPointRequest())
    # the inbox's share of the buffer is full: what the pause keeps in the inbox waits
    service.notify_pull_point(
        pp.id, [note("<i>0</i>", simple("t:r")), note("<i>1</i>", simple("t:r"))]
    )
    wait_buffered(service, pp.id, 2)
    sub = service.subscribe(sub_req(service.pull_point_address(pp.id), topic=simple("t:r")))
    mine = service.subscription_address(sub.id)
    service.notify([note(f"<m>{i}</m>", simple("t:r")) for i in range(3)])
    wait_buffered(service, pp.id, 4)  # <i>0</i>, <i>1</i>, <m>0</m>, <m>1</m>
    service.pause(sub.id)  # <m>0</m>, <m>1</m> reached the pull point: kept in its inbox
    service.resume(sub.id)
    service.notify([note("<sentinel/>", simple("t:r"))])
    # the kept copies wait in the inbox for room in the buffer: the resumed feed either
    # waits for them, or (the defect) its <m>2</m> and sentinel are in the buffer first
    buffer = service.registry.pull_points[pp.id].reader
    assert isinstance(buffer, PullBuffer)
    wait_until(
        lambda: buffer.holding_back(sub.id) or buffer.buffered() >= 4,
        what="the resumed feed held back or read",
    )
    got: list[Any] = []

    def seen() -> bool:
        got.extend(service.get_messages(pp.id, None))
        return SENTINEL in payloads(got)

    wait_until(seen, what="the sentinel at the pull point")
    fed = [m for m in got if m.subscription_reference is not None]
    assert of(fed, mine) == [b"<m>0</m>", b"<m>1</m>", b"<m>2</m>", SENTINEL]


def _copy(message_id: str, settled: list[int]) -> _Msg:
    """A kept copy as the inbox delivers it (its message id in the header)."""
    copy = _Msg(100, settled)
    copy.headers = {HEADER_MESSAGE_ID: message_id}
    return copy


def test_a_resumed_feed_is_read_once_its_kept_copies_are_back() -> None:
    settled: list[int] = []
    inbox = _Handle("inbox")
    buffer = PullBuffer(inbox, prefetch=100)
    buffer.start()
    feed = _Handle("feed")
    buffer.add_feed("feed", feed, lambda r: r.n, active=True)  # type: ignore[attr-defined]
    buffer.suspend_feed("feed")
    feed.stop()
    buffer.expect("feed", ["k0", "k1"])
    buffer.resume_feed("feed")
    assert buffer.holding_back("feed") and feed.callback is None
    assert inbox.callback is not None
    inbox.callback(_copy("k0", settled))
    assert buffer.take(10) != [] and feed.callback is None  # one copy still on its way
    inbox.callback(_copy("k1", settled))
    assert len(buffer.take(10)) == 1  # the copy, then the feed is read
    assert feed.callback is not None and not buffer.holding_back("feed")


def test_copies_that_never_come_hold_a_resumed_feed_back_only_so_long(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pull_buffer, "KEPT_WAIT", 0.0)
    buffer = PullBuffer(_Handle("inbox"), prefetch=100)
    buffer.start()
    feed = _Handle("feed")
    buffer.add_feed("feed", feed, lambda r: r.n, active=True)  # type: ignore[attr-defined]
    buffer.suspend_feed("feed")
    feed.stop()
    buffer.expect("feed", ["dropped by the inbox's limits"])
    buffer.resume_feed("feed")
    assert buffer.take(10) == []
    assert feed.callback is not None and not buffer.holding_back("feed")


def test_copies_not_published_after_all_hold_nothing_back() -> None:
    buffer = PullBuffer(_Handle("inbox"), prefetch=100)
    buffer.start()
    feed = _Handle("feed")
    buffer.add_feed("feed", feed, lambda r: r.n, active=True)  # type: ignore[attr-defined]
    buffer.suspend_feed("feed")
    feed.stop()
    buffer.expect("feed", ["k0"])
    buffer.unexpect("feed", ["k0"])
    buffer.resume_feed("feed")
    assert feed.callback is not None and not buffer.holding_back("feed")
