"""The RabbitMQ adapter's connection (``adapters/rabbitmq/_fast.py``, ``_link.py``) on a
real RabbitMQ: one channel's reader that raises (its consumer's bug) closes that channel
only, its unsettled message goes back to its queue and the other channels of the
connection go on; the bytes and frames written from the loop thread and from other
threads at once are all counted."""

from __future__ import annotations

import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("pika")

import pika
from wsnmom.adapters.rabbitmq._link import Channel, FrameReader, Link
from wsnmom.adapters.rabbitmq._wire import Delivered, Properties

from tests.support.waiting import wait_until

pytestmark = pytest.mark.rabbitmq


class Frame(bytes):
    """Bytes whose length is Python code: the interpreter may switch threads inside an
    update of a counter by ``len(data)``, as it may anywhere without the GIL."""

    def __len__(self) -> int:
        return bytes.__len__(self)


HEARTBEAT = Frame(b"\x08\x00\x00\x00\x00\x00\x00\xce")


@pytest.fixture
def link(rabbitmq_url: str) -> Iterator[Link]:
    async def connected(_link: Link) -> None:
        return None

    params = pika.URLParameters(rabbitmq_url)
    # no heartbeats: the counting test needs an idle connection however long it runs
    # (pika writes one every 30 s; an 8-byte frame more failed it at load 25)
    params.heartbeat = 0
    lk = Link(
        "fast-link-test",
        params,
        connected,
        lambda _link, _exc: None,
    )
    assert lk.start(30), f"no connection to {rabbitmq_url}"
    yield lk
    lk.close()


class Reader:
    """A consumer on its own channel, reading its deliveries with a FrameReader; with
    ``bug`` its handler raises at the delivery of that body."""

    def __init__(self, link: Link, queue: str, bug: bytes | None = None) -> None:
        self.link = link
        self.queue = queue
        self.bug = bug
        self.got: list[bytes] = []
        self.closed = threading.Event()
        self.channel: Channel = link.submit(self._start(), 10)

    async def _start(self) -> Channel:
        ch = await self.link.open_channel()
        await ch.call("queue_declare", self.queue, auto_delete=False)
        ch.add_close_listener(lambda _ch, _reason: self.closed.set())
        ch.read(FrameReader(on_deliver=lambda m, p, b: self._deliver(m, p, b)))
        await ch.call("basic_consume", self.queue, lambda *_: None, auto_ack=False)
        return ch

    def _deliver(self, method: Delivered, _props: Properties, body: bytes) -> None:
        if body == self.bug:
            raise RuntimeError("the consumer's bug")
        self.got.append(body)
        self.channel.pika.basic_ack(method.delivery_tag)


def _run(link: Link, fn: Callable[..., Any], *args: Any) -> Any:
    async def call() -> Any:
        return fn(*args)

    return link.submit(call(), 10)


def _depth(link: Link, queue: str) -> int:
    async def depth() -> int:
        ch = await link.open_channel()
        try:
            ok = await ch.call("queue_declare", queue, passive=True)
            return int(ok.method.message_count)
        finally:
            await ch.close()

    return int(link.submit(depth(), 10))


def _delete(link: Link, *queues: str) -> None:
    async def delete() -> None:
        ch = await link.open_channel()
        for q in queues:
            await ch.call("queue_delete", q)
        await ch.close()

    link.submit(delete(), 10)


def test_a_reader_that_raises_closes_its_channel_not_the_connection(
    link: Link, caplog: pytest.LogCaptureFixture
) -> None:
    tag = uuid.uuid4().hex[:10]
    good = Reader(link, f"fast-good-{tag}")
    buggy = Reader(link, f"fast-buggy-{tag}", bug=b"poison")
    generation = link.generation
    try:

        def publish(queue: str, body: bytes) -> None:
            _run(link, good.channel.pika.basic_publish, "", queue, body)

        publish(good.queue, b"g1")
        publish(buggy.queue, b"fine")
        wait_until(lambda: good.got == [b"g1"] and buggy.got == [b"fine"], 15, what="first")
        publish(buggy.queue, b"poison")
        wait_until(buggy.closed.is_set, 15, what="the buggy consumer's channel closed")
        assert "reading channel" in caplog.text and "the consumer's bug" in caplog.text
        # the other channel and the connection go on
        publish(good.queue, b"g2")
        wait_until(lambda: good.got == [b"g1", b"g2"], 15, what="the good consumer goes on")
        assert link.generation == generation and link.is_up
        assert good.channel.is_open
        # the message it failed on is back in its queue, not lost
        wait_until(lambda: _depth(link, buggy.queue) == 1, 15, what="the poison requeued")
    finally:
        _delete(link, good.queue, buggy.queue)


def test_bytes_sent_from_two_threads_are_all_counted(link: Link) -> None:
    """The loop thread (``write_frames``, pika's own writes) and a publishing thread
    (``send_now`` under the write lock) write at once; every byte and frame is counted.
    (Both used to add to pika's ``bytes_sent``: a few hundred bytes of 3 MB were lost.)"""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch as often as they can
    conn = link.connection
    assert conn is not None
    rounds = 200_000
    before = conn.sent()
    done = threading.Event()

    def on_loop(left: int) -> None:
        for _ in range(min(left, 200)):
            conn.write_frames(HEARTBEAT)
        if left > 200:
            link.loop.call_soon(on_loop, left - 200)
        else:
            done.set()

    direct = 0
    try:
        link.loop.call_soon_threadsafe(on_loop, rounds)
        while not done.is_set() or direct < rounds // 2:
            with conn.write_lock:
                if conn.send_now(HEARTBEAT):
                    direct += 1
        done.wait(30)
    finally:
        sys.setswitchinterval(old)

    def counted() -> bool:
        return conn.sent() == (
            before[0] + (rounds + direct) * len(HEARTBEAT),
            before[1] + rounds + direct,
        )

    # nothing else writes on this idle connection (the fixture turned heartbeats off)
    assert counted(), (conn.sent(), before, rounds, direct)


def test_acks_given_before_a_reader_fails_are_written_before_its_channel_closes(
    link: Link,
) -> None:
    """An ack given from another thread (as a WS-N delivery settles) waits for the loop's
    next flush; the channel that a failed read closes must write it first, or the
    message already handled goes back to its queue and is delivered twice."""
    queue = f"fast-acks-{uuid.uuid4().hex[:10]}"
    reader = Reader(link, queue)
    tags: list[int] = []

    def deliver(method: Delivered, _props: Properties, body: bytes) -> None:
        if body != b"poison":
            tags.append(method.delivery_tag)
            return
        # the consumer settles the one before from its own thread, then fails
        acker = threading.Thread(target=link.settle, args=(reader.channel, tags[0], True, False))
        acker.start()
        acker.join()
        raise RuntimeError("the consumer's bug")

    reader._deliver = deliver  # type: ignore[method-assign]
    try:

        def publish(body: bytes) -> None:
            _run(link, reader.channel.pika.basic_publish, "", queue, body)

        publish(b"handled")
        wait_until(lambda: len(tags) == 1, 15, what="the first delivery")
        publish(b"poison")
        wait_until(reader.closed.is_set, 15, what="the channel closed")
        # only the message it failed on is back in the queue
        wait_until(lambda: _depth(link, queue) == 1, 15, what="one message requeued")
    finally:
        _delete(link, queue)


def test_a_link_never_started_closes_its_loop(rabbitmq_url: str) -> None:
    """A link made and closed without a start (an adapter whose open failed before it)
    closes its event loop, whose selector holds a socket pair until garbage collection
    otherwise (only the I/O thread closed it)."""

    async def connected(_link: Link) -> None:
        return None

    lk = Link("never-started", pika.URLParameters(rabbitmq_url), connected, lambda _l, _e: None)
    lk.close()
    assert lk.loop.is_closed()
    lk.close()  # idempotent
