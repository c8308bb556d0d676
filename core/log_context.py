"""The request id carried into log records.

The SOAP frontend binds the id of the request it is handling (``X-Request-Id``) with
:func:`bound_request_id`; every log record emitted in that context gets it as
``record.request_id`` through :class:`RequestIdFilter` (installed on the gateway's log
handler).  Work that continues elsewhere (a delivery thread sending what a Notify
published) keeps the id by capturing :func:`current_request_id` when the work is queued
and running it inside ``bound_request_id(captured)``.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = [
    "RequestIdFilter",
    "bound_request_id",
    "current_request_id",
    "new_request_id",
    "usable_request_id",
]

_request_id: ContextVar[str | None] = ContextVar("wsnmom_request_id", default=None)

#: what an id taken from a client may look like (anything else is replaced, so a header
#: cannot inject text into log lines)
_USABLE = re.compile(r"[A-Za-z0-9._:/+=@-]{1,128}")


def current_request_id() -> str | None:
    """The request id bound in this context, if any."""
    return _request_id.get()


#: new ids: a random prefix per process and a counter (unique without a uuid4 per request,
#: which cost more than the rest of the request-id handling together)
_PREFIX = secrets.token_hex(8)
_COUNTER = itertools.count(1)


def _new_prefix() -> None:
    """A process forked from one that imported this module (a pre-forking supervisor, the
    test suite's zygote) draws its own prefix: the ids stay unique per process."""
    global _PREFIX, _COUNTER
    _PREFIX = secrets.token_hex(8)
    _COUNTER = itertools.count(1)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_prefix)


def new_request_id() -> str:
    """A fresh request id (32 hex digits: 16 random per process, 16 counting)."""
    return f"{_PREFIX}{next(_COUNTER):016x}"


def usable_request_id(value: str | None) -> str | None:
    """``value`` when it is safe to log and echo, else None."""
    if value and _USABLE.fullmatch(value):
        return value
    return None


@contextmanager
def bound_request_id(value: str | None) -> Iterator[None]:
    """Make ``value`` the request id of log records emitted inside the block."""
    token = _request_id.set(value)
    try:
        yield
    finally:
        _request_id.reset(token)


class RequestIdFilter(logging.Filter):
    """Sets ``record.request_id`` (None outside a request); never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = _request_id.get()
        return True
