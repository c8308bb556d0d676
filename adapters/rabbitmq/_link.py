"""One AMQP connection driven by its own I/O thread, with reconnection.

pika connections are not thread-safe, so every :class:`Link` owns an asyncio event loop
running on a dedicated daemon thread and a :class:`pika.adapters.asyncio_connection.
AsyncioConnection` bound to that loop.  Nothing outside the loop thread touches pika
objects: other threads hand coroutines to :meth:`Link.submit` (which waits for the result)
or callables to :meth:`Link.call_soon` (fire and forget, used for acks).

A supervisor task connects, runs the owner's ``on_connected`` coroutine (re-declare
topology, resume consumers), waits for the connection to drop, tells the owner through
``on_disconnected`` and reconnects with exponential backoff until :meth:`Link.close`.

Declarations (queues, bindings, exchanges, purges, deletes) go through a small pool of
channels per connection, :meth:`Link.declaring`: each task holds one channel of it for its
sequence of RPCs, and up to ``declare_channels`` tasks declare at once.  The broker answers
one channel's methods one after another, so with a single shared channel a burst of new
subscriptions waited for each other's round trips (docs/performance.md, F26).

:class:`Channel` wraps a pika channel so that its synchronous AMQP methods can be awaited.
When the broker closes a channel (a failed passive declare, a precondition failure) every
RPC pending on it raises :class:`ChannelError` with the AMQP reply code.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import struct
import threading
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from typing import Any, TypeVar

try:
    import pika
    import pika.data
    import pika.exceptions
    import pika.frame
    from pika import spec
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError('the RabbitMQ adapter needs pika: pip install "wsnmom[rabbitmq]"') from exc

from pika.adapters.asyncio_connection import AsyncioConnection
from pika.adapters.utils.io_services_utils import (
    _AsyncPlaintextTransport as _PLAINTEXT_TRANSPORT,
)
from pika.channel import Channel as PikaChannel

from ._backlog import Backlog

log = logging.getLogger("wsnmom.adapters.rabbitmq")

T = TypeVar("T")

#: AMQP reply codes the adapter reacts to
NOT_FOUND = 404
PRECONDITION_FAILED = 406
RESOURCE_LOCKED = 405


class ChannelError(Exception):
    """The broker (or the connection) closed a channel while an operation was pending."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(f"{code} {text}")
        self.code = code
        self.text = text

    @classmethod
    def from_reason(cls, reason: BaseException | None) -> ChannelError:
        """Build from the reason pika gives for a channel closure."""
        if isinstance(reason, pika.exceptions.ChannelClosed):
            return cls(reason.reply_code, reason.reply_text)
        return cls(0, str(reason or "channel closed"))


def describe(exc: BaseException | None) -> str:
    """A readable one-line description (some pika errors have an empty ``str``)."""
    if exc is None:
        return "closed"
    return str(exc) or type(exc).__name__


# --- publishing without pika's per-message framing -----------------------------------
#
# ``basic_publish`` costs ~60 us of pure Python per message in pika (a Method, a Header and
# Body frame objects, BasicProperties.encode, encode_table value by value), on the one I/O
# thread every publish of the gateway goes through.  :class:`PublishFrames` writes the
# same bytes (AMQP 0-9-1, section 4.2.3: frame type, channel, size, payload, 0xCE) directly:
# the Basic.Publish method frame is memoised per (exchange, routing key, mandatory), and
# string headers -- all the gateway sets -- are packed without pika's per-value dispatch.
# tests/adapters/test_rabbitmq_perf_publish.py compares the bytes with pika's own.

_FRAME_END = b"\xce"
_FRAME_HEAD = struct.Struct(">BHI")
_U32 = struct.Struct(">I").pack
_U64 = struct.Struct(">Q").pack
#: content header: class 60 (basic), weight 0, body size, property flags
_CONTENT_HEAD = struct.Struct(">HHQH")
#: Basic.Publish: class 60, method 40, reserved ticket 0
_PUBLISH_HEAD = struct.pack(">HHH", 60, 40, 0)
_FLAG_CONTENT_TYPE = 1 << 15
_FLAG_HEADERS = 1 << 13
_FLAG_DELIVERY_MODE = 1 << 12
_FLAG_MESSAGE_ID = 1 << 7
_FLAG_TIMESTAMP = 1 << 6
_PERSISTENT = b"\x02"


#: Basic.Ack (class 60, method 80) / Basic.Nack (120): method frame of 13 payload bytes
_SETTLE = struct.Struct(">BHIHHQBB")


def settle_frame(channel_number: int, delivery_tag: int, ack: bool, requeue: bool) -> bytes:
    """A Basic.Ack, or a Basic.Nack with ``requeue``, for one delivery tag."""
    if ack:
        return _SETTLE.pack(1, channel_number, 13, 60, 80, delivery_tag, 0, 0xCE)
    return _SETTLE.pack(1, channel_number, 13, 60, 120, delivery_tag, 2 if requeue else 0, 0xCE)


def _shortstr(text: str) -> bytes:
    data = text.encode()
    if len(data) > 255:
        raise pika.exceptions.ShortStringTooLong(data)
    return bytes((len(data),)) + data


#: encoded table entries of string headers that repeat from message to message (topic,
#: dialect, producer reference, origin); cleared when full
_ENTRIES: dict[tuple[str, str], bytes] = {}
_ENTRIES_MAX = 4096
#: headers whose values are unique per message: not worth remembering
UNIQUE_HEADERS = frozenset({"wsnmom-message-id"})


def _entry(key: str, value: str) -> bytes:
    data = value.encode()
    return _shortstr(key) + b"S" + _U32(len(data)) + data


def encode_table(headers: Mapping[str, Any]) -> bytes:
    """An AMQP field table (with its length), byte for byte what pika writes: ``str``
    values as long strings (``S``), any other value through pika's encoder."""
    parts: list[bytes] = []
    entries = _ENTRIES
    for key, value in headers.items():
        if type(value) is str:
            if key in UNIQUE_HEADERS:
                parts.append(_entry(key, value))
                continue
            entry = entries.get((key, value))
            if entry is None:
                entry = _entry(key, value)
                if len(entries) >= _ENTRIES_MAX:
                    entries.clear()
                entries[(key, value)] = entry
            parts.append(entry)
        else:
            parts.append(_shortstr(key))
            pika.data.encode_value(parts, value)
    table = b"".join(parts)
    return _U32(len(table)) + table


class PublishFrames:
    """Encodes Basic.Publish + content header + body frames for one channel."""

    __slots__ = ("_body_max", "_channel", "_methods")

    def __init__(self, channel_number: int, frame_max: int) -> None:
        self._channel = channel_number
        self._body_max = frame_max - spec.FRAME_HEADER_SIZE - spec.FRAME_END_SIZE
        self._methods: dict[tuple[str, str, bool], bytes] = {}

    def _frame(self, kind: int, payload: bytes) -> bytes:
        return _FRAME_HEAD.pack(kind, self._channel, len(payload)) + payload + _FRAME_END

    def method(self, exchange: str, routing_key: str, mandatory: bool) -> bytes:
        """The Basic.Publish method frame (memoised)."""
        key = (exchange, routing_key, mandatory)
        frame = self._methods.get(key)
        if frame is None:
            payload = (
                _PUBLISH_HEAD
                + _shortstr(exchange)
                + _shortstr(routing_key)
                + (b"\x01" if mandatory else b"\x00")
            )
            frame = self._frame(spec.FRAME_METHOD, payload)
            if len(self._methods) >= 4096:
                self._methods.clear()
            self._methods[key] = frame
        return frame

    def message(
        self,
        out: list[bytes],
        method: bytes,
        body: bytes,
        *,
        content_type: str | None,
        table: bytes | None,
        persistent: bool,
        message_id: str | None,
        timestamp: int | None,
    ) -> None:
        """Append the frames of one message (``method`` from :meth:`method`, ``table``
        from :func:`encode_table`) to ``out``."""
        flags = 0
        props: list[bytes] = []
        if content_type is not None:
            flags |= _FLAG_CONTENT_TYPE
            props.append(_shortstr(content_type))
        if table is not None:
            flags |= _FLAG_HEADERS
            props.append(table)
        if persistent:
            flags |= _FLAG_DELIVERY_MODE
            props.append(_PERSISTENT)
        if message_id is not None:
            flags |= _FLAG_MESSAGE_ID
            props.append(_shortstr(message_id))
        if timestamp is not None:
            flags |= _FLAG_TIMESTAMP
            props.append(_U64(timestamp))
        size = len(body)
        out.append(method)
        out.append(
            self._frame(spec.FRAME_HEADER, _CONTENT_HEAD.pack(60, 0, size, flags) + b"".join(props))
        )
        step = self._body_max
        for start in range(0, size, step):
            out.append(self._frame(spec.FRAME_BODY, body[start : start + step]))


# --- reading without pika's per-frame dispatch ----------------------------------------
#
# pika turns every inbound frame into objects and runs it through its CallbackManager
# (~40 us per frame here); a publisher confirm, a returned message or a delivery takes
# two or three frames.  :class:`FastConnection` parses the frames of channels that have a
# :class:`FrameReader` itself -- Basic.Ack/Nack, Basic.Return and Basic.Deliver with their
# content -- and hands everything else (RPC replies, channel and connection control,
# heartbeats) to pika one frame at a time, exactly as pika would have read it.

_HEAD = struct.Struct(">BHI")
_CLASS_METHOD = struct.Struct(">HH")
_CONFIRM = struct.Struct(">QB")
_CONTENT = struct.Struct(">HHQH")
_BYTE = struct.Struct(">B")
_SHORT = struct.Struct(">H")
_LONG = struct.Struct(">I")
_LONGLONG = struct.Struct(">Q")
_BASIC = 60
_BASIC_RETURN = 50
_BASIC_DELIVER = 60
_BASIC_GET_OK = 71
_BASIC_GET_EMPTY = 72
_BASIC_ACK = 80
_BASIC_NACK = 120
_CONTENT_FRAMES = (spec.FRAME_HEADER, spec.FRAME_BODY)


def _read_shortstr(data: bytes, offset: int) -> tuple[str, int]:
    length = data[offset]
    offset += 1
    return data[offset : offset + length].decode("utf-8", "replace"), offset + length


class Properties:
    """The basic properties of a message read by a :class:`FrameReader` (the attributes
    of ``pika.BasicProperties`` the adapter uses, same names and types)."""

    __slots__ = (
        "app_id",
        "cluster_id",
        "content_encoding",
        "content_type",
        "correlation_id",
        "delivery_mode",
        "expiration",
        "headers",
        "message_id",
        "priority",
        "reply_to",
        "timestamp",
        "type",
        "user_id",
    )

    def __init__(self, data: bytes, offset: int, flags: int, tables: bool) -> None:
        """Decode the property list at ``data[offset:]``; the headers table only when
        ``tables`` (else ``headers`` is None)."""
        rs = _read_shortstr
        self.content_type = self.content_encoding = None
        self.headers: dict[str, Any] | None = None
        self.delivery_mode = self.priority = None
        self.correlation_id = self.reply_to = self.expiration = self.message_id = None
        self.timestamp = None
        self.type = self.user_id = self.app_id = self.cluster_id = None
        if flags & 0x8000:
            self.content_type, offset = rs(data, offset)
        if flags & 0x4000:
            self.content_encoding, offset = rs(data, offset)
        if flags & 0x2000:
            if tables:
                self.headers, offset = pika.data.decode_table(data, offset)
            else:
                offset += 4 + _LONG.unpack_from(data, offset)[0]
        if flags & 0x1000:
            self.delivery_mode = data[offset]
            offset += 1
        if flags & 0x0800:
            self.priority = data[offset]
            offset += 1
        if flags & 0x0400:
            self.correlation_id, offset = rs(data, offset)
        if flags & 0x0200:
            self.reply_to, offset = rs(data, offset)
        if flags & 0x0100:
            self.expiration, offset = rs(data, offset)
        if flags & 0x0080:
            self.message_id, offset = rs(data, offset)
        if flags & 0x0040:
            self.timestamp = _LONGLONG.unpack_from(data, offset)[0]
            offset += 8
        if flags & 0x0020:
            self.type, offset = rs(data, offset)
        if flags & 0x0010:
            self.user_id, offset = rs(data, offset)
        if flags & 0x0008:
            self.app_id, offset = rs(data, offset)
        if flags & 0x0004:
            self.cluster_id, _ = rs(data, offset)


class Delivered:
    """Basic.Deliver / Basic.Return / Basic.GetOk fields of a message read by a
    :class:`FrameReader` (the attribute names of pika's method objects)."""

    __slots__ = (
        "consumer_tag",
        "delivery_tag",
        "exchange",
        "message_count",
        "redelivered",
        "reply_code",
        "reply_text",
        "routing_key",
    )

    def __init__(self) -> None:
        self.message_count = 0
        self.consumer_tag = ""
        self.delivery_tag = 0
        self.redelivered = False
        self.reply_code = 0
        self.reply_text = ""
        self.exchange = ""
        self.routing_key = ""


#: on_confirm(delivery_tag, multiple, nack)
ConfirmHandler = Callable[[int, bool, bool], None]
#: on_message(method, properties, body) for Basic.Deliver and Basic.Return
MessageHandler = Callable[[Delivered, Properties, bytes], None]
#: on_get(method, properties, body) for Basic.GetOk; (None, None, b"") for Basic.GetEmpty
GetHandler = Callable[[Delivered | None, Properties | None, bytes], None]


class FrameReader:
    """What one channel reads itself (see :class:`FastConnection`): publisher confirms
    (``on_confirm``), returned messages (``on_return``; their headers table is skipped,
    not decoded), deliveries to its consumer (``on_deliver``) and ``basic.get`` replies
    (``on_get``)."""

    __slots__ = (
        "_body",
        "_handler",
        "_method",
        "_props",
        "_size",
        "on_confirm",
        "on_deliver",
        "on_get",
        "on_return",
    )

    def __init__(
        self,
        *,
        on_confirm: ConfirmHandler | None = None,
        on_return: MessageHandler | None = None,
        on_deliver: MessageHandler | None = None,
        on_get: GetHandler | None = None,
    ) -> None:
        self.on_confirm = on_confirm
        self.on_return = on_return
        self.on_deliver = on_deliver
        self.on_get = on_get
        #: the content being read: its method, handler, properties, body parts, size
        self._method: Delivered | None = None
        self._handler: MessageHandler | None = None
        self._props: Properties | None = None
        self._body: list[bytes] = []
        self._size = 0

    @property
    def reading_content(self) -> bool:
        """True between a handled Basic.Return/Deliver and the end of its body."""
        return self._method is not None

    def method(self, data: bytes, start: int, end: int) -> bool:
        """A method frame's payload ``data[start:end]``: True when handled here."""
        class_id, method_id = _CLASS_METHOD.unpack_from(data, start)
        if class_id != _BASIC:
            return False
        offset = start + 4
        if method_id in (_BASIC_ACK, _BASIC_NACK):
            if self.on_confirm is None:
                return False
            tag, bits = _CONFIRM.unpack_from(data, offset)
            self.on_confirm(tag, bool(bits & 1), method_id == _BASIC_NACK)
            return True
        if method_id == _BASIC_DELIVER:
            if self.on_deliver is None:
                return False
            m = Delivered()
            m.consumer_tag, offset = _read_shortstr(data, offset)
            m.delivery_tag, bits = _CONFIRM.unpack_from(data, offset)
            m.redelivered = bool(bits & 1)
            m.exchange, offset = _read_shortstr(data, offset + 9)
            m.routing_key, _ = _read_shortstr(data, offset)
            self._method, self._handler = m, self.on_deliver
            return True
        if method_id in (_BASIC_GET_OK, _BASIC_GET_EMPTY):
            if self.on_get is None:
                return False
            if method_id == _BASIC_GET_EMPTY:
                self.on_get(None, None, b"")
                return True
            m = Delivered()
            m.delivery_tag, bits = _CONFIRM.unpack_from(data, offset)
            m.redelivered = bool(bits & 1)
            m.exchange, offset = _read_shortstr(data, offset + 9)
            m.routing_key, offset = _read_shortstr(data, offset)
            m.message_count = _LONG.unpack_from(data, offset)[0]
            self._method, self._handler = m, self.on_get
            return True
        if method_id == _BASIC_RETURN:
            if self.on_return is None:
                return False
            m = Delivered()
            m.reply_code = _SHORT.unpack_from(data, offset)[0]
            m.reply_text, offset = _read_shortstr(data, offset + 2)
            m.exchange, offset = _read_shortstr(data, offset)
            m.routing_key, _ = _read_shortstr(data, offset)
            self._method, self._handler = m, self.on_return
            return True
        return False

    def content(self, kind: int, data: bytes, start: int, end: int) -> None:
        """A header or body frame of the content being read."""
        if kind == spec.FRAME_HEADER:
            _cls, _weight, size, flags = _CONTENT.unpack_from(data, start)
            tables = self._handler is not self.on_return
            self._props = Properties(data, start + 14, flags, tables)
            self._size = size
            self._body = []
            if size == 0:
                self._finish(b"")
            return
        self._body.append(data[start:end])
        self._size -= end - start
        if self._size <= 0:
            body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
            self._finish(body)

    def _finish(self, body: bytes) -> None:
        method, handler, props = self._method, self._handler, self._props
        self._method = self._handler = self._props = None
        self._body = []
        assert method is not None and handler is not None and props is not None
        handler(method, props, body)


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
        head = _HEAD.unpack_from
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
                        handled = reader.reading_content and kind in _CONTENT_FRAMES
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


#: seconds the loop keeps collecting acks from other threads after a flush that wrote
#: several, before writing them (see :meth:`Link.settle`)
SETTLE_LINGER = 0.002


class LinkDown(Exception):
    """The link has no open connection (within the time allowed)."""


#: what a basic.get request gets back: the message, None (empty) or the channel's error
GetReply = tuple[Any, Any, bytes] | None | BaseException
#: Basic.Get: class 60, method 70, reserved ticket 0
_GET_HEAD = struct.pack(">HHH", 60, 70, 0)


class LinkBusy(TimeoutError):
    """An operation timed out while its connection stayed up: overload, not an outage."""

    def __init__(self, message: str, *, retry_after: float, waiting: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.waiting = waiting


class Channel:
    """A pika channel whose RPCs are awaitable.  Use only on the link's loop thread."""

    def __init__(self, link: Link, channel: PikaChannel) -> None:
        self.link = link
        self.pika = channel
        self.close_reason: BaseException | None = None
        self._pending: set[asyncio.Future[Any]] = set()
        self._get_waiter: asyncio.Future[Any] | None = None
        self._close_listeners: list[Callable[[Channel, BaseException], None]] = []
        self._reader: FrameReader | None = None
        #: basic.get requests awaiting their reply, oldest first (replies come in order)
        self._getters: deque[Callable[[GetReply], None]] = deque()
        #: encoded basic.get frames per (queue, no_ack)
        self._get_frames: dict[tuple[str, bool], bytes] | None = None
        channel.add_on_close_callback(self._on_close)
        channel.add_callback(self._on_get_empty, [spec.Basic.GetEmpty], one_shot=False)

    @property
    def is_open(self) -> bool:
        """True while the channel can be used."""
        return self.close_reason is None and self.pika.is_open

    def add_close_listener(self, listener: Callable[[Channel, BaseException], None]) -> None:
        """Call ``listener(channel, reason)`` on the loop thread when the channel closes."""
        self._close_listeners.append(listener)

    def read(self, reader: FrameReader) -> None:
        """Let ``reader`` read this channel's confirms, returns and deliveries
        (:class:`FastConnection`) until the channel closes."""
        readers = getattr(self.pika.connection, "readers", None)
        if readers is None:
            raise TypeError("not a FastConnection")
        readers[self.pika.channel_number] = reader
        self._reader = reader

    def _on_close(self, _channel: PikaChannel, reason: BaseException) -> None:
        self.close_reason = reason
        reader, self._reader = self._reader, None
        readers = getattr(self.pika.connection, "readers", None)
        number = self.pika.channel_number
        if reader is not None and readers is not None and readers.get(number) is reader:
            del readers[number]
        error = ChannelError.from_reason(reason)
        for fut in list(self._pending):
            if not fut.done():
                fut.set_exception(error)
        self._pending.clear()
        getters, self._getters = self._getters, deque()
        for reply in getters:
            try:
                reply(error)
            except Exception:  # pragma: no cover - defensive
                log.exception("basic.get reply handler failed")
        for listener in self._close_listeners:
            try:
                listener(self, reason)
            except Exception:  # pragma: no cover - defensive
                log.exception("channel close listener failed")

    def _future(self) -> asyncio.Future[Any]:
        if not self.is_open:
            raise ChannelError.from_reason(self.close_reason)
        fut: asyncio.Future[Any] = self.link.loop.create_future()
        self._pending.add(fut)
        fut.add_done_callback(self._pending.discard)
        return fut

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``channel.<method>(..., callback=...)`` and await the reply frame."""
        fut = self._future()

        def done(result: Any) -> None:
            if not fut.done():
                fut.set_result(result)

        getattr(self.pika, method)(*args, callback=done, **kwargs)
        return await fut

    @property
    def fast_get(self) -> bool:
        """True once :meth:`start_fast_get` ran."""
        return self._get_frames is not None

    def start_fast_get(self) -> None:
        """Send ``basic.get`` frames directly and read the replies with a
        :class:`FrameReader` (no pika frame objects); several requests may be in flight."""
        self.read(FrameReader(on_get=self._on_get_reply))
        self._get_frames = {}

    def request_get(
        self, queue: str, reply: Callable[[GetReply], None], *, no_ack: bool = False
    ) -> None:
        """Send ``basic.get`` for ``queue`` (manual ack, or removed on delivery with
        ``no_ack``); ``reply`` gets (method, properties, body), None when the queue was
        empty, or the ChannelError that closed the channel.  Loop thread, after
        :meth:`start_fast_get`."""
        frames = self._get_frames
        assert frames is not None
        if not self.is_open:
            reply(ChannelError.from_reason(self.close_reason))
            return
        key = (queue, no_ack)
        frame = frames.get(key)
        if frame is None:
            payload = _GET_HEAD + _shortstr(queue) + (b"\x01" if no_ack else b"\x00")
            frame = _FRAME_HEAD.pack(1, self.pika.channel_number, len(payload)) + payload
            frame = frames[key] = frame + _FRAME_END
        self._getters.append(reply)
        self.write(frame)

    def _on_get_reply(self, method: Delivered | None, properties: Any, body: bytes) -> None:
        if not self._getters:  # pragma: no cover - a reply nobody asked for
            log.warning("unexpected basic.get reply on channel %s", self.pika.channel_number)
            return
        reply = self._getters.popleft()
        reply(None if method is None else (method, properties, body))

    async def get(self, queue: str) -> tuple[Any, Any, bytes] | None:
        """``basic.get`` with manual ack: (method, properties, body) or None when empty."""
        if self._get_frames is not None:
            waiter = self._future()

            def reply(result: GetReply) -> None:
                if waiter.done():
                    return
                if isinstance(result, BaseException):
                    waiter.set_exception(result)
                else:
                    waiter.set_result(result)

            self.request_get(queue, reply)
            message: tuple[Any, Any, bytes] | None = await waiter
            return message
        fut = self._future()
        self._get_waiter = fut

        def got(_ch: PikaChannel, method: Any, properties: Any, body: bytes) -> None:
            if not fut.done():
                fut.set_result((method, properties, body))

        self.pika.basic_get(queue, got, auto_ack=False)
        try:
            result: tuple[Any, Any, bytes] | None = await fut
        finally:
            self._get_waiter = None
        return result

    def frames(self) -> PublishFrames:
        """A :class:`PublishFrames` for this channel (sized to the connection's frame_max)."""
        conn = self.pika.connection
        return PublishFrames(self.pika.channel_number, int(conn.params.frame_max))

    def write(self, data: bytes) -> None:
        """Send pre-encoded frames (:class:`PublishFrames`) on this channel's connection."""
        if not self.is_open:
            raise ChannelError.from_reason(self.close_reason)
        # the same call pika's own _send_message ends in (it also keeps the byte count)
        self.pika.connection._output_marshaled_frames([data])

    @property
    def write_lock(self) -> contextlib.AbstractContextManager[Any]:
        """The connection's write lock (see :class:`FastConnection`)."""
        lock = getattr(self.pika.connection, "write_lock", None)
        return lock if lock is not None else contextlib.nullcontext()

    def can_send_now(self) -> bool:
        """Whether :meth:`send_now` would write (call with :attr:`write_lock` held)."""
        conn = self.pika.connection
        return self.is_open and isinstance(conn, FastConnection) and conn.idle()

    def send_now(self, data: bytes) -> None:
        """Write pre-encoded frames from the calling thread (any thread), right after
        :meth:`can_send_now` said yes, :attr:`write_lock` held all along."""
        conn = self.pika.connection
        sent = conn.send_now(data)
        assert sent, "send_now without can_send_now under the same write lock"
        conn.bytes_sent += len(data)
        conn.frames_sent += 1

    def _on_get_empty(self, _frame: Any) -> None:
        waiter = self._get_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def close(self) -> None:
        """Close the channel (unacked deliveries go back to their queues; acks already
        given are written first)."""
        if not self.is_open:
            return
        self.link.flush_settles()
        fut: asyncio.Future[None] = self.link.loop.create_future()

        def closed(_channel: Channel, _reason: BaseException) -> None:
            if not fut.done():
                fut.set_result(None)

        self.add_close_listener(closed)
        with contextlib.suppress(Exception):
            self.pika.close()
            await asyncio.wait_for(fut, 5.0)


class Declarer:
    """One of a connection's declaration channels, held by one task at a time
    (:meth:`Link.declaring`).  A failure the broker answers by closing the channel (a
    failed passive declare, a precondition) reaches only the task holding it; its next
    :meth:`call` opens a fresh channel."""

    __slots__ = ("_link", "channel_in_use")

    def __init__(self, link: Link, channel: Channel | None) -> None:
        self._link = link
        #: the channel this task uses (None until the first call)
        self.channel_in_use = channel

    async def channel(self) -> Channel:
        """The held channel, reopened when the broker closed it."""
        ch = self.channel_in_use
        if ch is None or not ch.is_open:
            ch = self.channel_in_use = await self._link.open_channel()
        return ch

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """:meth:`Channel.call` on the held channel."""
        return await (await self.channel()).call(method, *args, **kwargs)


class Link:
    """An AMQP connection with its own I/O thread and automatic reconnection."""

    def __init__(
        self,
        name: str,
        parameters: pika.connection.Parameters,
        on_connected: Callable[[Link], Awaitable[None]],
        on_disconnected: Callable[[Link, BaseException | None], None],
        *,
        min_delay: float = 0.2,
        max_delay: float = 5.0,
        connect_timeout: float = 10.0,
        declare_channels: int = 1,
    ) -> None:
        self.name = name
        self.parameters = parameters
        self._on_connected = on_connected
        self._on_disconnected = on_disconnected
        self.min_delay = min_delay
        self.max_delay = max_delay
        self.connect_timeout = connect_timeout
        self.loop = asyncio.new_event_loop()
        self.connection: FastConnection | None = None
        #: increments on every successful connection
        self.generation = 0
        #: last connection error, for messages
        self.last_error: BaseException | None = None
        #: connection attempts are failing (logged once per outage)
        self._failing = False
        #: declaration channels used at once (:meth:`declaring`)
        self.declare_channels = max(1, declare_channels)
        self._declare_slots: asyncio.Semaphore | None = None
        #: open declaration channels no task holds (of the current connection)
        self._declare_idle: list[Channel] = []
        self._declaring = 0
        #: most declaration channels held at once since the link started
        self.declare_peak = 0
        self._up = threading.Event()
        self._up_async: asyncio.Event | None = None
        self._stop: asyncio.Event | None = None
        self._lost: asyncio.Future[BaseException | None] | None = None
        self._closing = False
        self._connecting: FastConnection | None = None
        self._first_attempt = threading.Event()
        #: acks/nacks from other threads, written by the loop in one go (see settle)
        self._settles: list[tuple[Channel, int, bool, bool]] = []
        self._settle_lock = threading.Lock()
        #: a flush of _settles is scheduled (a wake-up asked for, or the linger timer)
        self._settle_armed = False
        #: settlements from other threads, loop wake-ups they asked for, and flushes
        #: that wrote some (counters for tests and the close log line)
        self.settles_queued = 0
        self.settle_wakeups = 0
        self.settle_flushes = 0
        #: operations other threads wait for on this connection (overload estimates)
        self.backlog = Backlog()
        self._thread = threading.Thread(target=self._run, name=f"wsnmom-amqp-{name}", daemon=True)

    # --- lifecycle ------------------------------------------------------------------

    def start(self, wait: float) -> bool:
        """Start the I/O thread; wait up to ``wait`` s for the first connection."""
        self._thread.start()
        self._first_attempt.wait(wait)
        return self._up.is_set()

    def close(self, timeout: float = 10.0) -> None:
        """Close the connection and stop the thread; idempotent."""
        if not self._thread.is_alive():
            return
        self._closing = True
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self._request_stop)
        self._thread.join(timeout)

    @property
    def is_up(self) -> bool:
        """True while connected and the owner's topology is in place."""
        return self._up.is_set()

    @property
    def on_loop_thread(self) -> bool:
        """True when called from this link's I/O thread."""
        return threading.current_thread() is self._thread

    def _request_stop(self) -> None:
        if self._stop is not None:
            self._stop.set()
        self.flush_settles()
        if self.settles_queued:
            log.debug(
                "%s: %d acks/nacks from other threads, %d loop wake-ups asked, %d writes",
                self.name,
                self.settles_queued,
                self.settle_wakeups,
                self.settle_flushes,
            )
        for conn in (self.connection, self._connecting):
            if conn is not None and not conn.is_closed and not conn.is_closing:
                with contextlib.suppress(Exception):
                    conn.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._supervise())
        finally:
            with contextlib.suppress(Exception):
                pending = asyncio.all_tasks(self.loop)
                for task in pending:
                    task.cancel()
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.close()

    async def _supervise(self) -> None:
        self._stop = asyncio.Event()
        self._up_async = asyncio.Event()
        self._declare_slots = asyncio.Semaphore(self.declare_channels)
        delay = self.min_delay
        while not self._closing:
            try:
                conn = await self._connect()
            except Exception as exc:
                # one line per outage, not one per attempt
                level = logging.DEBUG if self._failing else logging.WARNING
                self._failing = True
                self.last_error = exc
                log.log(
                    level, "%s: cannot connect to RabbitMQ (retrying): %s", self.name, describe(exc)
                )
                self._first_attempt.set()
                await self._pause(delay)
                delay = min(delay * 2, self.max_delay)
                continue
            self.connection = conn
            self.generation += 1
            self._declare_idle = []
            self._lost = self.loop.create_future()
            try:
                await asyncio.wait_for(self._on_connected(self), self.connect_timeout * 3)
            except Exception as exc:
                self.last_error = exc
                log.warning("%s: setting up after connect failed: %s", self.name, describe(exc))
                with contextlib.suppress(Exception):
                    conn.close()
            else:
                if conn.is_open:
                    self._up.set()
                    self._up_async.set()
                    delay = self.min_delay
                    if self.generation > 1 or self._failing:
                        log.info("%s: connected to RabbitMQ again", self.name)
                    self._failing = False
            self._first_attempt.set()
            reason = await self._lost
            self._up.clear()
            self._up_async.clear()
            self.connection = None
            self._declare_idle = []
            self.last_error = reason
            try:
                self._on_disconnected(self, reason)
            except Exception:  # pragma: no cover - defensive
                log.exception("%s: disconnect handler failed", self.name)
            if not self._closing:
                log.warning("%s: connection to RabbitMQ lost: %s", self.name, describe(reason))
                await self._pause(delay)
                delay = min(delay * 2, self.max_delay)
        self._first_attempt.set()

    async def _pause(self, delay: float) -> None:
        assert self._stop is not None
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stop.wait(), delay)

    async def _connect(self) -> FastConnection:
        fut: asyncio.Future[FastConnection] = self.loop.create_future()

        def opened(conn: Any) -> None:
            if not fut.done():
                fut.set_result(conn)

        def failed(_conn: Any, exc: BaseException) -> None:
            if not fut.done():
                fut.set_exception(exc if isinstance(exc, Exception) else ConnectionError(str(exc)))

        def closed(_conn: Any, reason: BaseException) -> None:
            lost = self._lost
            if lost is not None and not lost.done():
                lost.set_result(reason)

        conn = FastConnection(
            self.parameters,
            on_open_callback=opened,
            on_open_error_callback=failed,
            on_close_callback=closed,
            custom_ioloop=self.loop,
        )
        self._connecting = conn
        try:
            return await asyncio.wait_for(fut, self.connect_timeout)
        except BaseException:
            with contextlib.suppress(Exception):
                conn.close()
            raise
        finally:
            self._connecting = None

    # --- use from the loop thread -----------------------------------------------------

    async def ready(self, timeout: float) -> None:
        """Wait until connected (and set up); LinkDown after ``timeout`` seconds."""
        assert self._up_async is not None
        if self._up_async.is_set():
            return
        try:
            await asyncio.wait_for(self._up_async.wait(), timeout)
        except TimeoutError:
            raise LinkDown(f"not connected to RabbitMQ: {describe(self.last_error)}") from None

    async def open_channel(self) -> Channel:
        """Open a new channel on the current connection."""
        conn = self.connection
        if conn is None or not conn.is_open:
            raise LinkDown("not connected to RabbitMQ")
        fut: asyncio.Future[PikaChannel] = self.loop.create_future()

        def opened(ch: PikaChannel) -> None:
            if not fut.done():
                fut.set_result(ch)

        conn.channel(on_open_callback=opened)
        return Channel(self, await asyncio.wait_for(fut, self.connect_timeout))

    @contextlib.asynccontextmanager
    async def declaring(self) -> AsyncIterator[Declarer]:
        """Hold one declaration channel for a sequence of RPCs (at most
        ``declare_channels`` tasks at once; the others wait for a channel).  Do not
        enter it again while holding one: with every channel held that would wait
        forever."""
        slots = self._declare_slots
        assert slots is not None, "declaring() before the link started"
        async with slots:
            conn = self.connection
            idle = self._declare_idle
            channel: Channel | None = None
            while idle and channel is None:
                ch = idle.pop()
                if ch.is_open and ch.pika.connection is conn:
                    channel = ch
            declarer = Declarer(self, channel)
            self._declaring += 1
            self.declare_peak = max(self.declare_peak, self._declaring)
            try:
                yield declarer
            finally:
                self._declaring -= 1
                held = declarer.channel_in_use
                if held is not None and held.is_open and held.pika.connection is self.connection:
                    self._declare_idle.append(held)

    # --- use from other threads -------------------------------------------------------

    def submit(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run ``coro`` on the loop thread and wait up to ``timeout`` s for its result."""
        if self.on_loop_thread:
            coro.close()
            raise RuntimeError("blocking adapter call from the adapter's own I/O thread")
        if self.loop.is_closed() or not self._thread.is_alive():
            coro.close()
            raise LinkDown("adapter is closed")
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        backlog = self.backlog
        backlog.begin()
        completed = False
        try:
            result = fut.result(timeout)
            completed = True
            return result
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise self.timed_out(timeout) from None
        finally:
            backlog.end(completed=completed)

    def timed_out(self, timeout: float) -> TimeoutError:
        """The error for an operation not answered within ``timeout`` s: ``LinkBusy``
        while the connection is up (the broker or this I/O thread is slow), a plain
        ``TimeoutError`` otherwise.  Call it before the operation leaves the backlog."""
        text = f"RabbitMQ did not answer within {timeout:.1f}s"
        if not self.is_up:
            return TimeoutError(text)
        waiting = self.backlog.waiting
        return LinkBusy(
            f"{text} ({waiting} operation(s) waiting on connection {self.name})",
            retry_after=self.backlog.retry_after(timeout),
            waiting=waiting,
        )

    def settle(self, channel: Channel, delivery_tag: int, ack: bool, requeue: bool) -> None:
        """Ack (or nack) a delivery of ``channel``, from any thread.

        Settlements from other threads are collected and written by the loop in one
        socket write per flush, instead of one loop wake-up (a write to the loop's
        self-pipe, which also gives the GIL away) and one pika frame object per message.
        A settlement with no flush scheduled wakes the loop, which writes it at once.
        When a flush wrote more than one, settlements were coming faster than the loop
        was woken for them: the loop then keeps a timer of ``SETTLE_LINGER`` instead, and
        the settlements made meanwhile ask for no wake-up; they are written together when
        it fires (re-armed while each flush still writes several).  So a lone ack is
        written at once, and a stream of them costs the loop one wake-up per
        ``SETTLE_LINGER`` rather than one each.  Pending settlements of a channel are
        written before it is closed (:meth:`flush_settles`).
        """
        if self.on_loop_thread:
            self._settle_now([(channel, delivery_tag, ack, requeue)])
            return
        with self._settle_lock:
            self._settles.append((channel, delivery_tag, ack, requeue))
            self.settles_queued += 1
            if self._settle_armed:
                return  # a flush is already scheduled
            self._settle_armed = True
            self.settle_wakeups += 1
        try:
            self.loop.call_soon_threadsafe(self._flush_settles)
        except RuntimeError:  # the loop is closed: the connection is gone
            with self._settle_lock:
                self._settle_armed = False

    def _flush_settles(self) -> None:
        """Loop thread: write what was settled; linger when it was several."""
        with self._settle_lock:
            items, self._settles = self._settles, []
            linger = len(items) > 1 and not self._closing
            self._settle_armed = linger
        if items:
            self.settle_flushes += 1
            self._settle_now(items)
        if linger:
            self.loop.call_later(SETTLE_LINGER, self._flush_settles)

    def flush_settles(self) -> None:
        """Loop thread: write the pending settlements now (before a channel closes, so
        that acks already given are not undone by the close's requeue); a scheduled
        flush stays scheduled and finds less to do."""
        with self._settle_lock:
            items, self._settles = self._settles, []
        if items:
            self.settle_flushes += 1
            self._settle_now(items)

    def _settle_now(self, items: list[tuple[Channel, int, bool, bool]]) -> None:
        conn = self.connection
        # A delivery tag is only valid on its channel; once that channel is gone the
        # broker has already requeued the message (it will be redelivered).
        frames = [
            settle_frame(ch.pika.channel_number, tag, ack, requeue)
            for ch, tag, ack, requeue in items
            if ch.is_open and ch.pika.connection is conn
        ]
        if frames and conn is not None and conn.is_open:
            conn._output_marshaled_frames([b"".join(frames)])

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop thread soon (no result); ignored once closed."""
        if self.on_loop_thread:
            fn(*args)
            return
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(fn, *args)
