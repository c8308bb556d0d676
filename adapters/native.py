"""Helpers for natively published messages that every adapter needs the same way.

An adapter hands core each message with a media type (``Received.content_type``); core's
codec only acts on it (XML is the notification, anything else is wrapped as a
``wsnmom:NativeMessage``).  Where the middleware carried none — a Kafka record without a
content-type header, an MQTT 3.1.1 message, an MQTT 5 message without the Content Type
property — the adapter takes one from the body with :func:`sniff_content_type`.  The Spark
bridge reads native records through the same adapter code, so it gets the same answer.
"""

from __future__ import annotations

import json

__all__ = ["sniff_content_type"]


def sniff_content_type(body: bytes) -> str:
    """A media type for a body that came without one: XML when it starts like XML, JSON
    when it parses as JSON, text when it is UTF-8, else binary."""
    head = body.lstrip()[:1]
    if head == b"<":
        return "application/xml"
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return "application/octet-stream"
    if head in (b"{", b"["):
        try:
            json.loads(text)
        except ValueError:
            return "text/plain"
        return "application/json"
    return "text/plain"
