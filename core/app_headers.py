"""Application headers: name/value pairs a publisher attaches to a notification, carried
as middleware headers and handed to every consumer of that notification.

They arrive in a Notify's ``wsnmom:Messages`` SOAP header (one ``wsnmom:Message`` per
NotificationMessage, each with ``wsnmom:Header name="..."`` children) and, for W3C trace
context, as the HTTP headers ``traceparent``/``tracestate``; natively published messages
bring theirs as the middleware's own headers.  They travel under their own names, so a
native consumer sees ``traceparent`` where it expects it.

Names the gateway or the middleware use for themselves are reserved: ``wsnmom-*``,
``x-*`` (RabbitMQ's ``x-death``, ``x-delivery-count`` ...) and ``content-type`` (the Kafka
adapter's content type).  From a client, a reserved, malformed or oversized header is an
error (:class:`HeaderRefused`, a precise fault); from the middleware it is left out,
since native producers may send anything.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

__all__ = [
    "MAX_HEADERS",
    "MAX_NAME",
    "MAX_TOTAL",
    "MAX_VALUE",
    "TRACE_HEADERS",
    "AppHeaders",
    "HeaderRefused",
    "from_middleware",
    "refusal",
    "validated",
    "with_trace",
]

#: what a notification's application headers are: (name, value) pairs in order, names
#: unique (case-insensitively)
AppHeaders = tuple[tuple[str, str], ...]

MAX_HEADERS = 16
MAX_NAME = 64
MAX_VALUE = 1024
#: names plus values of one message
MAX_TOTAL = 8192

#: the W3C trace context headers, carried from a Notify's HTTP request
TRACE_HEADERS = ("traceparent", "tracestate")

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")
_RESERVED_PREFIXES = ("wsnmom-", "x-")
_RESERVED_NAMES = frozenset({"content-type"})
# printable ASCII and tab: what every middleware (AMQP short strings aside) and HTTP carry
_VALUE = re.compile(r"[\t\x20-\x7e]*\Z")


class HeaderRefused(ValueError):
    """A client's application header breaks a rule (the message names which)."""


def refusal(name: str, value: str) -> str | None:
    """Why the header ``name: value`` may not be carried, or None when it may."""
    if not name or len(name) > MAX_NAME or not _NAME.match(name):
        return f"header name {name[:MAX_NAME]!r} is not 1-{MAX_NAME} of A-Z a-z 0-9 . _ -"
    lowered = name.lower()
    if lowered in _RESERVED_NAMES or lowered.startswith(_RESERVED_PREFIXES):
        return f"header name {name!r} is reserved (wsnmom-*, x-*, content-type)"
    if len(value) > MAX_VALUE:
        return f"header {name!r} is longer than {MAX_VALUE} characters"
    if not _VALUE.match(value):
        return f"header {name!r} has characters other than printable ASCII"
    return None


def validated(pairs: Iterable[tuple[str, str]]) -> AppHeaders:
    """``pairs`` as application headers; :class:`HeaderRefused` for the first broken rule
    (a bad name or value, a name given twice, more than :data:`MAX_HEADERS`, more than
    :data:`MAX_TOTAL` characters in all)."""
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    total = 0
    for name, value in pairs:
        reason = refusal(name, value)
        if reason is not None:
            raise HeaderRefused(reason)
        if name.lower() in seen:
            raise HeaderRefused(f"header {name!r} is given more than once")
        seen.add(name.lower())
        total += len(name) + len(value)
        out.append((name, value))
    if len(out) > MAX_HEADERS:
        raise HeaderRefused(f"{len(out)} headers, at most {MAX_HEADERS} per message")
    if total > MAX_TOTAL:
        raise HeaderRefused(f"headers of {total} characters, at most {MAX_TOTAL} per message")
    return tuple(out)


def from_middleware(headers: Mapping[str, object]) -> AppHeaders:
    """The application headers among a middleware message's ``headers``: every string
    header that :func:`refusal` allows, within the count and size bounds (the rest is
    left out, never an error)."""
    out: list[tuple[str, str]] = []
    total = 0
    for name, value in headers.items():
        if not isinstance(value, str) or refusal(name, value) is not None:
            continue
        total += len(name) + len(value)
        if len(out) == MAX_HEADERS or total > MAX_TOTAL:
            break
        out.append((name, value))
    return tuple(out)


def with_trace(headers: AppHeaders, trace: AppHeaders) -> AppHeaders:
    """``headers`` with the trace context ``trace`` (from the HTTP request) added where the
    message does not carry its own: a message's own headers win."""
    if not trace:
        return headers
    present = {name.lower() for name, _ in headers}
    extra = tuple((n, v) for n, v in trace if n.lower() not in present)
    return headers + extra if extra else headers
