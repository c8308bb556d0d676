"""What every confluent-kafka client of the adapter shares: the reachability of the cluster
(``Health``), librdkafka's log lines in Python logging, and turning a consumed Kafka
message into a ``LogRecord``.

Reachability
    librdkafka reconnects by itself and tells little: an error callback reports "all
    brokers down" when every connection failed, but a broker that stops answering with its
    connections open (overloaded, or stopped with SIGSTOP) is noticed only when requests
    time out, a minute later by default.  ``Health`` therefore also probes the cluster
    every ``health_interval`` seconds with a metadata request for the internal topic that
    must answer within ``health_timeout``: one failed probe, or "all brokers down" from
    the producer or the probing admin client, makes ``available`` False, and the next
    answered probe (asked for at once) makes it True again.  The other clients (readers,
    the position store's admin clients) are side clients: their "all brokers down" only
    asks for a probe at once.  Such a client has one connection, which the broker may
    close on purpose (tansu does at the first offset commit of a group deleted before);
    taken as an outage, that refused every Notify with 503 until the next probe while
    the cluster served all the other clients.  Every lost
    connection bumps ``epoch``, which the readers use to check whether topics were
    re-created behind their back (a memory-only broker that restarted).  A publish that
    waits longer than usual asks for a probe at once (``poke``) and fails when the cluster
    has not answered since it began (``answered_since``), so a broker that stops while
    a Notify waits does not hold it for the whole publish timeout.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import KafkaError, Message
from wsnmom.adapters.logbase.backend import LogRecord
from wsnmom.adapters.native import sniff_content_type
from wsnmom.topic_mapping.model import Topic

from .mapping import CONTENT_TYPE_HEADERS, HEADER_CONTENT_TYPE, KafkaMapping

__all__ = [
    "CONTENT_TYPE_HEADERS",
    "HEADER_CONTENT_TYPE",
    "Health",
    "kafka_logger",
    "message_topic",
    "record_from_message",
    "record_from_parts",
]

log = logging.getLogger("wsnmom.adapters.kafka")

#: librdkafka's own log lines (connection failures etc.)
kafka_logger = logging.getLogger("wsnmom.adapters.kafka.librdkafka")

#: error codes that mean a connection or the whole cluster went away
_DOWN = {KafkaError._ALL_BROKERS_DOWN}
_LOST = {KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE}
#: errors that no retry will cure
_FATAL_AUTH = {
    KafkaError._AUTHENTICATION,
    KafkaError.SASL_AUTHENTICATION_FAILED,
    KafkaError._SSL,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
}


class Health:
    """What the adapter knows about the cluster's reachability (see the module docstring).
    Thread-safe; ``available`` answers without I/O."""

    def __init__(self, interval: float, timeout: float) -> None:
        self.interval = interval
        self.timeout = timeout
        self.available = False
        #: bumped whenever a connection is lost (readers re-check topic ids)
        self.epoch = 0
        #: the last error no retry cures (authentication, authorisation), if any
        self.fatal: KafkaError | None = None
        #: why the cluster was last found unreachable (``_set``)
        self.reason = "the adapter is not open"
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._stop = threading.Event()
        #: set to probe now (``poke``) or to stop
        self._wake = threading.Event()
        #: when a probe was last answered (monotonic)
        self._answered = time.monotonic()
        self._thread: threading.Thread | None = None

    def error_cb(self, error: KafkaError) -> None:
        """librdkafka's ``error_cb`` of the producer and the probing admin client."""
        self._error(error, side=False)

    def side_error_cb(self, error: KafkaError) -> None:
        """librdkafka's ``error_cb`` of the side clients: "all brokers down" only asks for
        a probe (see the module docstring)."""
        self._error(error, side=True)

    def _error(self, error: KafkaError, *, side: bool) -> None:
        code = error.code()
        if code in _FATAL_AUTH:
            self.fatal = error
            log.error("Kafka refused the gateway's credentials or rights: %s", error.str())
        if code in _LOST:
            with self._lock:
                self.epoch += 1
        if code in _DOWN:
            if side:
                log.info("a Kafka client lost its connections (%s); probing", error.str())
            else:
                self._set(False, error.str())
            self.poke()
        else:
            log.debug("Kafka client error: %s", error.str())

    def _set(self, available: bool, why: str = "") -> None:
        with self._lock:
            if available == self.available:
                return
            self.available = available
            if not available:
                self.epoch += 1
                self.reason = why
            self._changed.notify_all()
        if available:
            log.info("the Kafka cluster answers again")
        else:
            log.warning("the Kafka cluster is unreachable: %s", why)

    def poke(self) -> None:
        """Probe now rather than at the next interval."""
        self._wake.set()

    def answered_since(self, when: float) -> bool:
        """Whether a probe was answered after ``when`` (monotonic)."""
        return self._answered > when

    def wait_answered(self, since: float, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a probe answered after ``since`` (monotonic;
        ``poke`` first for one at once); True at once when nothing probes (not started, or
        stopped: the adapter closes), since no answer would come."""
        with self._changed:
            return self._changed.wait_for(
                lambda: self._thread is None or self._answered > since, max(0.0, timeout)
            )

    def wait_available(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the cluster to be reachable."""
        with self._changed:
            if not self.available and timeout > 0:
                self._changed.wait_for(lambda: self.available, timeout)
            return self.available

    def start(self, probe: Callable[[float], None]) -> None:
        """Probe with ``probe(timeout)`` (raises when the cluster does not answer) on a
        thread of its own until ``stop``."""
        self._stop.clear()
        self._wake.clear()
        self._answered = time.monotonic()
        self._set(True)

        def run() -> None:
            while True:
                self._wake.wait(self.interval)
                self._wake.clear()
                if self._stop.is_set():
                    return
                try:
                    probe(self.timeout)
                except Exception as exc:
                    self._set(False, str(exc))
                else:
                    with self._lock:
                        self._answered = time.monotonic()
                        self._changed.notify_all()
                    self._set(True)

        self._thread = threading.Thread(target=run, name="wsnmom-kafka-health", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop probing; ``available`` is False afterwards."""
        self._stop.set()
        self._wake.set()
        with self._lock:
            thread, self._thread = self._thread, None
            self._changed.notify_all()  # ends ``wait_answered``
        if thread is not None:
            thread.join(timeout=self.timeout + self.interval + 1)
        with self._lock:
            self.available = False
            self.reason = "the adapter is closed"


def client_hooks(health: Health, *, side: bool = False) -> dict[str, Any]:
    """The configuration entries that connect a client to ``health`` and logging
    (``side``: a side client, see the module docstring).

    librdkafka's log lines are queued (``log.queue``) and handed to Python logging by the
    client's own ``poll``/``consume`` (the publisher's poll thread, the readers, the
    health probe), never from librdkafka's threads: with a ``logger`` called from them, the
    producer's broker thread spent 285-550 us of CPU per message instead of 70-130 under
    16 concurrent publishing threads (even with no line logged), halving the throughput."""
    error_cb = health.side_error_cb if side else health.error_cb
    return {"error_cb": error_cb, "logger": kafka_logger, "log.queue": True}


# -- records --------------------------------------------------------------------------------


def _headers(raw: Any) -> dict[str, str]:
    if not raw:
        return {}
    out: dict[str, str] = {}
    for key, value in raw.items() if isinstance(raw, dict) else raw:
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        out[key] = value if value is not None else ""
    return out


def _details(
    found: dict[str, str], value: bytes | None, millis: int | None
) -> tuple[bytes, dict[str, str], str, datetime | None]:
    """Body, headers (content-type headers taken out), media type and timestamp of a record
    from its converted headers, its value and its timestamp in ms (None: unknown)."""
    body = value or b""
    content_type = ""
    for name in CONTENT_TYPE_HEADERS:
        header = found.pop(name, None)
        if header and not content_type:
            content_type = header
    if not content_type:
        content_type = sniff_content_type(body)
    stamp = datetime.fromtimestamp(millis / 1000, UTC) if millis and millis > 0 else None
    return body, found, content_type, stamp


def message_topic(message: Message, mapping: KafkaMapping) -> tuple[Topic, dict[str, str] | None]:
    """The WS topic of a consumed message (no error), and its decoded headers when they
    had to be read for it: for a per-path topic the mapping's cached answer, else from
    the key and headers."""
    log_name = message.topic()
    assert log_name is not None
    topic = mapping.cached_log_topic(log_name)
    if topic is not None:
        return topic, None
    headers = _headers(message.headers())
    return mapping.record_topic(log_name, message.key(), headers), headers


def record_from_message(
    message: Message,
    mapping: KafkaMapping,
    known: tuple[Topic, dict[str, str] | None] | None = None,
) -> LogRecord:
    """The ``LogRecord`` of a consumed message (no error).  Only what routing needs is
    converted now (the WS topic, or ``known``: ``message_topic``'s answer); body,
    headers, media type and timestamp on first use."""
    log_name = message.topic()
    assert log_name is not None
    topic, headers = known if known is not None else message_topic(message, mapping)

    def details() -> tuple[bytes, dict[str, str], str, datetime | None]:
        found = dict(headers) if headers is not None else _headers(message.headers())
        kind, millis = message.timestamp()
        return _details(found, message.value(), millis if kind else None)

    return LogRecord(
        (log_name, message.partition() or 0), message.offset() or 0, topic, details=details
    )


def record_from_parts(
    mapping: KafkaMapping,
    log_name: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    raw_headers: Any,
    millis: int | None,
) -> LogRecord:
    """The ``LogRecord`` of a record given field by field (a row of Spark's own Kafka
    source); ``raw_headers``: ``(name, bytes)`` pairs or a dict."""
    headers = _headers(raw_headers)
    topic = mapping.record_topic(log_name, key, headers)
    body, found, content_type, stamp = _details(headers, value, millis)
    return LogRecord((log_name, partition), offset, topic, body, found, content_type, stamp)
