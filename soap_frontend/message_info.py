"""The ``wsnmom:Messages`` SOAP header block: per-message information that WS-N's own
elements have no room for.

One ``wsnmom:Message`` per NotificationMessage, in order.  Outbound (push deliveries and
GetMessagesResponse) it carries the gateway's message id and publication time as
attributes and the message's application headers (``core.app_headers``) as
``wsnmom:Header name="..."`` children.  Inbound, on a Notify, only the headers count: one
``wsnmom:Message`` per NotificationMessage, or a single one that applies to all of them.
The block is a plain header (no mustUnderstand), which other peers ignore::

    <wsnmom:Messages xmlns:wsnmom="urn:wsnmom:ns:1">
      <wsnmom:Message id="..." published="2026-11-27T10:00:00Z">
        <wsnmom:Header name="traceparent">00-...-01</wsnmom:Header>
      </wsnmom:Message>
    </wsnmom:Messages>
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from lxml import etree
from wsnmom.core.app_headers import (
    TRACE_HEADERS,
    AppHeaders,
    HeaderRefused,
    validated,
    with_trace,
)
from wsnmom.core.model import InboundNotification, NotificationMessage

from .faults import BaseFaultError, xsd_datetime
from .xml import WSNMOM, qname

__all__ = [
    "HEADER",
    "MESSAGES",
    "MESSAGE_INFO",
    "apply_app_headers",
    "messages_header",
    "parse_message_headers",
    "parse_messages_header",
    "request_header",
    "trace_headers",
]

MESSAGES = qname(WSNMOM, "Messages")
MESSAGE_INFO = qname(WSNMOM, "Message")
HEADER = qname(WSNMOM, "Header")


def messages_header(messages: Sequence[NotificationMessage]) -> etree._Element:
    """The ``wsnmom:Messages`` header block for ``messages``."""
    info = etree.Element(MESSAGES, nsmap={"wsnmom": WSNMOM})
    for message in messages:
        item = etree.SubElement(info, MESSAGE_INFO, id=message.message_id)
        if message.published_at is not None:
            item.set("published", xsd_datetime(message.published_at))
        for name, value in message.headers:
            etree.SubElement(item, HEADER, name=name).text = value
    return info


def request_header(per_message: Sequence[Sequence[tuple[str, str]]]) -> etree._Element | None:
    """The ``wsnmom:Messages`` block a publisher sends with a Notify: the application
    headers of each of its NotificationMessages, in order; None when none has any."""
    if not any(per_message):
        return None
    info = etree.Element(MESSAGES, nsmap={"wsnmom": WSNMOM})
    for pairs in per_message:
        item = etree.SubElement(info, MESSAGE_INFO)
        for name, value in pairs:
            etree.SubElement(item, HEADER, name=name).text = value
    return info


def _items(headers: Sequence[etree._Element]) -> list[etree._Element] | None:
    info = next((h for h in headers if h.tag == MESSAGES), None)
    return None if info is None else [i for i in info if i.tag == MESSAGE_INFO]


def parse_messages_header(
    headers: Sequence[etree._Element], count: int
) -> list[tuple[str | None, str | None]]:
    """(message id, published xsd:dateTime) per message from a ``wsnmom:Messages`` header
    among ``headers``; (None, None) each when there is none or it does not fit ``count``."""
    items = _items(headers) or []
    if len(items) != count:
        return [(None, None)] * count
    return [(i.get("id"), i.get("published")) for i in items]


def _pairs(item: etree._Element) -> list[tuple[str, str]]:
    return [(h.get("name") or "", h.text or "") for h in item if h.tag == HEADER]


def parse_message_headers(headers: Sequence[etree._Element], count: int) -> list[AppHeaders]:
    """The application headers per message from a ``wsnmom:Messages`` header among
    ``headers`` (as a consumer reads them: lenient, () each when it does not fit)."""
    items = _items(headers) or []
    if len(items) != count:
        return [()] * count
    out: list[AppHeaders] = []
    for item in items:
        try:
            out.append(validated(_pairs(item)))
        except HeaderRefused:
            out.append(())
    return out


def trace_headers(environ: Mapping[str, object] | None) -> AppHeaders:
    """The W3C trace context of an HTTP request (``traceparent``, ``tracestate``) as
    application headers; a malformed one is left out (W3C: a receiver ignores it)."""
    if environ is None:
        return ()
    found: list[tuple[str, str]] = []
    for name in TRACE_HEADERS:
        value = environ.get("HTTP_" + name.upper())
        if isinstance(value, str) and value:
            found.append((name, value.strip()))
    try:
        return validated(found)
    except HeaderRefused:
        return ()


def apply_app_headers(
    headers: Sequence[etree._Element],
    messages: list[InboundNotification],
    trace: AppHeaders = (),
) -> list[InboundNotification]:
    """``messages`` with the application headers of a Notify: those of a
    ``wsnmom:Messages`` header among ``headers`` (one ``wsnmom:Message`` per
    NotificationMessage, or one for all of them), then the HTTP request's trace context
    where a message has none of its own.  A block that fits neither count, or a header
    that breaks a rule of ``core.app_headers``, is a BaseFault naming it."""
    items = _items(headers)
    per_message: list[AppHeaders]
    if items is None or not items:
        per_message = [()] * len(messages)
    elif len(items) not in (1, len(messages)):
        raise BaseFaultError(
            f"wsnmom:Messages has {len(items)} wsnmom:Message elements for "
            f"{len(messages)} NotificationMessages (give one per message, or one for all)"
        )
    else:
        try:
            parsed = [validated(_pairs(item)) for item in items]
        except HeaderRefused as exc:
            raise BaseFaultError(f"wsnmom:Messages: {exc}") from None
        per_message = parsed * len(messages) if len(parsed) == 1 else parsed
    if not trace and not any(per_message):
        return messages
    return [
        dataclasses.replace(m, headers=with_trace(h, trace))
        for m, h in zip(messages, per_message, strict=True)
    ]
