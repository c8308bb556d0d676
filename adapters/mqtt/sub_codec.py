"""The MQTT 5 packets of a subscription session (cluster mode), as bytes and back: pure
functions, no I/O, no paho.

A subscription session (:mod:`.sub_session`) sends CONNECT, SUBSCRIBE, UNSUBSCRIBE,
PUBACK, PINGREQ and DISCONNECT (the ``encode_*`` functions) and receives CONNACK, PUBLISH,
SUBACK, UNSUBACK, PINGRESP and DISCONNECT (:func:`split` cuts packets out of the bytes
read, :func:`decode` reads one).  Anything else the broker sends, and anything malformed,
raises :class:`Violation` carrying the reason code of the DISCONNECT the client closes
the connection with (MQTT 5.0, 4.13: Malformed Packet 0x81, Protocol Error 0x82, Topic
Alias invalid 0x94).

Arriving PUBLISH properties are read in one pass into the fields the adapter uses (user
properties and content type); the others are checked (type, where they may appear,
repeats) and dropped.  The session announces no Topic Alias Maximum, so a topic alias
from the broker is a violation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "CONNACK",
    "DISCONNECT",
    "PINGREQ",
    "PINGRESP",
    "PUBLISH",
    "SUBACK",
    "UNSUBACK",
    "Connack",
    "Disconnect",
    "Packet",
    "Publish",
    "SubAck",
    "Violation",
    "decode",
    "encode_connect",
    "encode_disconnect",
    "encode_puback",
    "encode_subscribe",
    "encode_unsubscribe",
    "split",
]

# packet types (the high nibble of the first byte)
CONNECT = 1
CONNACK = 2
PUBLISH = 3
PUBACK = 4
SUBSCRIBE = 8
SUBACK = 9
UNSUBSCRIBE = 10
UNSUBACK = 11
PINGREQ = 12
PINGRESP = 13
DISCONNECT = 14
AUTH = 15

MALFORMED = 0x81
PROTOCOL_ERROR = 0x82
TOPIC_ALIAS_INVALID = 0x94

#: the largest Remaining Length (four bytes of Variable Byte Integer)
MAX_REMAINING = 268_435_455

#: PINGREQ, whole
PINGREQ_PACKET = b"\xc0\x00"


class Violation(ValueError):
    """The broker broke the protocol: close the connection with DISCONNECT ``reason``."""

    def __init__(self, reason: int, what: str) -> None:
        super().__init__(what)
        self.reason = reason


# -- packets from the broker --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Connack:
    """CONNACK: ``reason`` 0 is success; ``keepalive`` the Server Keep Alive (None: ours)."""

    session_present: bool
    reason: int
    keepalive: int | None
    reason_string: str | None


@dataclass(frozen=True, slots=True)
class Publish:
    """An arriving PUBLISH: ``packet_id`` 0 at QoS 0; ``content_type`` None when absent."""

    topic: str
    payload: bytes
    qos: int
    dup: bool
    retain: bool
    packet_id: int
    user_properties: tuple[tuple[str, str], ...]
    content_type: str | None


@dataclass(frozen=True, slots=True)
class SubAck:
    """SUBACK (``unsubscribe`` false) or UNSUBACK: a reason code per filter, in order."""

    packet_id: int
    reasons: tuple[int, ...]
    unsubscribe: bool


@dataclass(frozen=True, slots=True)
class Disconnect:
    """DISCONNECT from the broker."""

    reason: int
    reason_string: str | None


@dataclass(frozen=True, slots=True)
class Pingresp:
    """PINGRESP."""


Packet = Connack | Publish | SubAck | Disconnect | Pingresp

# -- primitive fields -----------------------------------------------------------------------


def _vbi(n: int) -> bytes:
    """``n`` as a Variable Byte Integer."""
    out = bytearray()
    while True:
        digit, n = n & 0x7F, n >> 7
        out.append(digit | 0x80 if n else digit)
        if not n:
            return bytes(out)


def _read_vbi(data: bytes, at: int, end: int) -> tuple[int, int]:
    """The Variable Byte Integer at ``at``: (value, the position after it)."""
    value = 0
    for shift in (0, 7, 14, 21):
        if at >= end:
            raise Violation(MALFORMED, "a variable byte integer runs past the packet")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
    raise Violation(MALFORMED, "a variable byte integer longer than four bytes")


def _u16(data: bytes, at: int, end: int) -> int:
    if at + 2 > end:
        raise Violation(MALFORMED, "a two byte integer runs past the packet")
    return (data[at] << 8) | data[at + 1]


def _binary(data: bytes, at: int, end: int) -> tuple[bytes, int]:
    n = _u16(data, at, end)
    stop = at + 2 + n
    if stop > end:
        raise Violation(MALFORMED, "a field runs past the packet")
    return data[at + 2 : stop], stop


def _text(data: bytes, at: int, end: int) -> tuple[str, int]:
    """A UTF-8 Encoded String (MQTT 1.5.4: well-formed, no U+0000)."""
    raw, at = _binary(data, at, end)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Violation(MALFORMED, "a string that is not well-formed UTF-8") from None
    if "\x00" in text:
        raise Violation(MALFORMED, "a string with U+0000")
    return text, at


def _string(text: str) -> bytes:
    data = text.encode("utf-8")
    if len(data) > 0xFFFF:
        raise ValueError(f"an MQTT string holds at most 65535 bytes, not {len(data)}")
    return len(data).to_bytes(2, "big") + data


def _packet(first: int, body: bytes) -> bytes:
    if len(body) > MAX_REMAINING:
        raise ValueError("an MQTT packet holds at most 268435455 bytes after its header")
    return bytes((first,)) + _vbi(len(body)) + body


# -- properties -----------------------------------------------------------------------------

_BYTE, _U16, _U32, _VBI, _STR, _BIN, _PAIR = range(7)

#: property identifier -> (its type, the packets from the broker it may appear in)
_PROPERTIES: dict[int, tuple[int, frozenset[int]]] = {
    0x01: (_BYTE, frozenset({PUBLISH})),  # Payload Format Indicator
    0x02: (_U32, frozenset({PUBLISH})),  # Message Expiry Interval
    0x03: (_STR, frozenset({PUBLISH})),  # Content Type
    0x08: (_STR, frozenset({PUBLISH})),  # Response Topic
    0x09: (_BIN, frozenset({PUBLISH})),  # Correlation Data
    0x0B: (_VBI, frozenset({PUBLISH})),  # Subscription Identifier (may repeat)
    0x11: (_U32, frozenset({CONNACK, DISCONNECT})),  # Session Expiry Interval
    0x12: (_STR, frozenset({CONNACK})),  # Assigned Client Identifier
    0x13: (_U16, frozenset({CONNACK})),  # Server Keep Alive
    0x15: (_STR, frozenset({CONNACK})),  # Authentication Method
    0x16: (_BIN, frozenset({CONNACK})),  # Authentication Data
    0x1A: (_STR, frozenset({CONNACK})),  # Response Information
    0x1C: (_STR, frozenset({CONNACK, DISCONNECT})),  # Server Reference
    0x1F: (_STR, frozenset({CONNACK, SUBACK, UNSUBACK, DISCONNECT})),  # Reason String
    0x21: (_U16, frozenset({CONNACK})),  # Receive Maximum
    0x22: (_U16, frozenset({CONNACK})),  # Topic Alias Maximum
    0x23: (_U16, frozenset({PUBLISH})),  # Topic Alias
    0x24: (_BYTE, frozenset({CONNACK})),  # Maximum QoS
    0x25: (_BYTE, frozenset({CONNACK})),  # Retain Available
    0x26: (_PAIR, frozenset({CONNACK, PUBLISH, SUBACK, UNSUBACK, DISCONNECT})),  # User Property
    0x27: (_U32, frozenset({CONNACK})),  # Maximum Packet Size
    0x28: (_BYTE, frozenset({CONNACK})),  # Wildcard Subscription Available
    0x29: (_BYTE, frozenset({CONNACK})),  # Subscription Identifier Available
    0x2A: (_BYTE, frozenset({CONNACK})),  # Shared Subscription Available
}
_USER_PROPERTY = 0x26
_SUBSCRIPTION_ID = 0x0B

PropertyValue = int | str | bytes


@dataclass(slots=True)
class _Properties:
    single: dict[int, PropertyValue]
    pairs: list[tuple[str, str]]


def _properties(data: bytes, at: int, end: int, packet: int) -> tuple[_Properties, int]:
    """The properties at ``at`` (their length first) of a ``packet`` from the broker."""
    length, at = _read_vbi(data, at, end)
    stop = at + length
    if stop > end:
        raise Violation(MALFORMED, "the properties run past the packet")
    found = _Properties({}, [])
    while at < stop:
        ident, at = _read_vbi(data, at, stop)
        spec = _PROPERTIES.get(ident)
        if spec is None or packet not in spec[1]:
            raise Violation(MALFORMED, f"property 0x{ident:02X} is not valid in this packet")
        kind = spec[0]
        value: PropertyValue
        if kind == _PAIR:
            key, at = _text(data, at, stop)
            text, at = _text(data, at, stop)
            found.pairs.append((key, text))
            continue
        if kind == _BYTE:
            if at >= stop:
                raise Violation(MALFORMED, "a property runs past the properties")
            value, at = data[at], at + 1
        elif kind == _U16:
            value, at = _u16(data, at, stop), at + 2
        elif kind == _U32:
            if at + 4 > stop:
                raise Violation(MALFORMED, "a property runs past the properties")
            value, at = int.from_bytes(data[at : at + 4], "big"), at + 4
        elif kind == _VBI:
            value, at = _read_vbi(data, at, stop)
            if value == 0:
                raise Violation(PROTOCOL_ERROR, "a Subscription Identifier of 0")
        elif kind == _STR:
            value, at = _text(data, at, stop)
        else:
            value, at = _binary(data, at, stop)
        if ident == _SUBSCRIPTION_ID:
            continue  # may repeat; the adapter does not use them
        if ident in found.single:
            raise Violation(PROTOCOL_ERROR, f"property 0x{ident:02X} appears twice")
        found.single[ident] = value
    return found, stop


def _optional_text(props: _Properties, ident: int) -> str | None:
    value = props.single.get(ident)
    return value if isinstance(value, str) else None


# -- splitting the stream -------------------------------------------------------------------


def split(buffer: bytes | bytearray) -> tuple[list[tuple[int, bytes]], int]:
    """The complete packets at the start of ``buffer`` as (first byte, the bytes after the
    fixed header), and how many bytes they took (the rest is an incomplete packet)."""
    packets: list[tuple[int, bytes]] = []
    at = 0
    size = len(buffer)
    while at + 2 <= size:
        length = 0
        pos = at + 1
        for shift in (0, 7, 14, 21):
            if pos >= size:
                return packets, at  # the length itself is not complete yet
            byte = buffer[pos]
            pos += 1
            length |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
        else:
            raise Violation(MALFORMED, "a remaining length longer than four bytes")
        if pos + length > size:
            break
        packets.append((buffer[at], bytes(buffer[pos : pos + length])))
        at = pos + length
    return packets, at


# -- decoding -------------------------------------------------------------------------------


def decode(first: int, body: bytes) -> Packet:
    """The packet of type and flags ``first`` with ``body`` (what follows the fixed
    header).  :class:`Violation` for a malformed packet or one a broker must not send to
    this client."""
    kind, flags = first >> 4, first & 0x0F
    if kind == PUBLISH:
        return _publish(flags, body)
    if kind in (PUBACK, PUBACK + 1, PUBACK + 2, PUBACK + 3, AUTH):
        # PUBACK, PUBREC, PUBREL, PUBCOMP (this client publishes nothing, receives no
        # QoS 2) and AUTH (it asked for no extended authentication)
        raise Violation(PROTOCOL_ERROR, f"packet type {kind} was not expected here")
    if flags:
        raise Violation(MALFORMED, f"packet type {kind} with reserved flags set")
    if kind == CONNACK:
        return _connack(body)
    if kind in (SUBACK, UNSUBACK):
        return _suback(kind, body)
    if kind == PINGRESP:
        if body:
            raise Violation(MALFORMED, "a PINGRESP with a body")
        return Pingresp()
    if kind == DISCONNECT:
        return _disconnect(body)
    # CONNECT, SUBSCRIBE, UNSUBSCRIBE, PINGREQ and the reserved type 0
    raise Violation(MALFORMED, f"packet type {kind} never comes from a server")


def _publish(flags: int, body: bytes) -> Publish:
    qos = (flags >> 1) & 0x03
    dup = bool(flags & 0x08)
    if qos == 3:
        raise Violation(MALFORMED, "a PUBLISH with QoS 3")
    if qos == 2:
        raise Violation(PROTOCOL_ERROR, "a PUBLISH with QoS 2 on a QoS 1 subscription")
    if qos == 0 and dup:
        raise Violation(MALFORMED, "a QoS 0 PUBLISH with DUP set")
    end = len(body)
    topic, at = _text(body, 0, end)
    packet_id = 0
    if qos:
        packet_id = _u16(body, at, end)
        at += 2
        if packet_id == 0:
            raise Violation(MALFORMED, "a QoS 1 PUBLISH with packet identifier 0")
    props, at = _properties(body, at, end, PUBLISH)
    if 0x23 in props.single:
        raise Violation(TOPIC_ALIAS_INVALID, "a topic alias, though none was allowed")
    if not topic:
        raise Violation(PROTOCOL_ERROR, "a PUBLISH without a topic name or alias")
    if "+" in topic or "#" in topic:
        raise Violation(PROTOCOL_ERROR, "a PUBLISH topic name with a wildcard")
    return Publish(
        topic,
        body[at:],
        qos,
        dup,
        bool(flags & 0x01),
        packet_id,
        tuple(props.pairs),
        _optional_text(props, 0x03),
    )


def _connack(body: bytes) -> Connack:
    end = len(body)
    if end < 2:
        raise Violation(MALFORMED, "a CONNACK shorter than two bytes")
    if body[0] & 0xFE:
        raise Violation(MALFORMED, "a CONNACK with reserved flags set")
    present, reason = bool(body[0] & 0x01), body[1]
    if reason and present:
        raise Violation(PROTOCOL_ERROR, "a refusing CONNACK with session present")
    props, at = _properties(body, 2, end, CONNACK) if end > 2 else (_Properties({}, []), 2)
    if at != end:
        raise Violation(MALFORMED, "bytes after the CONNACK's properties")
    keepalive = props.single.get(0x13)
    return Connack(
        present,
        reason,
        keepalive if isinstance(keepalive, int) else None,
        _optional_text(props, 0x1F),
    )


def _suback(kind: int, body: bytes) -> SubAck:
    end = len(body)
    packet_id = _u16(body, 0, end)
    _, at = _properties(body, 2, end, kind)
    reasons = tuple(body[at:])
    if not reasons:
        raise Violation(PROTOCOL_ERROR, "an acknowledgement without reason codes")
    return SubAck(packet_id, reasons, kind == UNSUBACK)


def _disconnect(body: bytes) -> Disconnect:
    end = len(body)
    if end == 0:
        return Disconnect(0, None)
    props, at = _properties(body, 1, end, DISCONNECT) if end > 1 else (_Properties({}, []), 1)
    if at != end:
        raise Violation(MALFORMED, "bytes after the DISCONNECT's properties")
    return Disconnect(body[0], _optional_text(props, 0x1F))


# -- encoding -------------------------------------------------------------------------------


def encode_connect(
    client_id: str,
    *,
    clean_start: bool,
    keepalive: int,
    session_expiry: int,
    receive_maximum: int,
    username: str | None = None,
    password: str | None = None,
) -> bytes:
    """CONNECT (MQTT 5, no will): Session Expiry Interval and Receive Maximum; the
    password goes with a user name only (as the adapter's other connections)."""
    if not 0 <= keepalive <= 0xFFFF:
        raise ValueError("keep-alive must be 0 to 65535 seconds")
    if not 1 <= receive_maximum <= 0xFFFF:
        raise ValueError("Receive Maximum must be 1 to 65535")
    flags = 0x02 if clean_start else 0
    payload = _string(client_id)
    if username is not None:
        flags |= 0x80
        payload += _string(username)
        if password is not None:
            flags |= 0x40
            payload += _string(password)
    props = (
        b"\x11" + session_expiry.to_bytes(4, "big") + b"\x21" + receive_maximum.to_bytes(2, "big")
    )
    head = b"\x00\x04MQTT\x05" + bytes((flags,)) + keepalive.to_bytes(2, "big")
    return _packet(CONNECT << 4, head + _vbi(len(props)) + props + payload)


def encode_subscribe(packet_id: int, filters: Sequence[str], options: int) -> bytes:
    """SUBSCRIBE of ``filters``, each with the Subscription Options byte ``options``."""
    if not filters:
        raise ValueError("a SUBSCRIBE needs at least one filter")
    body = packet_id.to_bytes(2, "big") + b"\x00"
    body += b"".join(_string(f) + bytes((options,)) for f in filters)
    return _packet(SUBSCRIBE << 4 | 0x02, body)


def encode_unsubscribe(packet_id: int, filters: Sequence[str]) -> bytes:
    """UNSUBSCRIBE of ``filters``."""
    if not filters:
        raise ValueError("an UNSUBSCRIBE needs at least one filter")
    body = packet_id.to_bytes(2, "big") + b"\x00" + b"".join(_string(f) for f in filters)
    return _packet(UNSUBSCRIBE << 4 | 0x02, body)


def encode_puback(packet_id: int) -> bytes:
    """PUBACK, success (the reason code and properties left out, MQTT 3.4.2.1)."""
    return bytes((PUBACK << 4, 2, packet_id >> 8, packet_id & 0xFF))


def encode_disconnect(reason: int = 0, session_expiry: int | None = None) -> bytes:
    """DISCONNECT with ``reason``; ``session_expiry`` sets the session's new expiry (0:
    the broker drops the session)."""
    if session_expiry is None:
        if reason == 0:
            return b"\xe0\x00"
        return _packet(DISCONNECT << 4, bytes((reason, 0)))
    props = b"\x11" + session_expiry.to_bytes(4, "big")
    return _packet(DISCONNECT << 4, bytes((reason,)) + _vbi(len(props)) + props)
