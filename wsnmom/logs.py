"""Logging of a running gateway: one stderr handler, text or JSON lines, request ids, and
quiet third-party libraries.

:func:`configure_logging` is called once by ``wsnmom serve`` with the settings:

* the root level is ``log_level``; third-party libraries (:data:`QUIET_LOGGERS`) log only
  WARNING and above (or less when ``log_level`` is stricter), and pika's connection
  loggers nothing below CRITICAL (the adapter reports connection changes itself), unless
  ``log_levels`` names them or a parent (``pika``);
* pika's warning for every channel the broker closes with 404 NOT_FOUND, or with 406
  PRECONDITION_FAILED "inequivalent arg", is dropped (the RabbitMQ adapter probes for
  exchanges passively, and declares queues that may exist with other arguments -- a
  cluster's quorum queues met by a single instance, say --, and handles both answers
  itself), unless pika's logger is set to DEBUG, which shows it at DEBUG; any other 406
  (a vhost's queue limit) stays a warning;
* every line is passed through ``core.redaction.redact_text``: URL passwords and values of
  secret-named options (``sasl.password=...``) never reach the log, whoever logs them;
* ``log_format = "json"`` writes one JSON object per line: ``time``, ``level``, ``logger``,
  ``message``, ``request_id`` (when known), ``exception`` (with a traceback), and any
  ``extra=`` fields the call passed.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, TextIO

from wsnmom.core.log_context import RequestIdFilter
from wsnmom.core.redaction import redact_text

__all__ = ["QUIET_LOGGERS", "JsonFormatter", "TextFormatter", "configure_logging"]

#: third-party loggers kept at WARNING by default, and loggers kept quieter still
QUIET_LOGGERS: Mapping[str, int] = {
    "pika": logging.WARNING,
    # a failed connection attempt or a lost connection: 4-6 ERROR lines from these; the
    # RabbitMQ adapter logs each state change (cannot connect, lost, reconnected) once
    "pika.connection": logging.CRITICAL,
    "pika.adapters.base_connection": logging.CRITICAL,
    "pika.adapters.utils.connection_workflow": logging.CRITICAL,
    "pika.adapters.utils.io_services_utils": logging.CRITICAL,
    "urllib3": logging.WARNING,
    "requests": logging.WARNING,
    "waitress": logging.WARNING,
    "werkzeug": logging.WARNING,
    "kafka": logging.WARNING,
    "confluent_kafka": logging.WARNING,
    "paho": logging.WARNING,
    "testcontainers": logging.WARNING,
    "docker": logging.WARNING,
}

#: attributes every LogRecord has; anything else on a record came from ``extra=``
_STANDARD = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys()
    | {"message", "asctime", "request_id", "taskName"}
)

#: marks the handler this module installed, so that a second call replaces it
_HANDLER_MARK = "_wsnmom_handler"


class TextFormatter(logging.Formatter):
    """``time LEVEL logger: message`` plus `` request_id=...`` inside a request."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        request_id = getattr(record, "request_id", None)
        if request_id:
            head, sep, tail = text.partition("\n")
            text = f"{head} request_id={request_id}{sep}{tail}"
        return redact_text(text)


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None)
        if request_id:
            entry["request_id"] = request_id
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return redact_text(json.dumps(entry, default=str, ensure_ascii=False))


def _expected_close(args: tuple[object, ...]) -> bool:
    """Whether a Channel.Close's (code, text, ...) is an answer the adapter expects and
    handles: 404 (a passive declaration's "no such exchange/queue") or a 406 that says the
    queue exists with other arguments."""
    code = args[0]
    text = args[1] if len(args) > 1 else ""
    return code == 404 or (code == 406 and "inequivalent arg" in str(text))


class _ExpectedChannelClose(logging.Filter):
    """Drops pika's "Received remote Channel.Close" warnings that are expected answers
    (:func:`_expected_close`), or shows them at DEBUG when pika's logger allows DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not (
            record.levelno == logging.WARNING
            and isinstance(record.msg, str)
            and record.msg.startswith("Received remote Channel.Close")
            and record.args
            and isinstance(record.args, tuple)
            and _expected_close(record.args)
        ):
            return True
        if not logging.getLogger(record.name).isEnabledFor(logging.DEBUG):
            return False
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


_channel_filter = _ExpectedChannelClose()


def configure_logging(
    level: str = "INFO",
    log_format: str = "text",
    levels: Mapping[str, str] | None = None,
    stream: TextIO | None = None,
) -> logging.Handler:
    """Install the gateway's log handler on the root logger (replacing one installed
    before) and set the levels; returns the handler."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(old)
    handler = logging.StreamHandler(stream or sys.stderr)
    setattr(handler, _HANDLER_MARK, True)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    handler.addFilter(RequestIdFilter())
    root.addHandler(handler)
    root_level = logging.getLevelNamesMapping()[level.upper()]
    root.setLevel(root_level)
    for name, quiet in QUIET_LOGGERS.items():
        logging.getLogger(name).setLevel(max(quiet, root_level))
    for name, value in (levels or {}).items():
        logging.getLogger(name).setLevel(value.upper())
        for child in QUIET_LOGGERS:  # quieter children follow a level set on a parent
            if child.startswith(name + ".") and child not in (levels or {}):
                logging.getLogger(child).setLevel(logging.NOTSET)
    channel = logging.getLogger("pika.channel")
    if _channel_filter not in channel.filters:
        channel.addFilter(_channel_filter)
    return handler
