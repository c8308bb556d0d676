"""AMQP 0-9-1 frames written and read by the RabbitMQ adapter itself, without pika's
per-frame objects: the Basic.Publish frames of a batch (:class:`PublishFrames`, with
:func:`encode_table` for the headers), the frame that settles a delivery
(:func:`settle_frame`), and the reading side, :class:`FrameReader`, which turns a
channel's deliveries, ``basic.get`` replies, confirms and returns into calls with light
:class:`Delivered` and :class:`Properties` objects.  The bytes are pika's, byte for byte
(tests/adapters/test_rabbitmq_perf_publish.py compares them).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from typing import Any

import pika
import pika.data
import pika.exceptions
from pika import spec

# --- publishing without pika's per-message framing -----------------------------------
#
# ``basic_publish`` costs ~60 us of pure Python per message in pika (a Method, a Header and
# Body frame objects, BasicProperties.encode, encode_table value by value), on the one I/O
# thread every publish of the gateway goes through.  :class:`PublishFrames` writes the
# same bytes (AMQP 0-9-1, section 4.2.3: frame type, channel, size, payload, 0xCE) directly:
# the Basic.Publish method frame is memoised per (exchange, routing key, mandatory), and
# string headers -- all the gateway sets -- are packed without pika's per-value dispatch.
# tests/adapters/test_rabbitmq_perf_publish.py compares the bytes with pika's own.

FRAME_END = b"\xce"
FRAME_HEAD = struct.Struct(">BHI")
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


def shortstr(text: str) -> bytes:
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
    return shortstr(key) + b"S" + _U32(len(data)) + data


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
            parts.append(shortstr(key))
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
        return FRAME_HEAD.pack(kind, self._channel, len(payload)) + payload + FRAME_END

    def method(self, exchange: str, routing_key: str, mandatory: bool) -> bytes:
        """The Basic.Publish method frame (memoised)."""
        key = (exchange, routing_key, mandatory)
        frame = self._methods.get(key)
        if frame is None:
            payload = (
                _PUBLISH_HEAD
                + shortstr(exchange)
                + shortstr(routing_key)
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
            props.append(shortstr(content_type))
        if table is not None:
            flags |= _FLAG_HEADERS
            props.append(table)
        if persistent:
            flags |= _FLAG_DELIVERY_MODE
            props.append(_PERSISTENT)
        if message_id is not None:
            flags |= _FLAG_MESSAGE_ID
            props.append(shortstr(message_id))
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

READ_HEAD = struct.Struct(">BHI")
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
CONTENT_FRAMES = (spec.FRAME_HEADER, spec.FRAME_BODY)


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
        "on_failure",
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
        #: called once when reading failed (:meth:`fail`): the channel's owner closes it
        self.on_failure: Callable[[], None] | None = None
        #: the content being read: its method, handler, properties, body parts, size
        self._method: Delivered | None = None
        self._handler: MessageHandler | None = None
        self._props: Properties | None = None
        self._body: list[bytes] = []
        self._size = 0

    def fail(self) -> None:
        """Reading raised (a handler's bug, a message it cannot decode): from now on drop
        what this reader handles, the content being read included, and tell
        ``on_failure`` (once)."""
        if self.on_confirm is not None:
            self.on_confirm = _drop
        for name in ("on_return", "on_deliver", "on_get"):
            if getattr(self, name) is not None:
                setattr(self, name, _drop)
        if self._method is not None:
            self._handler = _drop
        failed, self.on_failure = self.on_failure, None
        if failed is not None:
            failed()

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
            self._size = size  # first: a property list that fails still has its body
            self._body = []
            self._props = Properties(data, start + 14, flags, tables)
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
        if handler is _drop:
            return
        assert method is not None and handler is not None and props is not None
        handler(method, props, body)


def _drop(*_args: Any) -> None:
    """The handler of a :class:`FrameReader` that failed: what it reads is dropped."""
