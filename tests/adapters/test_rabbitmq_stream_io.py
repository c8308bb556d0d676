"""The RabbitMQ connection's stream (``adapters/rabbitmq/_fast.py``) on a real socket pair,
without a broker: what reaches the wire and what pika's protocol is told.

- Frames written from the loop thread (``Stream.write``, asyncio's transport, which
  buffers what the socket does not take) and from other threads (``send_now`` under the
  write lock, leaving a tail the loop writes later) reach the peer whole, never
  interleaved, each writer's in its order, when the peer reads slowly (full buffers).
- The peer's end of stream (EOF) ends the connection at once, as pika's own transport
  does, even with bytes still waiting to be written: pika's ``connection_lost`` comes.
- Once the connection is lost, no thread writes to the socket again (asyncio closes it
  right after ``connection_lost``: its number may be reused by the next connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("pika")

from wsnmom.adapters.rabbitmq._fast import FrameIO, Stream

from tests.support.waiting import wait_until

_HEAD = struct.Struct(">BHI")
_SEQ = struct.Struct(">I")
HEARTBEAT = b"\x08\x00\x00\x00\x00\x00\x00\xce"


class Protocol:
    """pika's side of the stream: records the calls it gets (loop thread)."""

    def __init__(self) -> None:
        self.transport: Any = None
        self.lost: list[BaseException | None] = []
        self.eof = 0
        self.received = b""

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def connection_lost(self, error: BaseException | None) -> None:
        self.lost.append(error)

    def eof_received(self) -> bool:
        self.eof += 1
        return False  # as pika's BaseConnection: "close the transport"

    def data_received(self, data: bytes) -> None:
        self.received += data


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="stream-io-loop", daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def _on_loop(loop: asyncio.AbstractEventLoop, fn: Any, *args: Any) -> Any:
    """Run ``fn(*args)`` on the loop thread and return its result."""

    async def run() -> Any:
        return fn(*args)

    return asyncio.run_coroutine_threadsafe(run(), loop).result(10)


def _linked(
    loop: asyncio.AbstractEventLoop, *, sndbuf: int | None = None
) -> tuple[FrameIO, Stream, Protocol, socket.socket]:
    """A :class:`Stream` on one end of a socket pair (through ``FrameIO``, as pika links
    it) and the peer's end."""
    ours, peer = socket.socketpair()
    if sndbuf is not None:
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, sndbuf)
    io = FrameIO(loop, {})
    protocol = Protocol()
    done: list[Any] = []

    def create() -> None:
        io.create_streaming_connection(lambda: protocol, ours, done.append)

    loop.call_soon_threadsafe(create)
    [result] = wait_until(lambda: done, what="the stream linked")
    stream, linked_protocol = result
    assert isinstance(stream, Stream) and linked_protocol is protocol
    return io, stream, protocol, peer


def _frame(writer: int, seq: int, size: int) -> bytes:
    payload = _SEQ.pack(seq) + bytes((writer,)) * size
    return _HEAD.pack(3, writer, len(payload)) + payload + b"\xce"


def test_frames_from_the_loop_and_from_threads_never_interleave(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Four threads write like the publisher (``send_now`` when idle, else through the
    loop) while the loop writes frames of its own; the peer reads in small pieces, so
    sends are partial, tails and transport buffers form.  Every frame arrives whole,
    each writer's in order."""
    io, stream, _protocol, peer = _linked(loop, sndbuf=4096)
    threads_n, per_writer = 4, 150
    loop_writer = threads_n + 1
    sizes = [1, 700, 5000, 30_000]

    def via_loop(data: bytes, written: threading.Event | None = None) -> None:
        stream.write(data)
        if written is not None:
            written.set()

    sent_now = [0]

    def thread_writer(writer: int) -> None:
        for seq in range(per_writer):
            data = _frame(writer, seq, sizes[seq % len(sizes)])
            # every other frame waits a little for an idle stream, so that many go the
            # direct way (and leave tails) while the loop has buffers of its own
            patience = 200 if seq % 2 else 1
            written: threading.Event | None = None
            for attempt in range(patience):
                with io.write_lock:
                    if stream.idle():
                        assert stream.send_now(data)
                        sent_now[0] += 1
                        break
                    if attempt == patience - 1:
                        # still under the lock, as the publisher: the loop writes it
                        # after whatever waits now
                        written = threading.Event()
                        loop.call_soon_threadsafe(via_loop, data, written)
                        break
                time.sleep(0.0005)
            # like the publisher, which waits for the broker's confirm, a thread sends
            # its next frame once the loop wrote this one
            if written is not None:
                assert written.wait(30)

    def loop_frames() -> None:
        # the loop's own writes (pika's frames) come at any time, also between a
        # thread's partial send and the loop's flush of its tail
        for seq in range(per_writer):
            loop.call_soon_threadsafe(via_loop, _frame(loop_writer, seq, sizes[-seq % 4]))
            time.sleep(0.0003)

    expected = {w: per_writer for w in range(1, loop_writer + 1)}
    received: dict[int, int] = {w: 0 for w in expected}
    errors: list[str] = []

    def read_all() -> None:
        buf = bytearray()
        while received != expected and not errors:
            chunk = peer.recv(997)
            if not chunk:
                errors.append("EOF")
                return
            buf += chunk
            while len(buf) >= 7:
                kind, writer, length = _HEAD.unpack_from(buf)
                if len(buf) < 8 + length:
                    break
                frame, buf = bytes(buf[: 8 + length]), buf[8 + length :]
                seq = _SEQ.unpack_from(frame, 7)[0]
                body = frame[11:-1]
                if kind != 3 or frame[-1] != 0xCE or writer not in expected:
                    errors.append(f"bad frame head {frame[:11]!r}")
                    return
                if body != bytes((writer,)) * len(body):
                    errors.append(f"frame of writer {writer} #{seq} mixed with other bytes")
                    return
                if seq != received[writer]:
                    errors.append(f"writer {writer}: #{seq} after #{received[writer] - 1}")
                    return
                received[writer] += 1

    reader = threading.Thread(target=read_all, name="stream-io-peer")
    reader.start()
    writers = [threading.Thread(target=thread_writer, args=(w,)) for w in range(1, threads_n + 1)]
    writers.append(threading.Thread(target=loop_frames))
    for t in writers:
        t.start()
    for t in writers:
        t.join(60)
    reader.join(60)
    peer.close()
    assert not errors
    assert received == expected
    assert sent_now[0] >= threads_n  # the direct way was taken, not only the loop's


def test_the_peers_eof_ends_the_connection_with_bytes_still_to_write(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """pika's transport aborts on EOF when its protocol says "close"; a graceful close
    would wait for the unsent bytes, which a peer that stopped reading never takes, and
    pika would never hear of the loss (with heartbeats off, never at all)."""
    _io, stream, protocol, peer = _linked(loop, sndbuf=4096)
    block = b"\x00" * 65536

    def fill() -> int:
        stream.write(block)
        return stream.get_write_buffer_size()

    wait_until(lambda: _on_loop(loop, fill), what="bytes waiting in the transport")
    peer.shutdown(socket.SHUT_WR)  # the peer reads no more and says so
    try:
        wait_until(lambda: protocol.lost, timeout=5, what="pika's connection_lost")
        assert protocol.eof == 1
    finally:
        peer.close()


def test_no_thread_writes_to_the_socket_after_the_connection_is_lost(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """asyncio closes the socket right after ``connection_lost``; its descriptor number
    may then belong to the next connection.  The stream lets go of the socket under the
    write lock before that, so a thread that holds the lock sends on a live socket or not
    at all."""
    io, stream, protocol, peer = _linked(loop)
    sock = stream.sock
    assert sock is not None
    with io.write_lock:
        assert stream.idle()
        loop.call_soon_threadsafe(stream.abort)
        wait_until(lambda: stream.transport is not None and stream.transport.is_closing())
        # the loop now reaches connection_lost, which waits for this lock
        assert sock.fileno() != -1
    wait_until(lambda: protocol.lost, what="pika's connection_lost")
    assert stream.sock is None
    with io.write_lock:
        assert not stream.idle()
        assert not stream.send_now(HEARTBEAT)
    peer.close()


def test_an_attempt_pika_cancelled_is_not_linked(loop: asyncio.AbstractEventLoop) -> None:
    """pika cancels the stream's set-up when its timeout strikes; from then on neither
    its protocol nor ``on_done`` hears of that attempt, as with pika's own services,
    even when asyncio had the transport ready in the same loop iteration."""
    ours, peer = socket.socketpair()
    io = FrameIO(loop, {})
    protocol = Protocol()
    done: list[Any] = []
    ops: list[Any] = []

    def factory() -> Protocol:
        assert ops[0].cancel()  # the timeout strikes while asyncio builds the transport
        return protocol

    def create() -> None:
        ops.append(io.create_streaming_connection(factory, ours, done.append))

    loop.call_soon_threadsafe(create)
    wait_until(lambda: ops and ops[0].task.done(), what="the attempt ended")
    _on_loop(loop, lambda: None)  # a loop round trip after it: any report has come
    assert done == []
    assert protocol.transport is None and protocol.lost == []
    assert io.stream is None
    wait_until(lambda: peer.recv(1) == b"", what="the abandoned socket closed")
    peer.close()


def test_tls_without_a_server_hostname_links(
    loop: asyncio.AbstractEventLoop, tmp_path: Any
) -> None:
    """pika's I/O interface: ``server_hostname=None`` means no hostname check (the
    context decides), not an error.  A TLS peer on the other end of a socket pair."""
    trustme = pytest.importorskip("trustme")
    import ssl

    ca = trustme.CA()
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    client_ctx.check_hostname = False
    ours, peer = socket.socketpair()

    def serve() -> None:
        with server_ctx.wrap_socket(peer, server_side=True) as tls:
            tls.sendall(HEARTBEAT)
            with contextlib.suppress(OSError):
                tls.recv(1)

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    io = FrameIO(loop, {})
    io.connection = SimpleNamespace(bytes_received=0, frames_received=0)  # type: ignore[assignment]
    protocol = Protocol()
    done: list[Any] = []

    def create() -> None:
        io.create_streaming_connection(
            lambda: protocol, ours, done.append, ssl_context=client_ctx, server_hostname=None
        )

    loop.call_soon_threadsafe(create)
    [result] = wait_until(lambda: done, what="the TLS stream's set-up reported")
    assert not isinstance(result, BaseException), result
    stream, _ = result
    wait_until(lambda: protocol.received == HEARTBEAT, what="the peer's frame through TLS")
    _on_loop(loop, stream.abort)
    server.join(10)


def test_an_attempt_cancelled_before_it_started_closes_its_socket(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """pika hands the socket over with the call (it forgets it): cancelled at once, the
    attempt closes it."""
    ours, peer = socket.socketpair()
    io = FrameIO(loop, {})
    done: list[Any] = []

    def create() -> None:
        op = io.create_streaming_connection(Protocol, ours, done.append)
        assert op.cancel()
        assert not op.cancel()  # "False if already done or cancelled"

    loop.call_soon_threadsafe(create)
    wait_until(lambda: ours.fileno() == -1, what="the socket closed")
    assert peer.recv(1) == b""
    _on_loop(loop, lambda: None)
    assert done == []
    peer.close()
