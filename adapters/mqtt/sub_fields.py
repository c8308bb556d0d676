"""The MQTT 5 fields of the subscription sessions' own codec (:mod:`.sub_codec`): pure
functions, no I/O, no paho.

The packet type numbers and the reason codes a broken protocol closes the connection
with (:class:`Violation`); the data types (MQTT 5.0, 1.5): Two Byte Integer, Variable Byte
Integer, UTF-8 Encoded String (well-formed, no U+0000) and Binary Data, read within a
packet's bounds and written; and the properties of a packet from the broker, read in one
pass (:func:`properties`): each checked for its type, the packets it may appear in and
repeats, the user properties kept in order.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "AUTH",
    "CONNACK",
    "CONNECT",
    "DISCONNECT",
    "MALFORMED",
    "MAX_REMAINING",
    "PINGREQ",
    "PINGREQ_PACKET",
    "PINGRESP",
    "PROTOCOL_ERROR",
    "PUBACK",
    "PUBLISH",
    "SUBACK",
    "SUBSCRIBE",
    "TOPIC_ALIAS_INVALID",
    "UNSUBACK",
    "UNSUBSCRIBE",
    "PropertyValue",
    "ReadProperties",
    "Violation",
    "encode_packet",
    "encode_string",
    "encode_vbi",
    "optional_text",
    "properties",
    "read_binary",
    "read_text",
    "read_u16",
    "read_vbi",
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


# -- primitive fields -----------------------------------------------------------------------


def encode_vbi(n: int) -> bytes:
    """``n`` as a Variable Byte Integer."""
    out = bytearray()
    while True:
        digit, n = n & 0x7F, n >> 7
        out.append(digit | 0x80 if n else digit)
        if not n:
            return bytes(out)


def read_vbi(data: bytes, at: int, end: int) -> tuple[int, int]:
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


def read_u16(data: bytes, at: int, end: int) -> int:
    if at + 2 > end:
        raise Violation(MALFORMED, "a two byte integer runs past the packet")
    return (data[at] << 8) | data[at + 1]


def read_binary(data: bytes, at: int, end: int) -> tuple[bytes, int]:
    n = read_u16(data, at, end)
    stop = at + 2 + n
    if stop > end:
        raise Violation(MALFORMED, "a field runs past the packet")
    return data[at + 2 : stop], stop


def read_text(data: bytes, at: int, end: int) -> tuple[str, int]:
    """A UTF-8 Encoded String (MQTT 1.5.4: well-formed, no U+0000)."""
    raw, at = read_binary(data, at, end)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Violation(MALFORMED, "a string that is not well-formed UTF-8") from None
    if "\x00" in text:
        raise Violation(MALFORMED, "a string with U+0000")
    return text, at


def encode_string(text: str) -> bytes:
    data = text.encode("utf-8")
    if len(data) > 0xFFFF:
        raise ValueError(f"an MQTT string holds at most 65535 bytes, not {len(data)}")
    return len(data).to_bytes(2, "big") + data


def encode_packet(first: int, body: bytes) -> bytes:
    if len(body) > MAX_REMAINING:
        raise ValueError("an MQTT packet holds at most 268435455 bytes after its header")
    return bytes((first,)) + encode_vbi(len(body)) + body


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
class ReadProperties:
    single: dict[int, PropertyValue]
    pairs: list[tuple[str, str]]


def properties(data: bytes, at: int, end: int, packet: int) -> tuple[ReadProperties, int]:
    """The properties at ``at`` (their length first) of a ``packet`` from the broker."""
    length, at = read_vbi(data, at, end)
    stop = at + length
    if stop > end:
        raise Violation(MALFORMED, "the properties run past the packet")
    found = ReadProperties({}, [])
    while at < stop:
        ident, at = read_vbi(data, at, stop)
        spec = _PROPERTIES.get(ident)
        if spec is None or packet not in spec[1]:
            raise Violation(MALFORMED, f"property 0x{ident:02X} is not valid in this packet")
        kind = spec[0]
        value: PropertyValue
        if kind == _PAIR:
            key, at = read_text(data, at, stop)
            text, at = read_text(data, at, stop)
            found.pairs.append((key, text))
            continue
        if kind == _BYTE:
            if at >= stop:
                raise Violation(MALFORMED, "a property runs past the properties")
            value, at = data[at], at + 1
        elif kind == _U16:
            value, at = read_u16(data, at, stop), at + 2
        elif kind == _U32:
            if at + 4 > stop:
                raise Violation(MALFORMED, "a property runs past the properties")
            value, at = int.from_bytes(data[at : at + 4], "big"), at + 4
        elif kind == _VBI:
            value, at = read_vbi(data, at, stop)
            if value == 0:
                raise Violation(PROTOCOL_ERROR, "a Subscription Identifier of 0")
        elif kind == _STR:
            value, at = read_text(data, at, stop)
        else:
            value, at = read_binary(data, at, stop)
        if ident == _SUBSCRIPTION_ID:
            continue  # may repeat; the adapter does not use them
        if ident in found.single:
            raise Violation(PROTOCOL_ERROR, f"property 0x{ident:02X} appears twice")
        found.single[ident] = value
    return found, stop


def optional_text(props: ReadProperties, ident: int) -> str | None:
    value = props.single.get(ident)
    return value if isinstance(value, str) else None
