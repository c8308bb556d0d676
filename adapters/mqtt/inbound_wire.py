"""Arriving QoS 1 PUBLISH packets decoded without paho's generic MQTT 5 ``Properties``.

paho-mqtt decodes the properties of every arriving PUBLISH through its generic
``Properties.unpack``, which looks each property up by name and type on every field: with
the handful of user properties wsnmom puts on a message, that was about a third of the
gateway's CPU in cluster mode, where the broker sends one copy of each message per
subscription session (``python -m bench --scenarios ha --adapters mqtt``,
docs/performance.md "MQTT cluster mode: CPU per delivery").  :class:`Client` (paho's
client, used by every :class:`.link.Link`) decodes the QoS 1 PUBLISH packets of an MQTT 5
connection with manual acknowledgements itself, in one pass over the bytes, into
:class:`InboundProperties` (a ``Properties`` with the same attributes), and leaves every
other packet, and any PUBLISH carrying a property it does not know, to paho.

It overrides paho's packet handler ``_handle_publish``, which is not public API, so this
module checks once, at import, that the installed paho has what it relies on and that
both decoders agree on a sample packet; otherwise :data:`CLIENT_CLASS` is paho's own client
(and a warning is logged), as :mod:`.wire` does for encoding.
"""

from __future__ import annotations

import logging
import struct
from typing import Any

try:
    import paho.mqtt.client as mqtt
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError('the MQTT adapter needs paho-mqtt: pip install "wsnmom[mqtt]"') from exc

__all__ = ["CLIENT_CLASS", "InboundProperties", "decode_properties"]

log = logging.getLogger("wsnmom.adapters.mqtt")

_TEMPLATE = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]

#: PUBLISH property identifier -> (attribute, kind); kinds: byte, u16, u32, vbi, bin, str,
#: pair.  Subscription Identifier and User Property may repeat (paho keeps lists).
_KNOWN: dict[int, tuple[str, str]] = {
    1: ("PayloadFormatIndicator", "byte"),
    2: ("MessageExpiryInterval", "u32"),
    3: ("ContentType", "str"),
    8: ("ResponseTopic", "str"),
    9: ("CorrelationData", "bin"),
    11: ("SubscriptionIdentifier", "vbi"),
    35: ("TopicAlias", "u16"),
    38: ("UserProperty", "pair"),
}


#: characters an MQTT string must not hold, which paho refuses (MQTT-1.5.4-2, -3): a packet
#: with one is left to paho
_REFUSED = "\x00"
_BOM = "\ufeff"


class Unknown(ValueError):
    """A packet this decoder leaves to paho (an unknown property, a malformed field)."""


class InboundProperties(Properties):
    """The properties of an arriving PUBLISH, attribute for attribute as paho's
    ``Properties`` has them (``UserProperty`` a list of pairs, ``SubscriptionIdentifier``
    a list of integers, the others single values); built without paho's bookkeeping."""

    def __init__(self) -> None:
        # paho's __str__, json() and isEmpty() read these three tables
        object.__setattr__(self, "packetType", PacketTypes.PUBLISH)
        object.__setattr__(self, "names", _TEMPLATE.names)
        object.__setattr__(self, "types", _TEMPLATE.types)
        object.__setattr__(self, "properties", _TEMPLATE.properties)


def _vbi(data: bytes | bytearray, at: int) -> tuple[int, int]:
    """A Variable Byte Integer at ``at``: (value, the position after it)."""
    value = 0
    shift = 0
    for _ in range(4):
        if at >= len(data):
            raise Unknown("truncated variable byte integer")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7
    raise Unknown("variable byte integer longer than 4 bytes")


def _bytes(data: bytes | bytearray, at: int) -> tuple[bytes, int]:
    if at + 2 > len(data):
        raise Unknown("truncated length")
    n = (data[at] << 8) | data[at + 1]
    end = at + 2 + n
    if end > len(data):
        raise Unknown("truncated field")
    return bytes(data[at + 2 : end]), end


def _text(data: bytes | bytearray, at: int) -> tuple[str, int]:
    raw, at = _bytes(data, at)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Unknown("invalid UTF-8") from exc
    if _REFUSED in text or _BOM in text:
        raise Unknown("a character MQTT refuses in a string")
    return text, at


def decode_properties(data: bytes | bytearray, at: int) -> tuple[InboundProperties, int]:
    """The PUBLISH properties that start at ``at`` (their length first): the properties and
    the position of the payload.  :class:`Unknown` for anything paho should decode."""
    length, at = _vbi(data, at)
    end = at + length
    if end > len(data):
        raise Unknown("truncated properties")
    found: dict[str, Any] = {}
    pairs: list[tuple[str, str]] = []
    try:
        while at < end:
            ident = data[at]
            at += 1
            if ident == 38:  # User Property, the common case: two strings
                n = (data[at] << 8) | data[at + 1]
                key = data[at + 2 : at + 2 + n].decode()
                at += 2 + n
                n = (data[at] << 8) | data[at + 1]
                val = data[at + 2 : at + 2 + n].decode()
                at += 2 + n
                if _REFUSED in key or _REFUSED in val or _BOM in key or _BOM in val:
                    raise Unknown("a character MQTT refuses in a string")
                pairs.append((key, val))
                continue
            known = _KNOWN.get(ident)
            if known is None:  # also an identifier of more than one byte (none is known)
                raise Unknown(f"property {ident}")
            name, kind = known
            value: Any
            if kind == "str":
                value, at = _text(data, at)
            elif kind == "vbi":
                value, at = _vbi(data, at)
                found.setdefault(name, []).append(value)
                continue
            elif kind == "byte":
                value = data[at]
                at += 1
            elif kind == "u16":
                value = struct.unpack_from("!H", data, at)[0]
                at += 2
            elif kind == "u32":
                value = struct.unpack_from("!L", data, at)[0]
                at += 4
            else:  # bin
                value, at = _bytes(data, at)
            if name in found:
                raise Unknown(f"property {ident} twice")
            found[name] = value
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise Unknown(f"malformed properties: {exc}") from exc
    if at != end:
        raise Unknown("properties overrun their length")
    props = InboundProperties()
    for name, value in found.items():
        object.__setattr__(props, name, value)
    if pairs:
        object.__setattr__(props, "UserProperty", pairs)
    return props, end


def decode_qos1(header: int, packet: bytes | bytearray) -> Any:
    """An MQTT 5 QoS 1 PUBLISH (``header``: its first byte; ``packet``: what follows the
    remaining length) as paho's ``MQTTMessage``."""
    topic, at = _bytes(packet, 0)
    if at + 2 > len(packet):
        raise Unknown("truncated packet identifier")
    mid = (packet[at] << 8) | packet[at + 1]
    props, at = decode_properties(packet, at + 2)
    message = mqtt.MQTTMessage(mid=mid, topic=topic)
    message.dup = bool(header & 0x08)
    message.qos = 1
    message.retain = bool(header & 0x01)
    message.properties = props
    message.payload = bytes(packet[at:])
    return message


class Client(mqtt.Client):
    """paho's client, decoding arriving MQTT 5 QoS 1 PUBLISH packets itself (module
    docstring)."""

    def _handle_publish(self) -> Any:
        packet = self._in_packet
        header = packet["command"]
        if self._protocol != mqtt.MQTTv5 or (header & 0x06) != 0x02 or not self._manual_ack:
            return super()._handle_publish()
        try:
            message = decode_qos1(header, packet["packet"])
        except Unknown:
            return super()._handle_publish()
        message.timestamp = mqtt.time_func()
        self._handle_on_message(message)
        return mqtt.MQTT_ERR_SUCCESS


def _agrees() -> bool:
    """Whether paho's decoder and this one read a sample packet alike."""
    from paho.mqtt import _packet
    from paho.mqtt.enums import CallbackAPIVersion

    def text(s: str) -> bytes:
        raw = s.encode()
        return len(raw).to_bytes(2, "big") + raw

    try:
        pairs = [("wsnmom-message-id", "m1"), ("é€", "😀"), ("", ""), ("wsnmom-message-id", "x")]
        fields = b"\x01\x01\x03" + text("application/xml") + b"\x02\x00\x00\x01\x00"
        fields += b"".join(b"\x26" + text(k) + text(v) for k, v in pairs) + b"\x0b\x85\x01"
        props = bytes([len(fields)]) + fields
        topic = "t/é".encode()
        body = len(topic).to_bytes(2, "big") + topic + b"\x01\x02" + props + b"<x/>"
        header = 0x32 | 0x08
        stock = _packet.decode_publish(header, body, mqtt.MQTTv5)
        mine = decode_qos1(header, body)
        probe = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        needed = all(hasattr(probe, a) for a in ("_in_packet", "_protocol", "_manual_ack"))
        assert stock.properties is not None
        return (
            needed
            and callable(getattr(mqtt.Client, "_handle_on_message", None))
            and callable(getattr(mqtt, "time_func", None))
            and stock.properties.json() == mine.properties.json()  # type: ignore[no-untyped-call]
            and (stock.topic.decode(), stock.mid, stock.dup, stock.retain, bytes(stock.payload))
            == (mine.topic, mine.mid, mine.dup, mine.retain, mine.payload)
        )
    except Exception:  # pragma: no cover - an incompatible paho
        log.debug("the PUBLISH decoder check failed", exc_info=True)
        return False


#: the client class every link uses
CLIENT_CLASS: type[mqtt.Client] = Client if _agrees() else mqtt.Client
if CLIENT_CLASS is not Client:  # pragma: no cover - depends on the installed paho
    log.warning(
        "paho-mqtt's client differs from what wsnmom's PUBLISH decoder expects; using "
        "paho's own (slower) decoder"
    )
