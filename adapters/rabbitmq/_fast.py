"""The RabbitMQ adapter's AMQP connection: pika's ``AsyncioConnection`` on I/O of the
adapter's own, through pika's documented ``custom_ioloop`` argument.

:class:`FastConnection` passes pika a :class:`FrameIO`, an implementation of pika's I/O
interface (``pika.adapters.utils.nbio_interface``: ``AbstractIOServices``, the stream
transport and protocol) on asyncio's own sockets and transports.  Its :class:`Stream`
sits between the socket and pika:

- reading, it hands the frames of channels that read their own traffic (a
  :class:`~._wire.FrameReader` per channel number, :attr:`FastConnection.readers`) to
  those readers straight from the received bytes, and every other frame to pika's protocol
  (``data_received``), in the order they came;
- an exception raised while a reader reads (its handler's bug, a message it cannot
  decode) is logged and contained to that channel: the reader drops what it would have
  handled from then on and its channel is closed (its consumer restarts, its unsettled
  messages go back to their queues), while the connection and its other channels go on;
- writing, asyncio's transport sends at once when nothing is buffered (pika's own
  transport buffered every write and sent it from the next loop iteration), and another
  thread may write (:meth:`FastConnection.send_now`) under the connection's write lock.

No name of pika's that starts with an underscore is used here (tests/adapters/
test_rabbitmq_pika_public.py checks the package).  The I/O interface is pika's interface
for connection adapters: ``AsyncioConnection`` documents accepting it as
``custom_ioloop``, while ``AbstractIOServices``' own docstring tells applications to use
their native loop instead ("not a public API").  Its methods are the same from pika 1.1
to 1.4.4 (type hints added); being abstract classes, a method pika adds fails the test
above at construction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import threading
from collections.abc import Callable
from typing import Any

import pika.connection
import pika.exceptions
from pika import spec
from pika.adapters.asyncio_connection import AsyncioConnection
from pika.adapters.utils import nbio_interface

from ._wire import CONTENT_FRAMES, READ_HEAD, FrameReader

log = logging.getLogger("wsnmom.adapters.rabbitmq")


class _Timer(nbio_interface.AbstractTimerReference):  # type: ignore[misc]
    """A pika timer reference over an asyncio timer handle."""

    def __init__(self, handle: asyncio.TimerHandle) -> None:
        self.handle: asyncio.TimerHandle | None = handle

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None


class _Operation(nbio_interface.AbstractIOReference):  # type: ignore[misc]
    """A pika I/O reference over an asyncio task: ``on_done(result or exception)``
    once it ends, unless cancelled first."""

    def __init__(self, task: asyncio.Future[Any], on_done: Callable[[Any], None]) -> None:
        self.task = task
        #: pika cancelled it (the task itself may still run a step before it ends)
        self.cancelled = False

        def done(task: asyncio.Future[Any]) -> None:
            if not task.cancelled() and not self.cancelled:
                on_done(task.exception() or task.result())

        task.add_done_callback(done)

    def cancel(self) -> bool:
        if self.cancelled or self.task.done():
            return False
        self.cancelled = True
        self.task.cancel()
        return True


class FrameIO(nbio_interface.AbstractIOServices):  # type: ignore[misc]
    """pika's I/O interface on an asyncio loop, with :class:`Stream` as the transport
    of the AMQP connection (one :class:`FrameIO` per :class:`FastConnection`)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, readers: dict[int, FrameReader]) -> None:
        self.loop = loop
        self.readers = readers
        #: the connection whose counters the readers' frames count into (set by it)
        self.connection: pika.connection.Connection | None = None
        #: the connection's stream once linked
        self.stream: Stream | None = None
        #: held by every write of the connection, from the loop or from another thread
        #: (:meth:`FastConnection.send_now`); reentrant, as a writer may end in pika
        self.write_lock = threading.RLock()

    def get_native_ioloop(self) -> asyncio.AbstractEventLoop:
        return self.loop

    def close(self) -> None:
        self.loop.close()

    def run(self) -> None:
        self.loop.run_forever()

    def stop(self) -> None:
        self.loop.stop()

    def add_callback_threadsafe(self, callback: Callable[[], None]) -> None:
        self.loop.call_soon_threadsafe(callback)

    def call_later(self, delay: float, callback: Callable[[], None]) -> _Timer:
        return _Timer(self.loop.call_later(delay, callback))

    def getaddrinfo(
        self,
        host: str,
        port: int,
        on_done: Callable[[Any], None],
        family: int = 0,
        socktype: int = 0,
        proto: int = 0,
        flags: int = 0,
    ) -> _Operation:
        lookup = self.loop.getaddrinfo(
            host, port, family=family, type=socktype, proto=proto, flags=flags
        )
        return _Operation(asyncio.ensure_future(lookup, loop=self.loop), on_done)

    def connect_socket(
        self, sock: socket.socket, resolved_addr: Any, on_done: Callable[[Any], None]
    ) -> _Operation:
        socket.inet_pton(sock.family, resolved_addr[0])  # ValueError/OSError: not an IP

        async def connect() -> None:
            await self.loop.sock_connect(sock, resolved_addr)

        return _Operation(asyncio.ensure_future(connect(), loop=self.loop), on_done)

    def create_streaming_connection(
        self,
        protocol_factory: Callable[[], nbio_interface.AbstractStreamProtocol],
        sock: socket.socket,
        on_done: Callable[[Any], None],
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
    ) -> _Operation:
        """Link pika's protocol to a :class:`Stream` on ``sock`` (TLS first when
        ``ssl_context``); ``on_done((stream, protocol))`` right after pika's
        ``connection_made``, as pika's own services do."""

        reported = False

        def report(result: Any) -> None:
            nonlocal reported
            if reported:
                return
            reported = True
            if isinstance(result, Stream):
                self.stream = result
                on_done((result, result.protocol))
                return
            with contextlib.suppress(OSError):
                sock.close()
            on_done(result)

        def make() -> Stream:
            stream = Stream(self, protocol_factory(), sock, ssl_context is None, report)
            stream.abandoned = lambda: operation.cancelled
            return stream

        async def connect() -> None:
            await self.loop.create_connection(
                make,
                sock=sock,
                ssl=ssl_context,
                # pika's None: no hostname check (the context decides); asyncio's is ""
                server_hostname=(server_hostname or "") if ssl_context is not None else None,
            )

        def ended(result: Any) -> None:
            if isinstance(result, BaseException):
                report(result)

        def dropped(task: asyncio.Future[Any]) -> None:
            if task.cancelled():  # pika leaves the socket to us once it called us
                with contextlib.suppress(OSError):
                    sock.close()

        operation = _Operation(asyncio.ensure_future(connect(), loop=self.loop), ended)
        operation.task.add_done_callback(dropped)
        return operation


class Stream(asyncio.Protocol, nbio_interface.AbstractStreamTransport):  # type: ignore[misc]
    """asyncio's protocol for the AMQP socket and pika's transport of it.

    Frames of channels with a :class:`~._wire.FrameReader` are parsed here by offset; all
    others go to pika's protocol in the order they came, whole (what is left of an
    incomplete frame waits here for the rest)."""

    def __init__(
        self,
        io: FrameIO,
        protocol: nbio_interface.AbstractStreamProtocol,
        sock: socket.socket,
        plaintext: bool,
        on_linked: Callable[[Stream | Exception], None],
    ) -> None:
        self.io = io
        self.protocol = protocol
        #: the socket itself, written by :meth:`send_now` (plaintext only)
        self.sock = sock if plaintext else None
        self.transport: asyncio.Transport | None = None
        self.on_linked = on_linked
        #: pika's protocol took the connection (its ``connection_made`` returned)
        self.linked = False
        #: received bytes of an incomplete frame
        self.pending = b""
        #: what a :meth:`send_now` left unsent: written before anything else
        self.tail = b""
        #: whether pika cancelled the set-up (then it hears nothing of this stream)
        self.abandoned: Callable[[], bool] = lambda: False

    # --- asyncio's side ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if self.abandoned():  # pika's timeout struck while asyncio built the transport
            transport.abort()
            return
        try:
            self.protocol.connection_made(self)
        except Exception as exc:
            transport.abort()
            self.on_linked(exc)
            return
        self.linked = True
        self.on_linked(self)

    def connection_lost(self, exc: Exception | None) -> None:
        # asyncio closes the socket right after this; its descriptor number may then be
        # the next connection's: let go of it under the write lock, so that a thread in
        # send_now sends on the live socket or not at all
        with self.io.write_lock:
            self.sock = None
            self.tail = b""
        if self.linked:
            self.linked = False
            self.protocol.connection_lost(exc)

    def eof_received(self) -> bool | None:
        """The peer's end of stream: when pika's protocol says "close" (it does), abort,
        as pika's own transport does; asyncio's graceful close would first wait for the
        unsent bytes, which a peer that stopped reading never takes."""
        keep_open = bool(self.protocol.eof_received())
        if not keep_open and self.transport is not None:
            self.transport.abort()
        return keep_open

    def data_received(self, data: bytes) -> None:
        """Hand each whole frame to its channel's reader, the others to pika: a run of
        them in one call, before the next frame a reader takes."""
        buf = self.pending + data if self.pending else data
        if buf[:4] == b"AMQP":  # a protocol header (version mismatch): pika's business
            self.pending = b""
            self.protocol.data_received(buf)
            return
        connection = self.io.connection
        assert connection is not None
        readers = self.io.readers
        head = READ_HEAD.unpack_from
        to_pika = self.protocol.data_received
        size = len(buf)
        offset = 0
        run = 0  # start of the frames for pika not handed over yet
        while size - offset >= 8:
            kind, channel, length = head(buf, offset)
            end = offset + 7 + length
            if end >= size:
                break
            if buf[end] != 0xCE:
                raise pika.exceptions.InvalidFrameError("Invalid FRAME_END marker")
            start = offset + 7
            frame_start, offset = offset, end + 1
            reader = readers.get(channel) if channel else None
            if reader is None:
                continue
            if run < frame_start:  # pika first: it may close this very channel
                chunk, run = buf[run:frame_start], frame_start
                to_pika(chunk)
                reader = readers.get(channel)
                if reader is None:
                    continue
            try:
                if kind == spec.FRAME_METHOD:
                    handled = reader.method(buf, start, end)
                else:
                    handled = reader.reading_content and kind in CONTENT_FRAMES
                    if handled:
                        reader.content(kind, buf, start, end)
            except Exception:
                # one channel's bug (a handler that raised, a message it cannot decode):
                # that channel is closed, the connection and its other channels go on
                log.exception(
                    "RabbitMQ: reading channel %d failed; the channel is closed, its "
                    "unsettled messages go back to their queues, the connection stays",
                    channel,
                )
                reader.fail()
                handled = True
            if handled:
                run = offset
                connection.frames_received += 1
                connection.bytes_received += offset - frame_start
        # (an exception above, a broken frame, ends the connection: asyncio's transport
        # aborts it)
        self.pending = buf[offset:]
        if run < offset:
            to_pika(buf[run:offset])

    # --- pika's side (nbio_interface.AbstractStreamTransport) --------------------------

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def get_protocol(self) -> nbio_interface.AbstractStreamProtocol:
        return self.protocol

    def write(self, data: bytes) -> None:
        """Write ``data`` (loop thread) after any tail a :meth:`send_now` left; asyncio's
        transport sends at once what the socket takes and buffers the rest."""
        if not data:
            raise ValueError("write() called with empty data")
        transport = self.transport
        assert transport is not None
        with self.io.write_lock:
            if self.tail:
                data, self.tail = self.tail + data, b""
            transport.write(data)

    def get_write_buffer_size(self) -> int:
        transport = self.transport
        return 0 if transport is None else transport.get_write_buffer_size()

    # --- writes from other threads -------------------------------------------------------

    def idle(self) -> bool:
        """Nothing waits to be written before new data, and :meth:`send_now` may write
        (plaintext; call with the write lock held)."""
        transport = self.transport
        return (
            self.sock is not None
            and not self.tail
            and transport is not None
            and not transport.is_closing()
            and not transport.get_write_buffer_size()
        )

    def send_now(self, data: bytes) -> bool:
        """Write ``data`` from the calling thread when :meth:`idle`; False (nothing
        written) otherwise.  What the socket does not take becomes the tail, which the
        loop writes before anything else."""
        sock = self.sock
        if sock is None or not self.idle():
            return False
        try:
            sent = sock.send(data)
        except OSError:  # a full buffer, a reset connection: the transport handles it
            sent = 0
        if sent < len(data):
            self.tail = data[sent:]
            with contextlib.suppress(RuntimeError):  # loop closed: the connection is gone
                self.io.loop.call_soon_threadsafe(self.flush_tail)
        return True

    def flush_tail(self) -> None:
        """Loop thread: hand a :meth:`send_now` remainder to asyncio's transport."""
        with self.io.write_lock:
            transport = self.transport
            if self.tail and transport is not None and not transport.is_closing():
                tail, self.tail = self.tail, b""
                transport.write(tail)


class FastConnection(AsyncioConnection):  # type: ignore[misc]
    """An ``AsyncioConnection`` on a :class:`FrameIO`: its channels can read their
    traffic themselves (:attr:`readers`, by channel number), and the adapter writes
    pre-encoded frames (:meth:`write_frames`, :meth:`send_now`)."""

    def __init__(
        self,
        parameters: pika.connection.Parameters,
        *,
        loop: asyncio.AbstractEventLoop,
        on_open_callback: Callable[[Any], None],
        on_open_error_callback: Callable[[Any, BaseException], None],
        on_close_callback: Callable[[Any, BaseException], None],
    ) -> None:
        self.readers: dict[int, FrameReader] = {}
        #: what :meth:`send_now` wrote (other threads, under the write lock)
        self.direct_bytes_sent = 0
        self.direct_frames_sent = 0
        self.frame_io = FrameIO(loop, self.readers)
        self.frame_io.connection = self
        super().__init__(
            parameters,
            on_open_callback=on_open_callback,
            on_open_error_callback=on_open_error_callback,
            on_close_callback=on_close_callback,
            custom_ioloop=self.frame_io,
        )

    @property
    def write_lock(self) -> threading.RLock:
        """Held by every write of this connection."""
        return self.frame_io.write_lock

    def idle(self) -> bool:
        """Nothing waits to be written before new data (call with :attr:`write_lock`)."""
        stream = self.frame_io.stream
        return stream is not None and stream.idle()

    def write_frames(self, data: bytes) -> None:
        """Write pre-encoded frames from the loop thread (counted as pika counts its
        own, on the same thread)."""
        stream = self.frame_io.stream
        if stream is None:
            raise pika.exceptions.ConnectionWrongStateError("not connected")
        self.bytes_sent += len(data)
        self.frames_sent += 1
        stream.write(data)

    def send_now(self, data: bytes) -> bool:
        """Write ``data`` from the calling thread, which holds :attr:`write_lock`, when
        nothing waits before it; False (nothing written) otherwise.  Any thread: a
        publisher saves the loop wake-up per publish this way.  Counted apart from pika's
        ``bytes_sent``/``frames_sent``, which only the loop thread updates (pika does so
        without a lock), under the write lock (:meth:`sent` adds both up)."""
        stream = self.frame_io.stream
        if stream is None or not stream.send_now(data):
            return False
        self.direct_bytes_sent += len(data)
        self.direct_frames_sent += 1
        return True

    def sent(self) -> tuple[int, int]:
        """(bytes, frames) written on this connection: pika's own, :meth:`write_frames`'
        and :meth:`send_now`'s (statistics; each count is exact, the pair is read without
        stopping the writers)."""
        with self.write_lock:
            direct = self.direct_bytes_sent, self.direct_frames_sent
        return self.bytes_sent + direct[0], self.frames_sent + direct[1]
