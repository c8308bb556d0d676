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
repeats) and dropped (:func:`.sub_fields.properties`).  The session announces no Topic
Alias Maximum, so a topic alias from the broker is a violation.  The packet type numbers,
reason codes and data types are :mod:`.sub_fields`; this module re-exports what its
callers use of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .sub_fields import (
    AUTH,
    CONNACK,
    CONNECT,
    DISCONNECT,
    MALFORMED,
    PINGREQ,
    PINGRESP,
    PROTOCOL_ERROR,
    PUBACK,
    PUBLISH,
    SUBACK,
    SUBSCRIBE,
    TOPIC_ALIAS_INVALID,
    UNSUBACK,
    UNSUBSCRIBE,
    ReadProperties,
    Violation,
    encode_packet,
    encode_string,
    encode_vbi,
    optional_text,
    properties,
    read_text,
    read_u16,
)

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
    topic, at = read_text(body, 0, end)
    packet_id = 0
    if qos:
        packet_id = read_u16(body, at, end)
        at += 2
        if packet_id == 0:
            raise Violation(MALFORMED, "a QoS 1 PUBLISH with packet identifier 0")
    props, at = properties(body, at, end, PUBLISH)
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
        optional_text(props, 0x03),
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
    props, at = properties(body, 2, end, CONNACK) if end > 2 else (ReadProperties({}, []), 2)
    if at != end:
        raise Violation(MALFORMED, "bytes after the CONNACK's properties")
    keepalive = props.single.get(0x13)
    return Connack(
        present,
        reason,
        keepalive if isinstance(keepalive, int) else None,
        optional_text(props, 0x1F),
    )


def _suback(kind: int, body: bytes) -> SubAck:
    end = len(body)
    packet_id = read_u16(body, 0, end)
    _, at = properties(body, 2, end, kind)
    reasons = tuple(body[at:])
    if not reasons:
        raise Violation(PROTOCOL_ERROR, "an acknowledgement without reason codes")
    return SubAck(packet_id, reasons, kind == UNSUBACK)


def _disconnect(body: bytes) -> Disconnect:
    end = len(body)
    if end == 0:
        return Disconnect(0, None)
    props, at = properties(body, 1, end, DISCONNECT) if end > 1 else (ReadProperties({}, []), 1)
    if at != end:
        raise Violation(MALFORMED, "bytes after the DISCONNECT's properties")
    return Disconnect(body[0], optional_text(props, 0x1F))


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
    payload = encode_string(client_id)
    if username is not None:
        flags |= 0x80
        payload += encode_string(username)
        if password is not None:
            flags |= 0x40
            payload += encode_string(password)
    props = (
        b"\x11" + session_expiry.to_bytes(4, "big") + b"\x21" + receive_maximum.to_bytes(2, "big")
    )
    head = b"\x00\x04MQTT\x05" + bytes((flags,)) + keepalive.to_bytes(2, "big")
    return encode_packet(CONNECT << 4, head + encode_vbi(len(props)) + props + payload)


def encode_subscribe(packet_id: int, filters: Sequence[str], options: int) -> bytes:
    """SUBSCRIBE of ``filters``, each with the Subscription Options byte ``options``."""
    if not filters:
        raise ValueError("a SUBSCRIBE needs at least one filter")
    body = packet_id.to_bytes(2, "big") + b"\x00"
    body += b"".join(encode_string(f) + bytes((options,)) for f in filters)
    return encode_packet(SUBSCRIBE << 4 | 0x02, body)


def encode_unsubscribe(packet_id: int, filters: Sequence[str]) -> bytes:
    """UNSUBSCRIBE of ``filters``."""
    if not filters:
        raise ValueError("an UNSUBSCRIBE needs at least one filter")
    body = packet_id.to_bytes(2, "big") + b"\x00" + b"".join(encode_string(f) for f in filters)
    return encode_packet(UNSUBSCRIBE << 4 | 0x02, body)


def encode_puback(packet_id: int) -> bytes:
    """PUBACK, success (the reason code and properties left out, MQTT 3.4.2.1)."""
    return bytes((PUBACK << 4, 2, packet_id >> 8, packet_id & 0xFF))


def encode_disconnect(reason: int = 0, session_expiry: int | None = None) -> bytes:
    """DISCONNECT with ``reason``; ``session_expiry`` sets the session's new expiry (0:
    the broker drops the session)."""
    if session_expiry is None:
        if reason == 0:
            return b"\xe0\x00"
        return encode_packet(DISCONNECT << 4, bytes((reason, 0)))
    props = b"\x11" + session_expiry.to_bytes(4, "big")
    return encode_packet(DISCONNECT << 4, bytes((reason,)) + encode_vbi(len(props)) + props)
