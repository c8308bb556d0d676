"""RabbitMQ adapter: its own AMQP framing (docs/performance.md, F4 follow-up).

The adapter encodes Basic.Publish frames itself (``_link.PublishFrames``) and reads
confirms, returns and deliveries itself (``_link.FastConnection``/``FrameReader``) instead
of pika's per-frame objects and callback dispatch.  The encoder must write exactly the
bytes pika writes, the reader must understand everything a broker or a native client
sends, and the publish receipts (confirm, return, nack) must stay per message.  The
byte-level checks need no broker; the others run against a real node.
"""

from __future__ import annotations

import struct
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pika
import pytest
from pika import frame, spec
from wsnmom.adapters.rabbitmq._link import (
    Delivered,
    FrameReader,
    Properties,
    PublishFrames,
    encode_table,
    settle_frame,
)
from wsnmom.adapters.rabbitmq.adapter import RabbitMQAdapter
from wsnmom.core.adapter import (
    OutboundMessage,
    Overflow,
    QueueLimits,
    SubscriptionSpec,
)
from wsnmom.topic_mapping.model import PathPattern, Topic

from tests.support.waiting import wait_until
from wsnmom.testing.conformance import Collector

FRAME_MAX = 131072
HEADERS: dict[str, Any] = {
    "wsnmom-message-id": "m-1",
    "wsnmom-topic-path": "plant/välve",  # non-ASCII
    "empty": "",
    "count": 7,
    "big": 2**40,
    "flag": True,
    "raw": b"\x00\x01",
    "nested": {"a": "b"},
}


def pika_publish_bytes(
    channel: int,
    exchange: str,
    key: str,
    mandatory: bool,
    body: bytes,
    properties: pika.BasicProperties,
) -> bytes:
    """What pika's ``basic_publish`` writes (Connection._send_message)."""
    out = [
        frame.Method(
            channel, spec.Basic.Publish(exchange=exchange, routing_key=key, mandatory=mandatory)
        ).marshal(),
        frame.Header(channel, len(body), properties).marshal(),
    ]
    step = FRAME_MAX - spec.FRAME_HEADER_SIZE - spec.FRAME_END_SIZE
    for start in range(0, len(body), step):
        out.append(frame.Body(channel, body[start : start + step]).marshal())
    return b"".join(out)


class TestEncoding:
    """Byte-for-byte the frames pika writes (no broker needed)."""

    @pytest.mark.parametrize("size", [0, 1, 500, FRAME_MAX - 8, FRAME_MAX - 7, 3 * FRAME_MAX])
    @pytest.mark.parametrize("persistent", [True, False])
    def test_publish_frames_equal_pikas(self, size: int, persistent: bool) -> None:
        body = bytes(i % 251 for i in range(size))
        frames = PublishFrames(7, FRAME_MAX)
        out: list[bytes] = []
        frames.message(
            out,
            frames.method("ex.ä", "a.b", True),
            body,
            content_type="application/xml",
            table=encode_table(HEADERS),
            persistent=persistent,
            message_id="m-1",
            timestamp=1_700_000_000,
        )
        properties = pika.BasicProperties(
            content_type="application/xml",
            headers=HEADERS,
            delivery_mode=2 if persistent else None,
            message_id="m-1",
            timestamp=1_700_000_000,
        )
        assert b"".join(out) == pika_publish_bytes(7, "ex.ä", "a.b", True, body, properties)

    def test_optional_properties_left_out(self) -> None:
        frames = PublishFrames(1, FRAME_MAX)
        out: list[bytes] = []
        frames.message(
            out,
            frames.method("", "q", False),
            b"x",
            content_type=None,
            table=None,
            persistent=False,
            message_id=None,
            timestamp=None,
        )
        expected = pika_publish_bytes(1, "", "q", False, b"x", pika.BasicProperties())
        assert b"".join(out) == expected
        assert encode_table({}) == b"\x00\x00\x00\x00"

    def test_too_long_names_are_refused(self) -> None:
        with pytest.raises(pika.exceptions.ShortStringTooLong):
            PublishFrames(1, FRAME_MAX).method("x" * 256, "k", True)
        with pytest.raises(pika.exceptions.ShortStringTooLong):
            encode_table({"k" * 256: "v"})


class TestReading:
    """The reader understands pika-encoded frames (no broker needed)."""

    @staticmethod
    def feed(reader: FrameReader, data: bytes) -> None:
        offset = 0
        while offset < len(data):
            kind, _channel, length = struct.unpack_from(">BHI", data, offset)
            start, end = offset + 7, offset + 7 + length
            if kind == spec.FRAME_METHOD:
                assert reader.method(data, start, end)
            else:
                assert reader.reading_content
                reader.content(kind, data, start, end)
            offset = end + 1

    @pytest.mark.parametrize("size", [0, 10, 3 * FRAME_MAX + 5])
    def test_deliver_with_every_property(self, size: int) -> None:
        got: list[tuple[Delivered, Properties, bytes]] = []
        reader = FrameReader(on_deliver=lambda m, p, b: got.append((m, p, b)))
        props = pika.BasicProperties(
            content_type="application/json",
            content_encoding="gzip",
            headers=HEADERS,
            delivery_mode=2,
            priority=3,
            correlation_id="c",
            reply_to="r",
            expiration="60000",
            message_id="m",
            timestamp=12345,
            type="t",
            user_id="u",
            app_id="a",
            cluster_id="cl",
        )
        body = b"b" * size
        data = (
            frame.Method(3, spec.Basic.Deliver("ctag", 2**40 + 1, True, "ex", "a.b.c")).marshal()
            + frame.Header(3, len(body), props).marshal()
        )
        step = FRAME_MAX - 8
        for start in range(0, len(body), step):
            data += frame.Body(3, body[start : start + step]).marshal()
        self.feed(reader, data)
        assert len(got) == 1
        method, properties, received = got[0]
        assert (method.consumer_tag, method.delivery_tag, method.redelivered) == (
            "ctag",
            2**40 + 1,
            True,
        )
        assert (method.exchange, method.routing_key) == ("ex", "a.b.c")
        assert received == body
        decoded = spec.BasicProperties()
        decoded.decode(frame.Header(3, len(body), props).marshal()[7 + 12 : -1])
        for name in Properties.__slots__:
            assert getattr(properties, name) == getattr(decoded, name), name
        assert not reader.reading_content

    def test_return_skips_the_headers_and_confirms(self) -> None:
        returned: list[tuple[Delivered, Properties, bytes]] = []
        confirms: list[tuple[int, bool, bool]] = []
        reader = FrameReader(
            on_return=lambda m, p, b: returned.append((m, p, b)),
            on_confirm=lambda *args: confirms.append(args),
        )
        props = pika.BasicProperties(headers=HEADERS, message_id="m-9", content_type="x/y")
        data = (
            frame.Method(1, spec.Basic.Return(312, "NO_ROUTE", "ex", "k")).marshal()
            + frame.Header(1, 3, props).marshal()
            + frame.Body(1, b"abc").marshal()
            + frame.Method(1, spec.Basic.Ack(5, multiple=True)).marshal()
            + frame.Method(1, spec.Basic.Nack(6, multiple=False, requeue=False)).marshal()
        )
        self.feed(reader, data)
        method, properties, body = returned[0]
        assert (method.reply_code, method.reply_text, method.exchange, method.routing_key) == (
            312,
            "NO_ROUTE",
            "ex",
            "k",
        )
        assert (properties.message_id, properties.content_type, properties.headers) == (
            "m-9",
            "x/y",
            None,
        )
        assert body == b"abc"
        assert confirms == [(5, True, False), (6, False, True)]

    def test_other_methods_are_left_to_pika(self) -> None:
        reader = FrameReader(on_confirm=lambda *a: None)
        for method in (spec.Basic.QosOk(), spec.Channel.Close(406, "x", 0, 0)):
            data = frame.Method(1, method).marshal()
            assert not reader.method(data, 7, len(data) - 1)
        deliver = frame.Method(1, spec.Basic.Deliver("c", 1, False, "e", "k")).marshal()
        assert not reader.method(deliver, 7, len(deliver) - 1)  # no on_deliver


# --------------------------------------------------------------------------- real node


@pytest.fixture
def ns() -> str:
    return f"urn:test:rabbit-frames:{uuid.uuid4().hex}"


def message(topic: Topic, body: bytes, **headers: str) -> OutboundMessage:
    return OutboundMessage(topic=topic, body=body, message_id=uuid.uuid4().hex, headers=headers)


@pytest.mark.rabbitmq
class TestOnTheWire:
    @pytest.mark.parametrize("size", [0, 300_000])
    def test_native_consumer_reads_adapter_publishes(
        self, make_adapter: Callable[..., RabbitMQAdapter], native: Any, ns: str, size: int
    ) -> None:
        """Properties, headers and a body spanning several frames arrive as published."""
        adapter = make_adapter()
        topic = Topic(ns, ("wire", "test"))
        exchange, key = adapter.native_name(topic)
        adapter.publish(message(topic, b"<boot/>"))  # declares the exchange
        queue = native.queue_declare("", exclusive=True).method.queue
        native.queue_bind(queue, exchange, key)
        body = b"<a>" + b"z" * size + b"</a>"
        sent = message(topic, body, **{"wsnmom-extra": "välue"})
        assert adapter.publish(sent).routed is True
        method, properties, got = native.basic_get(queue, auto_ack=True)
        assert got == body
        assert properties.content_type == "application/xml"
        assert properties.delivery_mode == 2
        assert properties.message_id == sent.message_id
        assert abs(properties.timestamp - time.time()) < 60
        assert properties.headers["wsnmom-extra"] == "välue"
        assert properties.headers["wsnmom-message-id"] == sent.message_id
        assert properties.headers["wsnmom-topic-path"] == "wire/test"
        assert properties.headers["wsnmom-origin"] == "gateway"
        assert method.routing_key == key

    def test_adapter_consumer_reads_native_publishes(
        self, make_adapter: Callable[..., RabbitMQAdapter], native: Any, ns: str
    ) -> None:
        """A native message with every property and a multi-frame body reaches a started
        subscription (the fast reader) and a pull (pika) alike."""
        exchange = f"test.ex.{uuid.uuid4().hex[:8]}"
        adapter = make_adapter(exchanges={ns: exchange})
        patterns = (PathPattern(ns, ("n",)),)
        pushed = adapter.subscription(SubscriptionSpec(f"w-{uuid.uuid4().hex[:8]}", patterns))
        pulled = adapter.subscription(SubscriptionSpec(f"w-{uuid.uuid4().hex[:8]}", patterns))
        got = Collector()
        pushed.start(got, prefetch=4)
        body = b"{" + b"1" * 400_000 + b"}"
        props = pika.BasicProperties(
            content_type="application/json",
            content_encoding="identity",
            headers={"app": "native", "n": 3, "wsnmom-topic-ns": ns},
            delivery_mode=2,
            priority=1,
            correlation_id="c",
            reply_to="r",
            message_id="native-1",
            timestamp=1,
            type="t",
            app_id="a",
        )
        native.basic_publish(exchange, "n", body, props)
        native.basic_publish(exchange, "n", b"", pika.BasicProperties())
        for received in (got.wait_for(2, 10.0), pulled.pull(2, timeout=5.0)):
            assert len(received) == 2
            first, empty = received
            assert first.topic == Topic(ns, ("n",))
            assert first.body == body
            assert first.content_type == "application/json"
            assert first.headers["app"] == "native"
            assert first.headers["n"] == "3"
            assert empty.body == b""
            assert empty.content_type == "application/octet-stream"
            assert not first.redelivered
        for m in got.received:
            m.ack()
        pushed.stop()
        pushed.delete()
        pulled.delete()

    def test_receipts_per_message_in_one_batch(
        self, make_adapter: Callable[..., RabbitMQAdapter], ns: str, private_vhost: str
    ) -> None:
        """Returned (unrouted) and routed messages interleaved in one publish_many, also
        with the same message id on two topics: each gets its own receipt."""
        adapter = make_adapter(private_vhost)
        routed = Topic(ns, ("bound",))
        handle = adapter.subscription(
            SubscriptionSpec(f"r-{uuid.uuid4().hex[:8]}", (PathPattern(ns, ("bound",)),))
        )
        batch = []
        for i in range(60):
            topic = routed if i % 3 == 0 else Topic(ns, ("nobody", f"t{i % 2}"))
            batch.append(OutboundMessage(topic=topic, body=b"<%d/>" % i, message_id=f"id{i // 2}"))
        receipts = adapter.publish_many(batch)
        assert [r.routed for r in receipts] == [i % 3 == 0 for i in range(60)]
        assert handle.depth() == 20
        assert adapter.publisher.pending == {} and adapter.publisher.returned == {}
        handle.delete()

    def test_nack_of_a_full_queue_inside_a_batch(
        self, make_adapter: Callable[..., RabbitMQAdapter], ns: str
    ) -> None:
        adapter = make_adapter()
        topic = Topic(ns, ("full",))
        limits = QueueLimits(max_messages=2, overflow=Overflow.DROP_NEWEST)
        handle = adapter.subscription(
            SubscriptionSpec(f"n-{uuid.uuid4().hex[:8]}", (PathPattern(ns, ("full",)),), limits)
        )
        receipts = adapter.publish_many([message(topic, b"%d" % i) for i in range(5)])
        assert [r.routed for r in receipts] == [True, True, None, None, None]
        strict = make_adapter(fail_on_nack=True)
        with pytest.raises(Exception, match="nack"):
            strict.publish(message(topic, b"refused"))
        assert handle.depth() == 2
        handle.delete()

    def test_one_peer_copy_per_topic_and_batch(
        self, make_adapter: Callable[..., RabbitMQAdapter], native: Any, ns: str
    ) -> None:
        """Only the last message per topic of a batch becomes current and is copied to the
        other instances; they see it as current."""
        first = make_adapter()
        second = make_adapter()
        spy = native.queue_declare("", exclusive=True).method.queue
        native.queue_bind(spy, first.peer_exchanges[0], "")
        a, b = Topic(ns, ("a",)), Topic(ns, ("b",))
        batch = [message(a if i % 2 else b, b"<m>%d</m>" % i) for i in range(10)]
        first.publish_many(batch)
        copies = []
        while (got := native.basic_get(spy, auto_ack=True))[0] is not None:
            copies.append(got[2])
        assert sorted(copies) == [b"<m>8</m>", b"<m>9</m>"]
        for adapter in (first, second):
            assert adapter.current_message(a).body == b"<m>9</m>"  # type: ignore[union-attr]
            assert adapter.current_message(b).body == b"<m>8</m>"  # type: ignore[union-attr]

    def test_many_batches_from_many_threads(
        self, make_adapter: Callable[..., RabbitMQAdapter], ns: str
    ) -> None:
        """Concurrent batches share the channel's delivery tags; confirms with
        ``multiple`` settle them in order and every message arrives once."""
        adapter = make_adapter()
        topic = Topic(ns, ("many",))
        handle = adapter.subscription(
            SubscriptionSpec(f"m-{uuid.uuid4().hex[:8]}", (PathPattern(ns, ("many",)),))
        )

        def send(k: int) -> list[bool | None]:
            batch = [message(topic, b"%d-%d" % (k, i)) for i in range(50)]
            return [r.routed for r in adapter.publish_many(batch)]

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(send, range(40)))
        assert all(r == [True] * 50 for r in results)
        deadline = time.monotonic() + 10
        while handle.depth() != 2000 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert handle.depth() == 2000
        assert not adapter.publisher.pending
        handle.delete()


@pytest.mark.parametrize(
    ("ack", "requeue", "method"),
    [
        (True, False, spec.Basic.Ack(2**33 + 5)),
        (False, True, spec.Basic.Nack(2**33 + 5, requeue=True)),
        (False, False, spec.Basic.Nack(2**33 + 5, requeue=False)),
    ],
)
def test_settle_frames_equal_pikas(ack: bool, requeue: bool, method: Any) -> None:
    assert settle_frame(9, 2**33 + 5, ack, requeue) == frame.Method(9, method).marshal()


@pytest.mark.rabbitmq
class TestThreadsAndSettling:
    def test_publish_after_the_channel_closed_uses_a_new_one(
        self, make_adapter: Callable[..., RabbitMQAdapter], ns: str
    ) -> None:
        """Publishes normally skip the loop's coroutine (encoded on the calling thread);
        with the publishing channel gone they take it and open a new channel."""
        adapter = make_adapter()
        topic = Topic(ns, ("again",))
        handle = adapter.subscription(
            SubscriptionSpec(f"a-{uuid.uuid4().hex[:8]}", (PathPattern(ns, ("again",)),))
        )
        assert adapter.publish(message(topic, b"<1/>")).routed is True
        old = adapter.publisher.channel
        assert old is not None
        adapter.publisher.link.submit(old.close(), 5.0)
        assert adapter.publish(message(topic, b"<2/>")).routed is True
        assert adapter.publisher.channel is not None and adapter.publisher.channel is not old
        assert [m.body for m in handle.pull(5, timeout=2.0)] == [b"<1/>", b"<2/>"]
        handle.delete()

    def test_settled_from_many_threads_exactly_once(
        self, make_adapter: Callable[..., RabbitMQAdapter], ns: str
    ) -> None:
        """Acks and nacks from many threads are written in batches by the loop; the first
        settlement of a delivery wins, a second is ignored."""
        adapter = make_adapter()
        topic = Topic(ns, ("acks",))
        handle = adapter.subscription(
            SubscriptionSpec(f"s-{uuid.uuid4().hex[:8]}", (PathPattern(ns, ("acks",)),))
        )
        got = Collector(ack=False)
        handle.start(got, prefetch=1000)
        adapter.publish_many([message(topic, b"%d" % i) for i in range(600)])
        received = got.wait_for(600, 10.0)
        assert len(received) == 600

        def settle(k: int) -> None:
            for m in received[k::8]:
                if int(m.body) % 10 == 0:
                    m.nack(requeue=True)
                    m.ack()  # ignored: already settled
                else:
                    m.ack()
                    m.nack(requeue=True)  # ignored

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(settle, range(8)))
        redelivered = got.wait_for(660, 10.0)[600:]
        assert sorted(int(m.body) for m in redelivered) == list(range(0, 600, 10))
        assert all(m.redelivered for m in redelivered)
        for m in redelivered:
            m.ack()
        handle.stop()
        assert handle.depth() == 0
        handle.delete()

    def test_pull_stops_when_the_queue_is_empty(
        self, make_adapter: Callable[..., RabbitMQAdapter], ns: str
    ) -> None:
        adapter = make_adapter()
        topic = Topic(ns, ("pull",))
        handle = adapter.subscription(
            SubscriptionSpec(f"p-{uuid.uuid4().hex[:8]}", (PathPattern(ns, ("pull",)),))
        )
        adapter.publish_many([message(topic, b"%d" % i) for i in range(3)])
        first = handle.pull(2, timeout=1.0)
        assert [m.body for m in first] == [b"0", b"1"]
        started = time.monotonic()
        rest = handle.pull(10, timeout=30.0)
        assert [m.body for m in rest] == [b"2"]
        # no waiting once something was taken (a wait would last the 30 s)
        assert time.monotonic() - started < 15.0
        for m in first + rest:
            m.ack()
        handle.delete()


def test_reader_get_ok_and_get_empty() -> None:
    replies: list[tuple[Any, Any, bytes]] = []
    reader = FrameReader(on_get=lambda m, p, b: replies.append((m, p, b)))
    props = pika.BasicProperties(headers={"k": "v"}, content_type="a/b")
    data = (
        frame.Method(2, spec.Basic.GetOk(2**35, True, "ex", "r.k", 41)).marshal()
        + frame.Header(2, 2, props).marshal()
        + frame.Body(2, b"hi").marshal()
        + frame.Method(2, spec.Basic.GetEmpty()).marshal()
    )
    TestReading.feed(reader, data)
    (method, properties, body), empty = replies
    assert (method.delivery_tag, method.redelivered, method.exchange) == (2**35, True, "ex")
    assert (method.routing_key, method.message_count) == ("r.k", 41)
    assert (properties.headers, properties.content_type, body) == ({"k": "v"}, "a/b", b"hi")
    assert empty == (None, None, b"")


@pytest.mark.rabbitmq
def test_pulls_in_flight_together(make_adapter: Callable[..., RabbitMQAdapter], ns: str) -> None:
    """basic.get requests are written directly and their replies matched in order, so
    pulls of one subscription from several threads may overlap: every message is
    returned exactly once; a nack puts it back (redelivered)."""
    adapter = make_adapter()
    topic = Topic(ns, ("gets",))
    handle = adapter.subscription(
        SubscriptionSpec(f"g-{uuid.uuid4().hex[:8]}", (PathPattern(ns, ("gets",)),))
    )
    assert handle.pull(5) == []  # opens the puller channel (coroutine path)
    adapter.publish_many([message(topic, b"%d" % i) for i in range(300)])

    def drain(_: int) -> list[Any]:
        got: list[Any] = []
        while batch := handle.pull(7):
            got += batch
        return got

    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(drain, range(6)))
    bodies = sorted(int(m.body) for got in results for m in got)
    assert bodies == list(range(300))
    every = [m for got in results for m in got]
    every[0].nack(requeue=True)
    for m in every[1:]:
        m.ack()
    (again,) = handle.pull(10, timeout=2.0)
    assert again.body == every[0].body and again.redelivered
    again.ack()
    assert handle.depth() == 0
    handle.delete()


@pytest.mark.rabbitmq
def test_take_removes_on_delivery(make_adapter: Callable[..., RabbitMQAdapter], ns: str) -> None:
    """``take`` is an auto-ack basic.get: concurrent takes return every message exactly
    once (the queue primer is skipped without an ack), nothing is left unacked, and a new
    adapter on the same queue finds it empty."""
    adapter = make_adapter()
    topic = Topic(ns, ("takes",))
    name = f"t-{uuid.uuid4().hex[:8]}"
    spec_ = SubscriptionSpec(name, (PathPattern(ns, ("takes",)),))
    handle = adapter.subscription(spec_)
    assert handle.take(5) == []  # opens the connection's shared take channels first
    adapter.publish_many([message(topic, b"%d" % i) for i in range(200)])

    def drain(_: int) -> list[Any]:
        got: list[Any] = []
        while batch := handle.take(7):
            assert len(batch) <= 7
            got += batch
        return got

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(drain, range(4)))
    every = [m for got in results for m in got]
    assert sorted(int(m.body) for m in every) == list(range(200))
    for m in every:
        m.nack(requeue=True)  # does nothing: already removed
    assert handle.depth() == 0
    adapter.close()
    reopened = make_adapter()
    again = reopened.subscription(spec_)
    # the barrier: a sentinel published now is the first message the queue gives
    reopened.publish_many([message(topic, b"sentinel")])
    got = wait_until(lambda: again.pull(10, timeout=0.2), 10, what="the sentinel")
    assert [m.body for m in got] == [b"sentinel"]
    got[0].ack()
    again.delete()


@pytest.mark.rabbitmq
def test_takes_of_many_subscriptions_share_a_few_channels(
    make_adapter: Callable[..., RabbitMQAdapter], ns: str
) -> None:
    """GetMessages on 40 pull points (and on the subscriptions feeding them) opens no
    channel per queue: every take goes over the connection's few shared take channels."""
    adapter = make_adapter()
    topic = Topic(ns, ("shared",))
    handles = [
        adapter.subscription(
            SubscriptionSpec(f"s-{uuid.uuid4().hex[:8]}", (PathPattern(ns, ("shared",)),))
        )
        for _ in range(40)
    ]
    adapter.publish_many([message(topic, b"one")])
    got = [wait_until(lambda h=h: h.take(5), 10, what="the message") for h in handles]
    assert [[m.body for m in g] for g in got] == [[b"one"]] * 40
    assert all(h.puller is None for h in handles)  # type: ignore[attr-defined]
    links = {id(h.link) for h in handles}  # type: ignore[attr-defined]
    takers = adapter.consumers._takers
    assert sum(len(takers[link]) for link in links) <= 4 * len(links)
    for h in handles:
        h.delete()


def test_writes_go_straight_to_the_socket_and_large_ones_still_arrive_whole(
    make_adapter: Callable[..., RabbitMQAdapter], ns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A publish is written by the publishing thread itself, straight to the socket, when
    nothing is buffered (no loop wake-up); what the socket does not take (a batch larger
    than its buffer) goes through pika's transport after the part that was sent, so the
    broker gets every byte in order."""
    adapter = make_adapter()
    topic = Topic(ns, ("direct",))
    handle = adapter.subscription(
        SubscriptionSpec(f"d-{uuid.uuid4().hex[:8]}", (PathPattern(ns, ("direct",)),))
    )
    adapter.publish(message(topic, b"<warm/>"))  # publishing channel open
    assert adapter.publisher.channel is not None
    stream = adapter.publisher.channel.pika.connection.frame_io.stream
    assert stream is not None and stream.transport is not None
    transport = stream.transport  # asyncio's: what the socket did not take at once
    buffered: list[int] = []
    write = transport.write
    monkeypatch.setattr(transport, "write", lambda data: (buffered.append(len(data)), write(data)))
    loop = adapter.publisher.link.loop
    wakeups: list[object] = []
    wake = loop.call_soon_threadsafe
    monkeypatch.setattr(
        loop, "call_soon_threadsafe", lambda *a, **k: (wakeups.append(a[0]), wake(*a, **k))[1]
    )
    small = [message(topic, b"<s>%d</s>" % i) for i in range(20)]
    assert all(r.routed for r in adapter.publish_many(small))
    assert all(adapter.publish(m).routed for m in small[:5])
    assert buffered == []  # all of it went out directly
    assert wakeups == []  # written by this thread: the loop was not woken to write
    large = [message(topic, b"<l>" + bytes([65 + i]) * 1_000_000 + b"</l>") for i in range(16)]
    assert all(r.routed for r in adapter.publish_many(large))
    assert buffered, "16 MB in one write should not fit the socket buffer"
    got = [m.body for m in handle.take(100)]
    expected = [b"<warm/>"] + [m.body for m in small + small[:5] + large]
    assert got == expected
    handle.delete()
