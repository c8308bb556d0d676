"""Messages on the MQTT wire: metadata as MQTT 5 properties, and back.

MQTT 5: every header is a user property (the message id ``wsnmom-message-id`` among them),
the media type is the Content Type property, and a body that is UTF-8 text is marked with
Payload Format Indicator 1.  MQTT 3.1.1 carries the topic and the body only.

An arriving message without a Content Type (any MQTT 3.1.1 message, and many native
ones) gets one from its body (``wsnmom.adapters.native.sniff_content_type``).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from typing import Any

from wsnmom.core.adapter import HEADER_MESSAGE_ID, OutboundMessage
from wsnmom.topic_mapping.model import Topic

from ..native import sniff_content_type
from .link import PacketTypes, Properties
from .sub_fields import encode_string, encode_vbi

__all__ = ["metadata", "metadata_of", "outbound", "publish_properties"]

#: content types whose bodies are text (Payload Format Indicator 1 when valid UTF-8)
_TEXT_SUFFIXES = ("+xml", "+json")
_TEXT_TYPES = ("application/xml", "application/json", "application/soap+xml")


def _is_text(content_type: str) -> bool:
    base = content_type.split(";", 1)[0].strip().lower()
    return base.startswith("text/") or base in _TEXT_TYPES or base.endswith(_TEXT_SUFFIXES)


class PackedProperties(Properties):
    """PUBLISH properties encoded by wsnmom, for paho, which only calls ``pack()`` on the
    properties of a publish.  paho's generic ``Properties`` costs ~140 µs per message to
    build and pack with a few user properties (measured with paho-mqtt 2.2); this is a few
    µs.  :func:`publish_properties` checks once that both encode the same bytes and uses
    paho's own class otherwise."""

    def __init__(self, packed: bytes) -> None:  # no paho bookkeeping: pack() is all
        object.__setattr__(self, "_packed", packed)

    def pack(self) -> bytes:
        return bytes(self._packed)  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"<PackedProperties {len(self._packed)} bytes>"  # type: ignore[attr-defined]

    __str__ = __repr__


def _fields(message: OutboundMessage) -> tuple[list[tuple[str, str]], str, bool]:
    """(user properties, content type, payload is UTF-8 text) of ``message``."""
    pairs = list(message.headers.items())
    if HEADER_MESSAGE_ID not in message.headers:
        pairs.insert(0, (HEADER_MESSAGE_ID, message.message_id))
    text = False
    if message.content_type and _is_text(message.content_type):
        try:
            message.body.decode("utf-8")
        except UnicodeDecodeError:
            text = False
        else:
            text = True
    return pairs, message.content_type, text


def _packed(pairs: list[tuple[str, str]], content_type: str, text: bool) -> Properties:
    """The wire form of the properties, in paho's order (by property identifier)."""
    parts = [b"\x01\x01"] if text else []
    if content_type:
        parts.append(b"\x03" + encode_string(content_type))
    parts.extend(b"\x26" + encode_string(k) + encode_string(v) for k, v in pairs)
    body = b"".join(parts)
    return PackedProperties(encode_vbi(len(body)) + body)


def _stock(pairs: list[tuple[str, str]], content_type: str, text: bool) -> Properties:
    """The same properties through paho's own class."""
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    if text:
        props.PayloadFormatIndicator = 1
    if content_type:
        props.ContentType = content_type
    props.UserProperty = pairs
    return props


def _packing_agrees() -> bool:
    sample = ([("wsnmom-message-id", "m1"), ("é€", "😀"), ("", "")], "application/xml", True)
    try:
        return bool(_packed(*sample).pack() == _stock(*sample).pack())  # type: ignore[no-untyped-call]
    except Exception:  # pragma: no cover - an incompatible paho
        return False


_build = _packed if _packing_agrees() else _stock
if _build is _stock:  # pragma: no cover - depends on the installed paho
    logging.getLogger("wsnmom.adapters.mqtt").warning(
        "paho-mqtt packs MQTT 5 properties differently than expected; using its own "
        "(slower) Properties class"
    )


def publish_properties(message: OutboundMessage) -> Properties:
    """The MQTT 5 PUBLISH properties of ``message``."""
    return _build(*_fields(message))


def metadata(properties: Any, body: bytes) -> tuple[dict[str, str], str]:
    """Headers and content type of an arriving message (``properties`` paho's, None on
    3.1.1)."""
    if properties is None:
        return {}, sniff_content_type(body)
    pairs = getattr(properties, "UserProperty", None) or ()
    return metadata_of(pairs, getattr(properties, "ContentType", None), body)


def metadata_of(
    pairs: Iterable[tuple[str, str]], content_type: str | None, body: bytes
) -> tuple[dict[str, str], str]:
    """Headers and content type of an arriving MQTT 5 message from its user properties
    (the first of a repeated name counts) and Content Type."""
    headers: dict[str, str] = {}
    for key, value in pairs:
        headers.setdefault(key, value)
    return headers, content_type or sniff_content_type(body)


def outbound(
    topic: Topic, body: bytes, headers: dict[str, str], content_type: str
) -> OutboundMessage:
    """The queue-store message of an arriving one (its message id, or a new one)."""
    return OutboundMessage(
        topic=topic,
        body=body,
        message_id=headers.get(HEADER_MESSAGE_ID) or uuid.uuid4().hex,
        headers=headers,
        content_type=content_type,
    )
