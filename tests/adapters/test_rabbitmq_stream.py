"""The RabbitMQ connection's stream (``adapters/rabbitmq/_fast.py``, ``Stream``) splits the
received bytes between the channels' frame readers and pika, without a broker.

Whatever the chunks the socket delivers, the readers get exactly the frames they take
(confirms, deliveries with their content), pika's protocol gets every other frame whole
and in order, and the frames the readers took are counted into the connection's
``bytes_received``/``frames_received`` (pika's heartbeat checker reads them).  A channel
that pika closes in the middle of a read stops being read by its reader at once.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

pika = pytest.importorskip("pika")

from pika import frame, spec  # noqa: E402
from wsnmom.adapters.rabbitmq._fast import FrameIO, Stream  # noqa: E402
from wsnmom.adapters.rabbitmq._wire import FrameReader  # noqa: E402


def _method(channel: int, method: Any) -> bytes:
    return bytes(frame.Method(channel, method).marshal())


def _content(channel: int, body: bytes, props: Any) -> bytes:
    return bytes(frame.Header(channel, len(body), props).marshal()) + bytes(
        frame.Body(channel, body).marshal()
    )


class Pika:
    """pika's side of the stream: records what it is given; ``on_bytes`` may act."""

    def __init__(self) -> None:
        self.received = bytearray()
        self.calls = 0
        self.on_bytes: Any = None

    def data_received(self, data: bytes) -> None:
        self.received += data
        self.calls += 1
        if self.on_bytes is not None:
            self.on_bytes(bytes(self.received))


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def _stream(
    loop: asyncio.AbstractEventLoop, readers: dict[int, FrameReader], protocol: Pika
) -> tuple[Stream, SimpleNamespace]:
    io = FrameIO(loop, readers)
    counters = SimpleNamespace(bytes_received=0, frames_received=0)
    io.connection = counters  # type: ignore[assignment]
    sock = socket.socket()
    sock.close()  # never used: nothing is written here
    return Stream(io, protocol, sock, True, lambda _s: None), counters  # type: ignore[arg-type]


def _chunks(data: bytes, size: int) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


PROPS = pika.BasicProperties(content_type="text/xml", headers={"k": "v"}, delivery_mode=2)
ACK = _method(1, spec.Basic.Ack(delivery_tag=5, multiple=True))
NACK = _method(1, spec.Basic.Nack(delivery_tag=6, multiple=False))
DELIVER = _method(1, spec.Basic.Deliver("ctag", 7, False, "ex", "rk")) + _content(
    1, b"<m>" + b"x" * 300 + b"</m>", PROPS
)
CONSUME_OK = _method(1, spec.Basic.ConsumeOk("ctag"))  # channel 1, but not a reader's
HEARTBEAT = bytes(frame.Heartbeat().marshal())
OPEN_OK = _method(2, spec.Channel.OpenOk())
OTHER_DELIVER = _method(2, spec.Basic.Deliver("c2", 1, False, "ex", "rk")) + _content(
    2, b"<other/>", PROPS
)
STREAM = [CONSUME_OK, ACK, HEARTBEAT, DELIVER, OPEN_OK, OTHER_DELIVER, NACK, HEARTBEAT]
FOR_READER = [ACK, DELIVER, NACK]
FOR_PIKA = [CONSUME_OK, HEARTBEAT, OPEN_OK, OTHER_DELIVER, HEARTBEAT]


@pytest.mark.parametrize("size", [1, 2, 3, 7, 8, 64, 333, 10_000])
def test_frames_go_to_the_reader_or_to_pika_in_order(
    loop: asyncio.AbstractEventLoop, size: int
) -> None:
    confirms: list[tuple[int, bool, bool]] = []
    deliveries: list[tuple[Any, Any, bytes]] = []
    reader = FrameReader(
        on_confirm=lambda tag, multiple, nack: confirms.append((tag, multiple, nack)),
        on_deliver=lambda m, p, b: deliveries.append((m, p, b)),
    )
    protocol = Pika()
    stream, counters = _stream(loop, {1: reader}, protocol)
    data = b"".join(STREAM)
    for chunk in _chunks(data, size):
        stream.data_received(chunk)
    assert bytes(protocol.received) == b"".join(FOR_PIKA)
    assert confirms == [(5, True, False), (6, False, True)]
    [(method, props, body)] = deliveries
    assert (method.consumer_tag, method.delivery_tag, method.routing_key) == ("ctag", 7, "rk")
    assert (props.content_type, props.headers, props.delivery_mode) == ("text/xml", {"k": "v"}, 2)
    assert body == b"<m>" + b"x" * 300 + b"</m>"
    assert counters.bytes_received == sum(len(f) for f in FOR_READER)
    assert counters.frames_received == 5  # ack, deliver's method, header, body, nack
    assert stream.pending == b""


def test_a_run_of_pika_frames_is_handed_over_in_one_call(
    loop: asyncio.AbstractEventLoop,
) -> None:
    protocol = Pika()
    stream, _ = _stream(loop, {1: FrameReader(on_confirm=lambda *a: None)}, protocol)
    stream.data_received(CONSUME_OK + HEARTBEAT + OPEN_OK + ACK + HEARTBEAT + OPEN_OK)
    assert protocol.calls == 2  # the three before the ack, then the two after it
    assert bytes(protocol.received) == CONSUME_OK + HEARTBEAT + OPEN_OK + HEARTBEAT + OPEN_OK


def test_a_channel_pika_closes_is_no_longer_read_by_its_reader(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """pika processes a Channel.Close first (its close callback removes the reader);
    a later frame of that channel in the same read then goes to pika."""
    confirms: list[int] = []
    readers = {1: FrameReader(on_confirm=lambda tag, _m, _n: confirms.append(tag))}
    protocol = Pika()
    close = _method(1, spec.Channel.Close(406, "PRECONDITION_FAILED", 0, 0))

    def on_bytes(received: bytes) -> None:
        if received.endswith(close):
            readers.pop(1, None)

    protocol.on_bytes = on_bytes
    stream, _ = _stream(loop, readers, protocol)
    stream.data_received(ACK + close + NACK)
    assert confirms == [5]
    assert bytes(protocol.received) == close + NACK


def test_a_protocol_header_goes_to_pika_as_it_came(loop: asyncio.AbstractEventLoop) -> None:
    protocol = Pika()
    stream, _ = _stream(loop, {1: FrameReader()}, protocol)
    stream.data_received(b"AMQP\x00\x00\x09\x01")
    assert bytes(protocol.received) == b"AMQP\x00\x00\x09\x01"


def test_a_bad_frame_end_is_refused(loop: asyncio.AbstractEventLoop) -> None:
    stream, _ = _stream(loop, {1: FrameReader()}, Pika())
    with pytest.raises(pika.exceptions.InvalidFrameError):
        stream.data_received(ACK[:-1] + b"\x00")


@pytest.mark.parametrize("size", [1, 7, 10_000])
def test_a_reader_that_raises_drops_its_channels_frames_and_pika_reads_on(
    loop: asyncio.AbstractEventLoop, size: int
) -> None:
    """A reader whose handler raises at a delivery (here at its first confirm, then at a
    delivery whose content arrives in pieces): the failure is contained to its channel.
    Its owner is told once, what the reader would have handled from then on (the rest
    of that content, later confirms and deliveries) is dropped, not handed to pika, and
    every other frame reaches pika whole and in order."""
    failed: list[int] = []
    seen: list[str] = []

    def deliver(_m: Any, _p: Any, body: bytes) -> None:
        seen.append("deliver")
        raise ValueError("the consumer's bug")

    reader = FrameReader(on_deliver=deliver, on_confirm=lambda *a: seen.append("confirm"))
    reader.on_failure = lambda: failed.append(1)
    protocol = Pika()
    stream, _ = _stream(loop, {1: reader}, protocol)
    for chunk in _chunks(b"".join([ACK, DELIVER, OPEN_OK, DELIVER, NACK, OTHER_DELIVER]), size):
        stream.data_received(chunk)
    assert seen == ["confirm", "deliver"]  # nothing handled after the failure
    assert failed == [1]
    assert bytes(protocol.received) == OPEN_OK + OTHER_DELIVER
    assert stream.pending == b""


def test_a_failure_while_a_content_header_is_read_drops_that_content(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """A content header the reader cannot decode (a headers table with a field type
    pika does not know): its body frames are dropped too, not handed to pika."""
    failed: list[int] = []
    reader = FrameReader(on_deliver=lambda *a: None)
    reader.on_failure = lambda: failed.append(1)
    protocol = Pika()
    stream, _ = _stream(loop, {1: reader}, protocol)
    method = _method(1, spec.Basic.Deliver("ctag", 8, False, "ex", "rk"))
    header = bytearray(frame.Header(1, 3, PROPS).marshal())
    kind = header.index(b"\x01kS")  # the headers table's one entry: "k" -> "v"
    header[kind + 2] = ord("Z")  # a field type pika does not know
    body = bytes(frame.Body(1, b"abc").marshal())
    stream.data_received(method + bytes(header) + body + OPEN_OK)
    assert failed == [1]
    assert bytes(protocol.received) == OPEN_OK
