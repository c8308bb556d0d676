"""The MQTT buffer: makes MQTT replayable for Spark by appending what an MQTT session
receives to a notification log (``spark_bridge.log``) before acknowledging it; the
``wsn_log`` source then reads the log by sequence number.

The buffer is a *tap* of the MQTT adapter's own session, used through the adapter's public
surface (``wsnmom.adapters.mqtt.public``: its settings, taps and ``TapSession``), so it
reads MQTT exactly as a gateway does:

* **Persistent session, QoS 1, acknowledged after the append**: clean start false (MQTT
  3.1.1: clean session false) with a session expiry, QoS 1 subscriptions under a stable
  client id; the session's worker appends a batch to the log (``synchronous=FULL``) and
  only then sends the PUBACKs, in arrival order, on the connection the messages came on.
  After a crash between the two the broker sends the messages again (DUP flag); the log
  recognises them by their ``wsnmom-message-id`` user property or, for a native message
  without one, by its content digest among the most recent records.
* **Topics and metadata as the MQTT adapter maps them**: the adapter's namespace prefixes
  (``namespaces``) and ``topic_prefix``, its derived roots, its ``wsnmom-*`` MQTT 5 user
  properties, Content Type and sniffed media types (MQTT 3.1.1: topic and body only);
  retained messages sent on subscribing are not new notifications and are left out; a
  selection's overlapping filters are made disjoint, so no message is appended twice.
* **What is kept**: every message whose routing topic the selection's topic patterns match
  (exactly, as a subscription's queue: ``p:a//c`` is subscribed as ``a/+/#`` and only the
  matching topics are appended); the ``wsn_log`` source applies the whole selection again
  (a source may select less than its buffer, never more).

Two ways to run it:

* **standalone**, ``wsnmom spark-buffer`` (:class:`MqttBuffer`): a session of its own whose
  only consumer is the log; its state (client id, subscribed filters) is kept next to the
  log (``<log>.session/``);
* **inside the gateway**, the MQTT adapter option ``spark_logs`` (:data:`LOG_TAPS`, which
  the adapter's ``TAP_PROVIDERS`` names): the log is one more consumer of the gateway's
  session, next to the subscriptions' queues, so Spark reads exactly what the gateway
  receives without a second session.

No pyspark here.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wsnmom.adapters.mqtt.public import Arrival, MqttSettings, Tap, TapSession, parse_settings
from wsnmom.core.adapter import HEADER_MESSAGE_ID

from .log import Entry, NotificationLog
from .selection import Compiled, Selection, parse_mapping

__all__ = [
    "LOG_TAPS",
    "BufferSettings",
    "LogAppender",
    "LogTapConfig",
    "MqttBuffer",
    "default_client_id",
    "log_taps",
    "parse_log_taps",
]

log = logging.getLogger("wsnmom.spark_bridge.buffer")

#: seconds between two trims of a log with a retention (``keep``)
TRIM_EVERY = 60.0


def _digest(topic: str, body: bytes, headers: Mapping[str, str], content_type: str) -> str:
    h = hashlib.sha256()
    for part in (
        topic.encode(),
        body,
        repr(sorted(headers.items())).encode(),
        content_type.encode(),
    ):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()


class LogAppender:
    """A tap's sink: appends arrivals to a notification log, each once, and deletes records
    older than ``keep_seconds`` (checked at most every ``TRIM_EVERY`` seconds)."""

    def __init__(
        self,
        notification_log: NotificationLog,
        *,
        dedupe_window: int = 10_000,
        keep_seconds: float | None = None,
    ) -> None:
        self.log = notification_log
        self.dedupe_window = dedupe_window
        self.keep_seconds = keep_seconds
        self.appended = 0
        self.duplicates = 0
        self._next_trim = time.monotonic() + TRIM_EVERY
        self._lock = threading.Lock()

    def __call__(self, arrivals: Sequence[Arrival]) -> None:
        entries: list[Entry] = []
        for a in arrivals:
            m = a.message
            dedupe = m.headers.get(HEADER_MESSAGE_ID) or None
            entries.append(
                Entry(
                    native=a.name,
                    topic=m.topic,
                    body=m.body,
                    headers=dict(m.headers),
                    content_type=m.content_type,
                    dedupe=dedupe,
                    digest=None if dedupe else _digest(a.name, m.body, m.headers, m.content_type),
                )
            )
        results = self.log.append(
            entries, redelivered=[a.redelivered for a in arrivals], window=self.dedupe_window
        )
        added = sum(1 for r in results if r is not None)
        self.appended += added
        self.duplicates += len(results) - added
        self.trim_if_due()

    def trim_if_due(self) -> int:
        """Delete the records older than ``keep_seconds`` when a trim is due."""
        if self.keep_seconds is None or time.monotonic() < self._next_trim:
            return 0
        with self._lock:
            self._next_trim = time.monotonic() + TRIM_EVERY
            removed = self.log.trim_older(self.keep_seconds)
        if removed:
            log.info(
                "log %s: trimmed %d record(s) older than %ss",
                self.log.path,
                removed,
                self.keep_seconds,
            )
        return removed


def _tap(
    name: str, path: str, selection: Selection, stream: str | None, appender_options: dict[str, Any]
) -> tuple[Tap, LogAppender]:
    compiled = Compiled(selection)
    notification_log = NotificationLog(path, name=stream, middleware="mqtt")
    appender = LogAppender(notification_log, **appender_options)
    return Tap(name, compiled.patterns, appender, close=notification_log.close), appender


# -- inside the gateway -------------------------------------------------------------------------


@dataclass(frozen=True)
class LogTapConfig:
    """One entry of the MQTT adapter option ``spark_logs``."""

    name: str
    path: str
    selection: Selection
    keep_seconds: float | None = None
    dedupe_window: int = 10_000


_TAP_KEYS = {"path", "topic", "dialect", "namespaces", "keep", "dedupe_window"}


def parse_log_taps(options: Mapping[str, Mapping[str, Any]]) -> list[LogTapConfig]:
    """The ``spark_logs`` option (log name -> ``path``, ``topic``, ``dialect``,
    ``namespaces``, ``keep`` in seconds, ``dedupe_window``), checked: ValueError (a
    ``SelectionError`` for an expression a subscription could not have) for anything
    unusable."""
    out: list[LogTapConfig] = []
    for name, entry in options.items():
        unknown = set(entry) - _TAP_KEYS
        if unknown:
            raise ValueError(f"{name}: unknown options {sorted(unknown)}")
        path = entry.get("path")
        if not path or not isinstance(path, str):
            raise ValueError(f"{name}: path (the log file) is missing")
        namespaces = entry.get("namespaces")
        selection = Selection(
            topic=entry.get("topic") or None,
            dialect=entry.get("dialect") or None,
            namespaces=parse_mapping(namespaces, f"{name}: namespaces"),
        )
        selection.compile()
        keep = entry.get("keep")
        out.append(
            LogTapConfig(
                name=str(name),
                path=str(Path(path).expanduser()),
                selection=selection,
                keep_seconds=float(keep) if keep is not None else None,
                dedupe_window=int(entry.get("dedupe_window", 10_000)),
            )
        )
    return out


def log_taps(options: Mapping[str, Mapping[str, Any]]) -> list[Tap]:
    """The taps of the gateway's MQTT session that keep the logs of ``spark_logs`` (each
    log's stream is its name in ``spark_logs``)."""
    taps: list[Tap] = []
    for config in parse_log_taps(options):
        tap, _ = _tap(
            f"spark-log:{config.name}",
            config.path,
            config.selection,
            config.name,
            {"keep_seconds": config.keep_seconds, "dedupe_window": config.dedupe_window},
        )
        taps.append(tap)
    return taps


class _LogTaps:
    """The provider of the ``spark_logs`` taps (``TapProvider`` of the MQTT adapter)."""

    def check(self, value: Any) -> None:
        parse_log_taps(value)

    def taps(self, value: Any) -> list[Tap]:
        return log_taps(value)


#: what the MQTT adapter's ``TAP_PROVIDERS`` names for its option ``spark_logs``
LOG_TAPS = _LogTaps()


# -- standalone ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class BufferSettings:
    """What ``wsnmom spark-buffer`` is told (see the module docstring).

    ``url`` is an MQTT adapter URL and may carry the adapter's options as query arguments
    (``?topic_prefix=wsn&protocol=3.1.1``); ``roots`` are the adapter's ``namespaces``
    (namespace URI -> MQTT topic prefix); ``adapter_options`` any further adapter options.
    """

    url: str
    log_path: str
    client_id: str
    selection: Selection = field(default_factory=Selection)
    roots: Mapping[str, str] = field(default_factory=dict)
    topic_prefix: str | None = None
    #: the log's stream name (default: the file name without extension)
    name: str | None = None
    #: MQTT 5 session expiry interval, seconds (the longest outage the broker bridges)
    session_expiry: int = 7 * 24 * 3600
    protocol: str = "5"
    keepalive: int = 30
    #: messages appended per transaction at most
    batch: int = 500
    #: records searched for a redelivered message's digest
    dedupe_window: int = 10_000
    keep_seconds: float | None = None
    ca_file: str | None = None
    insecure: bool = False
    adapter_options: Mapping[str, Any] = field(default_factory=dict)

    def mqtt_settings(self) -> MqttSettings:
        """The MQTT adapter's settings for the buffer's session (ValueError if unusable)."""
        options: dict[str, Any] = {
            "namespaces": dict(self.roots),
            "client_id": self.client_id,
            "session_expiry": self.session_expiry,
            "protocol": self.protocol,
            "keepalive": self.keepalive,
            "ingest_batch": self.batch,
            "tls_insecure": self.insecure,
        }
        if self.topic_prefix:
            options["topic_prefix"] = self.topic_prefix
        if self.ca_file:
            options["ca_certs"] = self.ca_file
        options.update(self.adapter_options)
        return parse_settings(self.url, options)


class MqttBuffer:
    """``wsnmom spark-buffer``: an MQTT session of its own whose only consumer is a log."""

    def __init__(self, settings: BufferSettings) -> None:
        self.settings = settings
        self.mqtt = settings.mqtt_settings()
        tap, self.appender = _tap(
            "spark-buffer",
            settings.log_path,
            settings.selection,
            settings.name,
            {"dedupe_window": settings.dedupe_window, "keep_seconds": settings.keep_seconds},
        )
        self.log = self.appender.log
        try:
            self.session = TapSession(self.mqtt, str(settings.log_path) + ".session", [tap])
        except BaseException:
            self.log.close()
            raise
        #: the MQTT filters the session subscribes
        self.filters = self.session.filters
        self.client_id = self.session.client_id
        self._stop = threading.Event()

    @property
    def appended(self) -> int:
        """Messages appended by this run."""
        return self.appender.appended

    @property
    def duplicates(self) -> int:
        """Redelivered messages recognised and not appended again."""
        return self.appender.duplicates

    @property
    def session_present(self) -> bool:
        """Whether the broker still had the buffer's session at the last connect."""
        return self.session.session_present

    def start(self) -> None:
        """Connect, subscribe and start appending; ``AdapterError`` (``AdapterUnavailable``
        when the broker does not answer within the session's timeouts)."""
        self._stop.clear()
        self.session.start()

    def stop(self) -> None:
        """Append and acknowledge what arrived, then disconnect (the session stays on the
        broker, which queues for it)."""
        self._stop.set()
        self.session.stop()

    def run(self) -> None:
        """Run until interrupted (SIGINT/SIGTERM through KeyboardInterrupt/SystemExit);
        trims the log while it is quiet too."""
        self.start()
        try:
            while not self._stop.wait(1.0):
                self.appender.trim_if_due()
        finally:
            self.stop()


def default_client_id() -> str:
    """A client id for a new buffer (give the same one on every start: it names the
    broker-side session)."""
    return "wsnmom-spark-" + uuid.uuid4().hex[:12]
