"""The RabbitMQ adapter's AMQP connection: pika's ``AsyncioConnection`` with faster
reads and writes.

:class:`FastConnection` hands the frames of channels that read their own traffic (a
:class:`~._wire.FrameReader` per channel number) to those readers straight from the
socket's bytes, writes without pika's buffering round trip when nothing waits before the
data, and lets another thread write (``send_now``) under the connection's write lock.
This is where the adapter depends on pika's internals (``pyproject.toml`` pins pika for it).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import pika
import pika.exceptions
import pika.frame
from pika import spec
from pika.adapters.asyncio_connection import AsyncioConnection
from pika.adapters.utils.io_services_utils import (
    _AsyncPlaintextTransport as _PLAINTEXT_TRANSPORT,
)

from ._wire import CONTENT_FRAMES, READ_HEAD, FrameReader


class FastConnection(AsyncioConnection):  # type: ignore[misc]
    """An ``AsyncioConnection`` whose channels can read their traffic themselves
    (:attr:`readers`, by channel number); other frames go through pika."""

    #: bytes per socket read (pika reads 4 KiB at a time)
    RECV_BYTES = 131072

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.readers: dict[int, FrameReader] = {}
        #: held by every write of this connection, from the loop (pika's own writes,
        #: below) or from another thread (:meth:`send_now`); reentrant, as a writer
        #: holding it may end in pika's write path
        self.write_lock = threading.RLock()
        #: what a :meth:`send_now` left unsent: written before anything else
        self._tail = b""

    def _proto_connection_made(self, transport: Any) -> None:
        super()._proto_connection_made(transport)
        # the frames of a read are parsed by offset below, so larger reads cost nothing
        # extra and save event-loop round trips
        with contextlib.suppress(Exception):
            transport._MAX_RECV_BYTES = self.RECV_BYTES

    def _adapter_emit_data(self, data: bytes) -> None:
        """Write ``data`` (loop thread): after any tail a :meth:`send_now` left, straight
        to the socket when nothing is buffered before it.

        pika's plaintext transport buffers every write, turns the socket's writability
        watch on (an ``epoll_ctl``), sends from the next loop iteration and turns the watch
        off again (another one): three system calls and an extra iteration per publish.
        Here a non-blocking ``send`` goes first; what it does not take (a full socket
        buffer, or an error the transport will then report itself) is handed to the
        transport, behind nothing, so the byte order stays pika's.  TLS transports are
        left alone."""
        with self.write_lock:
            if self._tail:
                data, self._tail = self._tail + data, b""
            if self.idle():
                data = data[self._send_some(data) :]
                if not data:
                    return
            self._transport.write(data)

    def idle(self) -> bool:
        """Nothing waits to be written before new data (call with ``write_lock``)."""
        transport = self._transport
        return (
            not self._tail
            and type(transport) is _PLAINTEXT_TRANSPORT
            and transport._state == _PLAINTEXT_TRANSPORT._STATE_ACTIVE
            and not transport.get_write_buffer_size()
        )

    def _send_some(self, data: bytes) -> int:
        """One non-blocking ``send`` on the socket; the bytes it took (0 on any error:
        the transport's own send then meets it and handles it)."""
        try:
            return int(self._transport._sock.send(data))
        except OSError:  # BlockingIOError, InterruptedError, a reset connection, ...
            return 0

    def send_now(self, data: bytes) -> bool:
        """Write ``data`` from the calling thread, which holds ``write_lock``, when
        nothing waits before it; False (nothing written) otherwise.  What the socket does
        not take becomes the tail, which the loop writes before anything else.  Any
        thread: a publisher saves the loop wake-up per publish this way."""
        if not self.idle():
            return False
        sent = self._send_some(data)
        if sent < len(data):
            self._tail = data[sent:]
            with contextlib.suppress(RuntimeError):  # loop closed: the connection is gone
                self.ioloop.call_soon_threadsafe(self._flush_tail)
        return True

    def _flush_tail(self) -> None:
        """Loop thread: hand a :meth:`send_now` remainder to the transport."""
        with self.write_lock:
            if self._tail:
                tail, self._tail = self._tail, b""
                self._transport.write(tail)

    def _on_data_available(self, data_in: bytes) -> None:
        pending: bytes = self._frame_buffer  # type: ignore[has-type]
        buf = pending + data_in if pending else data_in
        if buf[:4] == b"AMQP":  # a protocol header (version mismatch): pika's business
            self._frame_buffer = b""
            super()._on_data_available(buf)
            return
        size = len(buf)
        offset = 0
        readers = self.readers
        head = READ_HEAD.unpack_from
        try:
            while size - offset >= 8:
                kind, channel, length = head(buf, offset)
                end = offset + 7 + length
                if end >= size:
                    break
                if buf[end] != 0xCE:
                    raise pika.exceptions.InvalidFrameError("Invalid FRAME_END marker")
                start = offset + 7
                offset = end + 1
                reader = readers.get(channel) if channel else None
                if reader is not None:
                    if kind == spec.FRAME_METHOD:
                        handled = reader.method(buf, start, end)
                    else:
                        handled = reader.reading_content and kind in CONTENT_FRAMES
                        if handled:
                            reader.content(kind, buf, start, end)
                    if handled:
                        self.frames_received += 1
                        self.bytes_received += offset - start + 7
                        continue
                consumed, frame_value = pika.frame.decode_frame(buf[start - 7 : offset])
                self.bytes_received += consumed
                if frame_value is not None:
                    self._process_frame(frame_value)
        finally:
            self._frame_buffer = buf[offset:]
