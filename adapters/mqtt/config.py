"""The MQTT adapter's settings: the connection string and options, parsed once.

Pure functions and a frozen dataclass; nothing here imports paho-mqtt.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qsl, unquote, urlsplit

from wsnmom.core.adapter_options import (
    NOT_AN_OPTION,
    AdapterOptionError,
    option,
    parse_options,
)

__all__ = ["MqttSettings", "parse_settings"]

SCHEMES = ("mqtt", "mqtts")
Protocol = Literal["5", "3.1.1"]

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


def _protocol(value: Any) -> Protocol:
    text = str(value).strip().lower()
    if text not in _PROTOCOLS:
        raise ValueError(f"protocol must be 5 or 3.1.1, not {text!r}")
    return _PROTOCOLS[text]


def _prefix(value: Any, what: str = "topic_prefix") -> str:
    text = str(value).strip("/")
    if not text or any(not level or level in ("+", "#") for level in text.split("/")):
        raise ValueError(f"{what}: {value!r} is not a topic prefix")
    if "+" in text or "#" in text or "\x00" in text:
        raise ValueError(f"{what}: {value!r} has a wildcard")
    if text.startswith("$"):
        raise ValueError(f"{what}: MQTT topics starting with $ are reserved")
    return text


def _topic_prefix(value: Any) -> str:
    return _prefix(value) if value else ""


def _share_group(value: Any) -> str:
    text = str(value)
    if any(c in text for c in "/+#\x00"):
        raise ValueError(f"dead_letter_share: {value!r} may not contain '/', '+' or '#'")
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


def _directory(value: Any) -> str | None:
    return os.path.abspath(os.path.expanduser(str(value))) if value else None


def _text(value: Any) -> str | None:
    """A text option where an empty value means "not set"."""
    return str(value) if value is not None and value != "" else None


def _synchronous(value: Any) -> str:
    text = str(value).upper()
    if text not in ("NORMAL", "FULL"):
        raise ValueError("synchronous must be NORMAL or FULL")
    return text


@dataclass(frozen=True, slots=True)
class MqttSettings:
    """Everything the adapter reads from its URL and options (see the adapter docstring).

    The fields declared with :func:`~wsnmom.core.adapter_options.option` are the adapter's
    options; ``host``, ``port`` and ``tls`` come from the URL."""

    host: str = field(metadata=NOT_AN_OPTION)
    port: int = field(metadata=NOT_AN_OPTION)
    tls: bool = field(default=False, metadata=NOT_AN_OPTION)
    username: str | None = option(None, parse=_text, doc="user name (also from the URL)")
    password: str | None = option(
        None, parse=_text, secret=True, doc="password (also from the URL)"
    )
    protocol: Protocol = option("5", parse=_protocol, doc="`5` or `3.1.1`")
    namespaces: Mapping[str, str] = option(
        default_factory=dict, parse=_namespaces, doc="namespace URI -> MQTT topic prefix"
    )
    topic_prefix: str = option(
        "", parse=_topic_prefix, doc="levels in front of every MQTT topic of the gateway"
    )
    dead_letter_share: str = option(
        "wsnmom",
        parse=_share_group,
        doc="MQTT 5: the shared-subscription group (`$share/<group>/...`) the gateways of "
        "one topic prefix read their dead letters through, so that each dead letter is "
        "held by one of them; empty: each gateway holds a copy of every one",
    )
    data_dir: str | None = option(
        None,
        parse=_directory,
        doc="queues and session state live in `<data_dir>/mqtt` (default: the gateway's "
        "data directory)",
    )
    client_id: str | None = option(
        None,
        parse=_text,
        doc="the session's client id (default `wsnmom-<random>`, kept); the publisher is "
        "`<client_id>-p`",
    )
    keepalive: int = option(30, minimum=1, doc="MQTT keep-alive, seconds")
    session_expiry: int = option(
        NEVER, minimum=0, maximum=NEVER, doc="MQTT 5 session expiry asked for, seconds"
    )
    receive_maximum: int = option(
        1000,
        minimum=1,
        maximum=65535,
        doc="unacknowledged QoS 1 messages the broker may send the session",
    )
    publish_window: int = option(
        1000,
        minimum=1,
        doc="unacknowledged QoS 1 publishes (also at most the broker's Receive Maximum)",
    )
    connect_timeout: float = option(10.0, doc="seconds `open()` waits for the broker")
    subscribe_timeout: float = option(10.0, doc="seconds a Subscribe waits for the broker")
    reconnect_min_delay: float = option(0.2, doc="shortest reconnect backoff, seconds")
    reconnect_max_delay: float = option(10.0, doc="longest reconnect backoff, seconds")
    retain: bool = option(True, doc="publish with RETAIN; GetCurrentMessage from retained messages")
    retained_wait: float = option(
        0.0, doc="extra seconds to wait for a retained message after the UNSUBACK"
    )
    max_message_bytes: int | None = option(
        None, doc="largest body accepted (default: the broker's Maximum Packet Size, if it says)"
    )
    qos0_backlog: int = option(
        10_000,
        minimum=1,
        doc="QoS 0 messages waiting to be stored beyond which new ones are dropped",
    )
    ingest_batch: int = option(512, minimum=1, doc="messages stored per transaction")
    synchronous: str = option(
        "NORMAL",
        parse=_synchronous,
        doc="the queues' SQLite durability: `NORMAL`, or `FULL` (also survives power loss)",
    )
    ca_certs: str | None = option(None, parse=_text, doc="CA certificates file (`mqtts://`)")
    certfile: str | None = option(None, parse=_text, doc="client certificate file")
    keyfile: str | None = option(None, parse=_text, secret=True, doc="client key file")
    tls_insecure: bool = option(False, doc="do not check the broker's host name")
    #: Spark buffer logs the session feeds (name -> the log's options, read by
    #: ``wsnmom.spark_bridge.buffer``); only from the options mapping, not the URL
    spark_logs: Mapping[str, Mapping[str, Any]] = option(
        default_factory=dict,
        parse=_spark_logs,
        doc="table of Spark buffer logs the session also feeds (see the MQTT page)",
    )

    def __post_init__(self) -> None:
        if self.client_id is not None and not 0 < len(self.client_id.encode()) <= 65535:
            raise ValueError("client_id must be 1 to 65535 bytes")

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


def parse_settings(url: str, options: Mapping[str, Any] | None = None) -> MqttSettings:
    """Settings from ``mqtt[s]://[user[:password]@]host[:port][?option=value...]`` and the
    options mapping (options win over query arguments).

    :raises AdapterOptionError: (a ValueError) for anything unusable."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise AdapterOptionError(
            "not an MQTT URL: expected mqtt://host[:port] or mqtts://host[:port]"
        )
    if not parts.hostname:
        raise AdapterOptionError("the MQTT URL needs a host")
    if parts.path not in ("", "/"):
        raise AdapterOptionError("the MQTT URL takes no path")
    tls = parts.scheme == "mqtts"
    try:
        port = parts.port or (8883 if tls else 1883)
    except ValueError as exc:
        raise AdapterOptionError(f"bad port in the MQTT URL: {exc}") from None
    fixed: dict[str, Any] = {"host": parts.hostname, "port": port, "tls": tls}
    query = parse_qsl(parts.query, keep_blank_values=True)
    if parts.username is not None:
        query.insert(0, ("username", unquote(parts.username)))
    if parts.password is not None:
        query.insert(1, ("password", unquote(parts.password)))
    return parse_options(MqttSettings, adapter="MQTT", query=query, options=options, fixed=fixed)
