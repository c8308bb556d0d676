"""The MQTT adapter's settings: the connection string and options, parsed once.

Pure functions and a frozen dataclass; nothing here imports paho-mqtt.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qsl, unquote, urlsplit

__all__ = ["MqttSettings", "parse_settings", "redact_url"]

SCHEMES = ("mqtt", "mqtts")
Protocol = Literal["5", "3.1.1"]

#: shown instead of a password
REDACTED = "***"
#: "never expires" for the MQTT 5 session expiry interval
NEVER = 0xFFFFFFFF

_PROTOCOLS: dict[str, Protocol] = {
    "5": "5",
    "5.0": "5",
    "v5": "5",
    "mqttv5": "5",
    "3.1.1": "3.1.1",
    "311": "3.1.1",
    "v311": "3.1.1",
    "mqttv311": "3.1.1",
}


@dataclass(frozen=True, slots=True)
class MqttSettings:
    """Everything the adapter reads from its URL and options (see the adapter docstring)."""

    host: str
    port: int
    tls: bool = False
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    protocol: Protocol = "5"
    #: namespace URI -> root levels ("org/wsn")
    namespaces: Mapping[str, str] = field(default_factory=dict)
    #: levels in front of every MQTT topic of the gateway ("" for none)
    topic_prefix: str = ""
    #: where the session's queues and state live (the gateway's data directory + "/mqtt")
    data_dir: str | None = None
    client_id: str | None = None
    keepalive: int = 30
    session_expiry: int = NEVER
    receive_maximum: int = 1000
    #: QoS 1 messages the publisher has unacknowledged at most (also capped by the broker's
    #: Receive Maximum on MQTT 5)
    publish_window: int = 1000
    connect_timeout: float = 10.0
    subscribe_timeout: float = 10.0
    reconnect_min_delay: float = 0.2
    reconnect_max_delay: float = 10.0
    retain: bool = True
    retained_wait: float = 0.0
    max_message_bytes: int | None = None
    qos0_backlog: int = 10_000
    ingest_batch: int = 512
    synchronous: str = "NORMAL"
    ca_certs: str | None = None
    certfile: str | None = None
    keyfile: str | None = field(default=None, repr=False)
    tls_insecure: bool = False
    #: Spark buffer logs the session feeds (name -> the log's options, read by
    #: ``wsnmom.spark_bridge.buffer``); only from the options mapping, not the URL
    spark_logs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def v5(self) -> bool:
        """MQTT 5 (properties, reason codes, subscription identifiers)."""
        return self.protocol == "5"

    @property
    def queue_dir(self) -> str:
        """The directory of the gateway-kept queues and the session state."""
        assert self.data_dir is not None
        return os.path.join(self.data_dir, "mqtt")

    def redacted(self) -> dict[str, Any]:
        """The settings for log lines and ``repr``, secrets left out."""
        return {
            "host": self.host,
            "port": self.port,
            "tls": self.tls,
            "username": self.username,
            "protocol": self.protocol,
            "client_id": self.client_id,
            "data_dir": self.data_dir,
        }


def redact_url(url: str) -> str:
    """``url`` without the password of its user part."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{parts.username or ''}:{REDACTED}@{host}").geturl()


_INT_OPTIONS = (
    "keepalive",
    "session_expiry",
    "receive_maximum",
    "publish_window",
    "qos0_backlog",
    "ingest_batch",
)
_FLOAT_OPTIONS = (
    "connect_timeout",
    "subscribe_timeout",
    "reconnect_min_delay",
    "reconnect_max_delay",
    "retained_wait",
)
_STR_OPTIONS = ("client_id", "username", "password", "ca_certs", "certfile", "keyfile")
_BOOL_OPTIONS = ("retain", "tls_insecure")


def _bool(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name} must be true or false, not {value!r}")


def _prefix(value: Any, what: str) -> str:
    text = str(value).strip("/")
    if not text or any(not level or level in ("+", "#") for level in text.split("/")):
        raise ValueError(f"{what}: {value!r} is not a topic prefix")
    if "+" in text or "#" in text or "\x00" in text:
        raise ValueError(f"{what}: {value!r} has a wildcard")
    if text.startswith("$"):
        raise ValueError(f"{what}: MQTT topics starting with $ are reserved")
    return text


def _namespaces(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError("namespaces must be a table: namespace URI -> topic prefix")
    return {str(ns): _prefix(root, f"namespaces[{ns!r}]") for ns, root in value.items()}


def _spark_logs(value: Any) -> dict[str, dict[str, Any]]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(v, Mapping) for v in value.values()):
        raise ValueError("spark_logs must be a table of tables: log name -> its options")
    return {str(name): dict(options) for name, options in value.items()}


def parse_settings(url: str, options: Mapping[str, Any] | None = None) -> MqttSettings:
    """Settings from ``mqtt[s]://[user[:password]@]host[:port][?option=value...]`` and the
    options mapping (options win over query arguments).  ValueError for anything unusable."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise ValueError("not an MQTT URL: expected mqtt://host[:port] or mqtts://host[:port]")
    if not parts.hostname:
        raise ValueError("the MQTT URL needs a host")
    if parts.path not in ("", "/"):
        raise ValueError("the MQTT URL takes no path")
    tls = parts.scheme == "mqtts"
    try:
        port = parts.port or (8883 if tls else 1883)
    except ValueError as exc:
        raise ValueError(f"bad port in the MQTT URL: {exc}") from None
    merged: dict[str, Any] = dict(parse_qsl(parts.query, keep_blank_values=True))
    merged.update(options or {})
    kwargs: dict[str, Any] = {"host": parts.hostname, "port": port, "tls": tls}
    if parts.username is not None:
        kwargs["username"] = unquote(parts.username)
    if parts.password is not None:
        kwargs["password"] = unquote(parts.password)
    protocol = str(merged.pop("protocol", "5")).strip().lower()
    if protocol not in _PROTOCOLS:
        raise ValueError(f"protocol must be 5 or 3.1.1, not {protocol!r}")
    kwargs["protocol"] = _PROTOCOLS[protocol]
    kwargs["namespaces"] = _namespaces(merged.pop("namespaces", None))
    kwargs["spark_logs"] = _spark_logs(merged.pop("spark_logs", None))
    prefix = merged.pop("topic_prefix", None)
    if prefix:
        kwargs["topic_prefix"] = _prefix(prefix, "topic_prefix")
    data_dir = merged.pop("data_dir", None)
    if data_dir:
        kwargs["data_dir"] = os.path.abspath(os.path.expanduser(str(data_dir)))
    for name in _INT_OPTIONS:
        if name in merged:
            kwargs[name] = int(merged.pop(name))
    for name in _FLOAT_OPTIONS:
        if name in merged:
            kwargs[name] = float(merged.pop(name))
    for name in _STR_OPTIONS:
        if name in merged:
            value = merged.pop(name)
            kwargs[name] = str(value) if value is not None and value != "" else None
    for name in _BOOL_OPTIONS:
        if name in merged:
            kwargs[name] = _bool(merged.pop(name), name)
    if "max_message_bytes" in merged:
        value = merged.pop("max_message_bytes")
        kwargs["max_message_bytes"] = int(value) if value not in (None, "") else None
    if "synchronous" in merged:
        kwargs["synchronous"] = str(merged.pop("synchronous")).upper()
    if merged:
        raise ValueError(f"unknown MQTT adapter options: {sorted(merged)}")
    settings = MqttSettings(**kwargs)
    if not 1 <= settings.receive_maximum <= 65535:
        raise ValueError("receive_maximum must be between 1 and 65535")
    if not 0 <= settings.session_expiry <= NEVER:
        raise ValueError("session_expiry must be between 0 and 4294967295 seconds")
    if settings.keepalive < 1:
        raise ValueError("keepalive must be at least 1 second")
    if settings.client_id is not None and not 0 < len(settings.client_id.encode()) <= 65535:
        raise ValueError("client_id must be 1 to 65535 bytes")
    if settings.synchronous not in ("NORMAL", "FULL"):
        raise ValueError("synchronous must be NORMAL or FULL")
    if settings.ingest_batch < 1 or settings.qos0_backlog < 1 or settings.publish_window < 1:
        raise ValueError("ingest_batch, qos0_backlog and publish_window must be at least 1")
    return settings
