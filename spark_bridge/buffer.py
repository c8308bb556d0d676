"""The MQTT buffer: a durable subscriber that makes MQTT replayable for Spark
(``wsnmom spark-buffer``).

MQTT keeps no log: a broker only queues messages for a persistent session while its client
is away.  The buffer holds such a session and appends every message to a notification log
(``spark_bridge.log``) *before* it acknowledges it; the ``wsn_log`` source then reads the
log by sequence number.  So:

* **Persistent session, QoS 1**: MQTT 5 ``clean_start=False`` with a session expiry
  interval (MQTT 3.1.1: ``clean_session=False``), subscriptions at QoS 1, a stable client
  id.  While the buffer is down the broker queues for it (up to the broker's limits, e.g.
  mosquitto's ``max_queued_messages``, and the session expiry).
* **Manual acknowledgement**: PUBACK is sent only after the message is committed to the
  log (``synchronous=FULL``), in the order the messages arrived.  A crash between the
  two makes the broker redeliver; the log recognises the redelivery by the message's
  ``wsnmom-message-id`` (MQTT 5 user property) or, for a redelivered native message
  without one, by its content digest among the most recent records, and does not append
  it twice.
* **Topics as the gateway maps them**: the WS-Topics expression is compiled exactly as
  for a subscription (``selection``), translated with ``topic_mapping``'s MQTT syntax into
  topic filters (``+``, ``#``; a ``//`` in mid-path widens to ``#`` and the ``wsn_log``
  source applies the residual filter), and every message's MQTT topic name is mapped
  back to its WS topic with the same namespace roots as the gateway's MQTT adapter
  (``roots``: namespace URI -> root levels; other namespaces use derived roots).
  Metadata travels as MQTT 5 user properties (``wsnmom-*``) and the content type
  property; a message without a content type gets one sniffed from its body.

No pyspark here.  The buffer appends in groups (up to ``batch`` messages or ``linger``
seconds) so that one fsync covers many messages.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import ssl
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

from wsnmom.core.adapter import HEADER_MESSAGE_ID, is_internal_namespace
from wsnmom.core.codec import PULL_POINT_NAMESPACE, sniff_content_type
from wsnmom.topic_mapping.errors import NameNotRepresentable
from wsnmom.topic_mapping.model import PathPattern, Topic
from wsnmom.topic_mapping.syntax import MQTT
from wsnmom.topic_mapping.translate import NamespaceRoots, native_to_topic, translate

from .log import Entry, NotificationLog
from .selection import Compiled, Selection

__all__ = ["BufferSettings", "MqttBuffer", "MqttNames"]

log = logging.getLogger("wsnmom.spark_bridge.buffer")


class MqttNames:
    """WS topics <-> MQTT topic names and filters, with the gateway's namespace roots."""

    def __init__(self, roots: Mapping[str, str]) -> None:
        self.roots = NamespaceRoots.for_syntax(roots, MQTT)
        # internal namespaces map back to themselves, so their traffic is recognised
        self.roots.register(PULL_POINT_NAMESPACE)

    def filters(self, patterns: Sequence[PathPattern] | None) -> list[str]:
        """The MQTT topic filters of a subscription's patterns (None: ``#``)."""
        if patterns is None:
            return ["#"]
        for pattern in patterns:
            self.roots.register(pattern.namespace)
        translation = translate(patterns, MQTT, self.roots)
        return list(dict.fromkeys(p.pattern for p in translation.patterns))

    def topic_of(self, name: str) -> Topic:
        """The WS topic of an MQTT topic name (NameNotRepresentable when it has none)."""
        return native_to_topic(None, name, MQTT, self.roots)


@dataclass(frozen=True)
class BufferSettings:
    """What ``wsnmom spark-buffer`` is told (see the module docstring)."""

    url: str
    log_path: str
    client_id: str
    selection: Selection = field(default_factory=Selection)
    roots: Mapping[str, str] = field(default_factory=dict)
    #: the log's stream name (default: the file name without extension)
    name: str | None = None
    #: MQTT 5 session expiry interval, seconds (the longest outage the broker bridges)
    session_expiry: int = 7 * 24 * 3600
    protocol: str = "5"
    keepalive: int = 30
    batch: int = 500
    linger: float = 0.02
    #: records searched for a redelivered message's digest
    dedupe_window: int = 10_000
    ca_file: str | None = None
    insecure: bool = False


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


class MqttBuffer:
    """One buffer: a paho client feeding a writer thread that appends and acknowledges."""

    def __init__(self, settings: BufferSettings) -> None:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        self.settings = settings
        parts = urlsplit(settings.url)
        if parts.scheme not in ("mqtt", "mqtts", "tcp", "ssl"):
            raise ValueError(f"not an MQTT URL: {settings.url!r} (mqtt://host:1883)")
        self.host = parts.hostname or "127.0.0.1"
        self.tls = parts.scheme in ("mqtts", "ssl")
        self.port = parts.port or (8883 if self.tls else 1883)
        self.names = MqttNames(settings.roots)
        self.compiled = Compiled(settings.selection)
        self.filters = self.names.filters(self.compiled.patterns)
        self.log = NotificationLog(settings.log_path, name=settings.name, middleware="mqtt")
        self.v5 = settings.protocol in ("5", "5.0", "v5")
        protocol = mqtt.MQTTv5 if self.v5 else mqtt.MQTTv311
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=settings.client_id,
            clean_session=None if self.v5 else False,
            protocol=protocol,
            manual_ack=True,
        )
        if parts.username:
            self.client.username_pw_set(unquote(parts.username), unquote(parts.password or ""))
        if self.tls:
            context = ssl.create_default_context(cafile=settings.ca_file)
            if settings.insecure:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            self.client.tls_set_context(context)
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.client.on_disconnect = self._on_disconnect
        self.client.on_subscribe = self._on_subscribe
        self._queue: queue.Queue[Any] = queue.Queue()
        self._stop = threading.Event()
        self._writer: threading.Thread | None = None
        self.connected = threading.Event()
        #: set once the broker acknowledged the subscriptions of the current connection
        self.subscribed = threading.Event()
        #: the broker still had our session at the last connect
        self.session_present = False
        self.appended = 0
        self.duplicates = 0
        self.dropped = 0
        self.error: BaseException | None = None

    # -- paho callbacks (network thread) --------------------------------------------------
    def _on_connect(
        self, client: Any, _userdata: Any, flags: Any, reason: Any, _props: Any
    ) -> None:
        if reason.is_failure:
            log.error("MQTT broker %s:%d refused the buffer: %s", self.host, self.port, reason)
            return
        self.session_present = bool(getattr(flags, "session_present", False))
        self.subscribed.clear()
        from paho.mqtt.subscribeoptions import SubscribeOptions

        if self.v5:
            client.subscribe([(f, SubscribeOptions(qos=1)) for f in self.filters])
        else:
            client.subscribe([(f, 1) for f in self.filters])
        log.info(
            "buffer %s connected to %s:%d (session present: %s), filters %s",
            self.settings.client_id,
            self.host,
            self.port,
            self.session_present,
            self.filters,
        )
        self.connected.set()

    def _on_disconnect(self, *_args: Any) -> None:
        self.connected.clear()
        self.subscribed.clear()

    def _on_subscribe(self, _client: Any, _userdata: Any, _mid: Any, reasons: Any, _p: Any) -> None:
        refused = [r for r in reasons if getattr(r, "is_failure", False) or r == 128]
        if refused:
            log.error(
                "the MQTT broker refused the buffer's subscriptions %s: %s", self.filters, refused
            )
            return
        self.subscribed.set()

    def _on_message(self, _client: Any, _userdata: Any, message: Any) -> None:
        self._queue.put(message)

    # -- the writer thread ----------------------------------------------------------------
    def _entry(self, message: Any) -> Entry | None:
        name = message.topic
        try:
            topic = self.names.topic_of(name)
        except (NameNotRepresentable, ValueError) as exc:
            log.warning("buffer drops a message on %r: no WS topic (%s)", name, exc)
            return None
        if is_internal_namespace(topic.namespace):
            return None  # a pull point inbox copy: never a subscriber's notification
        headers: dict[str, str] = {}
        content_type = ""
        props = getattr(message, "properties", None)
        if props is not None:
            for key, value in getattr(props, "UserProperty", None) or []:
                headers[str(key)] = str(value)
            content_type = getattr(props, "ContentType", "") or ""
        body = bytes(message.payload)
        if not content_type:
            content_type = sniff_content_type(body)
        dedupe = headers.get(HEADER_MESSAGE_ID) or None
        return Entry(
            native=name,
            topic=topic,
            body=body,
            headers=headers,
            content_type=content_type,
            dedupe=dedupe,
            digest=None if dedupe else _digest(name, body, headers, content_type),
        )

    def _write(self) -> None:
        settings = self.settings
        try:
            while not self._stop.is_set() or not self._queue.empty():
                try:
                    first = self._queue.get(timeout=0.1)
                except queue.Empty:
                    continue
                batch = [first]
                deadline = time.monotonic() + settings.linger
                while len(batch) < settings.batch:
                    left = deadline - time.monotonic()
                    try:
                        batch.append(
                            self._queue.get(timeout=max(0.0, left))
                            if left > 0
                            else self._queue.get_nowait()
                        )
                    except queue.Empty:
                        break
                self._append(batch)
        except BaseException as exc:  # the buffer must not ack what it could not store
            self.error = exc
            log.exception(
                "buffer %s stops: appending to %s failed", settings.client_id, self.log.path
            )
            self._stop.set()
            self.client.disconnect()
        finally:
            self.log.close()

    def _append(self, batch: list[Any]) -> None:
        entries: list[Entry] = []
        kept: list[Any] = []
        for message in batch:
            entry = self._entry(message)
            if entry is None:
                self.dropped += 1
            else:
                entries.append(entry)
                kept.append(message)
        if entries:
            results = self.log.append(
                entries,
                redelivered=[bool(m.dup) for m in kept],
                window=self.settings.dedupe_window,
            )
            self.appended += sum(1 for r in results if r is not None)
            self.duplicates += sum(1 for r in results if r is None)
        # durable now: acknowledge, in arrival order
        for message in batch:
            if message.qos > 0:
                self.client.ack(message.mid, message.qos)

    # -- life cycle -----------------------------------------------------------------------
    def start(self, timeout: float = 10.0) -> None:
        """Connect, subscribe and start appending; TimeoutError when the broker has not
        acknowledged the connection and the subscriptions within ``timeout`` seconds."""
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        self._stop.clear()
        self._writer = threading.Thread(target=self._write, name="wsnmom-spark-buffer", daemon=True)
        self._writer.start()
        self.client.reconnect_delay_set(1, 5)
        if self.v5:
            props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            props.SessionExpiryInterval = self.settings.session_expiry
            self.client.connect_async(
                self.host, self.port, self.settings.keepalive, clean_start=False, properties=props
            )
        else:
            self.client.connect_async(self.host, self.port, self.settings.keepalive)
        self.client.loop_start()
        if not self.subscribed.wait(timeout):
            self.stop()
            raise TimeoutError(
                f"the MQTT broker {self.host}:{self.port} did not accept the buffer's "
                f"connection and subscriptions {self.filters} within {timeout:.0f}s"
            )

    def stop(self) -> None:
        """Disconnect (the session stays on the broker) after appending what arrived."""
        self.client.disconnect()
        self.client.loop_stop()
        self._stop.set()
        if self._writer is not None:
            self._writer.join(timeout=30)
            self._writer = None

    def run(self, keep_seconds: float | None = None) -> None:
        """Run until interrupted (SIGINT/SIGTERM through KeyboardInterrupt/SystemExit),
        trimming records older than ``keep_seconds`` once a minute."""
        self.start()
        next_trim = time.monotonic() + 60
        try:
            while not self._stop.wait(1.0):
                if keep_seconds is not None and time.monotonic() >= next_trim:
                    removed = self.log.trim_older(keep_seconds)
                    if removed:
                        log.info(
                            "buffer trimmed %d record(s) older than %ss", removed, keep_seconds
                        )
                    next_trim = time.monotonic() + 60
        finally:
            self.stop()
        if self.error is not None:
            raise RuntimeError(f"the buffer stopped: {self.error}") from self.error


def default_client_id() -> str:
    """A client id for a new buffer (give the same one on every start: it names the
    broker-side session)."""
    return "wsnmom-spark-" + uuid.uuid4().hex[:12]
