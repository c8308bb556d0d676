"""Helpers for natively published messages that every adapter needs the same way."""

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
