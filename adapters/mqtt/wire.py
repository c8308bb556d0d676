"""Messages on the MQTT wire: metadata as MQTT 5 properties, and back.

MQTT 5: every header is a user property (the message id ``wsnmom-message-id`` among them),
the media type is the Content Type property, and a body that is UTF-8 text is marked with
Payload Format Indicator 1.  MQTT 3.1.1 carries the topic and the body only.

An arriving message without a Content Type (any MQTT 3.1.1 message, and many native
ones) gets one from its body (``wsnmom.adapters.native.sniff_content_type``).
"""

from __future__ import annotations

import uuid
from typing import Any

from wsnmom.core.adapter import HEADER_MESSAGE_ID, OutboundMessage
from wsnmom.topic_mapping.model import Topic

from ..native import sniff_content_type
from .link import PacketTypes, Properties

__all__ = ["metadata", "outbound", "publish_properties"]

#: content types whose bodies are text (Payload Format Indicator 1 when valid UTF-8)
_TEXT_SUFFIXES = ("+xml", "+json")
_TEXT_TYPES = ("application/xml", "application/json", "application/soap+xml")


def _is_text(content_type: str) -> bool:
    base = content_type.split(";", 1)[0].strip().lower()
    return base.startswith("text/") or base in _TEXT_TYPES or base.endswith(_TEXT_SUFFIXES)


def publish_properties(message: OutboundMessage) -> Properties:
    """The MQTT 5 PUBLISH properties of ``message``."""
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    pairs = list(message.headers.items())
    if HEADER_MESSAGE_ID not in message.headers:
        pairs.insert(0, (HEADER_MESSAGE_ID, message.message_id))
    props.UserProperty = pairs
    if message.content_type:
        props.ContentType = message.content_type
        if _is_text(message.content_type):
            try:
                message.body.decode("utf-8")
            except UnicodeDecodeError:
                pass
            else:
                props.PayloadFormatIndicator = 1
    return props


def metadata(properties: Any, body: bytes) -> tuple[dict[str, str], str]:
    """Headers and content type of an arriving message (``properties`` None on 3.1.1)."""
    headers: dict[str, str] = {}
    content_type = ""
    if properties is not None:
        for key, value in getattr(properties, "UserProperty", None) or ():
            headers.setdefault(key, value)
        content_type = getattr(properties, "ContentType", None) or ""
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
