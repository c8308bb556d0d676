"""Gateway settings: dataclasses loaded from a TOML file, ``WSNMOM_`` environment variables
and command-line overrides.

Precedence (highest first): CLI overrides > environment > TOML file > defaults.

TOML layout mirrors the dataclasses; top-level scalars plus one table per section::

    adapter_url = "amqp://guest:guest@localhost/"
    store_url = "sqlite:///./wsnmom-data/store.db"
    port = 8080

    [termination]
    default = "PT1H"          # xsd:duration or a number of seconds
    maximum = "P30D"
    allow_infinite = false

    [retry]
    max_attempts = 8
    give_up = "end"           # "keep" | "end"

Environment variables use ``__`` for nesting: ``WSNMOM_PORT=9090``,
``WSNMOM_RETRY__MAX_ATTEMPTS=3``, ``WSNMOM_OUTBOUND__DENY=10.0.0.0/8,*.internal``
(lists are comma separated; booleans accept 1/0, true/false, yes/no, on/off).
Durations accept ISO 8601 / xsd:duration (``PT30S``) or a number of seconds.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import isodate

ENV_PREFIX = "WSNMOM_"


class ConfigError(ValueError):
    """A setting has an unusable value."""


@dataclass(slots=True)
class TerminationSettings:
    """Lifetimes of subscriptions, pull points and registrations (architecture §7)."""

    #: granted when Subscribe / CreatePullPoint / RegisterPublisher gives no time
    default: timedelta = timedelta(hours=1)
    #: longest lifetime granted; a longer request is refused with the
    #: Unacceptable(Initial)TerminationTimeFault (ITT-03 / REN-04 forbid granting less)
    maximum: timedelta | None = timedelta(days=30)
    #: whether ``xsi:nil`` (infinite) requests are granted
    allow_infinite: bool = False
    #: pull points: default lifetime (CreatePullPoint has no lifetime parameter)
    pull_point_default: timedelta = timedelta(days=1)
    #: publisher registrations: default lifetime
    registration_default: timedelta = timedelta(days=1)
    #: how often the lifetime scheduler looks for expired resources
    sweep_interval: timedelta = timedelta(seconds=1)


@dataclass(slots=True)
class RetrySettings:
    """Push delivery retries (NCIA §2.3.2)."""

    #: delivery attempts per batch, the first one included
    max_attempts: int = 8
    initial_delay: timedelta = timedelta(seconds=1)
    multiplier: float = 2.0
    max_delay: timedelta = timedelta(minutes=5)
    #: after ``max_attempts``: "keep" retries at ``max_delay`` forever while the
    #: middleware accumulates; "end" ends the subscription (SubscriptionEnd is published)
    give_up: Literal["keep", "end"] = "end"
    #: timeout of one outbound Notify, seconds
    timeout: float = 10.0


@dataclass(slots=True)
class LimitSettings:
    """What a subscription or pull point accumulates (architecture §7); None = unbounded."""

    max_messages: int | None = 100_000
    max_bytes: int | None = 256 * 1024 * 1024
    #: retention: messages older than this are discarded undelivered
    max_age: timedelta | None = timedelta(days=7)
    overflow: Literal["drop_oldest", "drop_newest"] = "drop_oldest"
    #: when a push subscription's backlog reaches ``max_messages``: "drop" (apply
    #: ``overflow`` and go on) or "end" (end the subscription, SubscriptionEnd published;
    #: checked by the lifetime sweep)
    on_full: Literal["drop", "end"] = "drop"
    #: cap on messages one GetMessages returns when MaximumNumber is absent or 0
    get_messages_cap: int = 1000


@dataclass(slots=True)
class DeliverySettings:
    """Push delivery engine."""

    #: worker threads shared by all push subscriptions
    workers: int = 8
    #: notifications per outbound Notify (wrapped form; raw sends one per message)
    batch_size: int = 10
    #: unsettled messages per subscription held in memory
    prefetch: int = 64


@dataclass(slots=True)
class OutboundSettings:
    """Which consumer / publisher addresses the broker may call (architecture §9)."""

    #: host patterns (fnmatch) or CIDR networks that are allowed; empty = all
    allow: list[str] = field(default_factory=list)
    #: host patterns or CIDR networks that are refused
    deny: list[str] = field(default_factory=list)
    allow_loopback: bool = True
    allow_link_local: bool = False
    #: URL schemes allowed for consumer addresses
    schemes: list[str] = field(default_factory=lambda: ["http", "https"])


@dataclass(slots=True)
class Settings:
    """Everything the gateway can be configured with."""

    adapter_url: str = "embedded://./wsnmom-data"
    #: adapter-specific options passed to the adapter constructor
    adapter_options: dict[str, Any] = field(default_factory=dict)
    store_url: str = "sqlite:///./wsnmom-data/store.db"
    host: str = "127.0.0.1"
    port: int = 8080
    #: base URL clients reach the gateway at; default ``http://host:port``
    public_url: str | None = None
    #: waitress worker threads
    threads: int = 16
    max_request_bytes: int = 10 * 1024 * 1024
    #: Notify only from registered publishers (RequiresRegistration)
    requires_registration: bool = False
    #: FixedTopicSet: only topics of the configured namespaces / topic list
    fixed_topic_set: bool = False
    #: WS-Topics TopicNamespace documents to load
    topic_namespaces: list[str] = field(default_factory=list)
    #: forward the publisher's ProducerReference to consumers (False: anonymous)
    forward_producer_reference: bool = True
    #: seconds the middleware may take to confirm a Notify's messages before the Notify
    #: is answered with a fault (the messages may still arrive: a retry can duplicate
    #: them).  One persistent message routed into 10,000 RabbitMQ queues took over 10 s
    #: to confirm on a busy one-CPU broker.
    publish_timeout: float = 30.0
    log_level: str = "INFO"
    termination: TerminationSettings = field(default_factory=TerminationSettings)
    retry: RetrySettings = field(default_factory=RetrySettings)
    limits: LimitSettings = field(default_factory=LimitSettings)
    delivery: DeliverySettings = field(default_factory=DeliverySettings)
    outbound: OutboundSettings = field(default_factory=OutboundSettings)

    @property
    def base_url(self) -> str:
        """``public_url`` without a trailing slash (default ``http://host:port``)."""
        url = self.public_url or f"http://{self.host}:{self.port}"
        return url.rstrip("/")


# --------------------------------------------------------------------------------------------
# conversion
# --------------------------------------------------------------------------------------------


def parse_duration(value: object) -> timedelta:
    """A duration from seconds (int/float/numeric string), ``timedelta`` or xsd:duration."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ConfigError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        return timedelta(seconds=value)
    if isinstance(value, str):
        text = value.strip()
        try:
            return timedelta(seconds=float(text))
        except ValueError:
            pass
        try:
            parsed = isodate.parse_duration(text)
        except (isodate.ISO8601Error, ValueError) as exc:
            raise ConfigError(f"not a duration: {value!r}") from exc
        if isinstance(parsed, timedelta):
            return parsed
        approx: timedelta = parsed.totimedelta(start=_EPOCH)  # years/months: approximated
        return approx
    raise ConfigError(f"not a duration: {value!r}")


_EPOCH = datetime(2000, 1, 1)

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _parse_bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    if isinstance(value, int):
        return bool(value)
    raise ConfigError(f"not a boolean: {value!r}")


def _is_none_text(value: object) -> bool:
    return isinstance(value, str) and value.strip().lower() in {"", "none", "null", "unbounded"}


def _convert(value: object, tp: Any, name: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if (value is None or _is_none_text(value)) and len(args) < len(typing.get_args(tp)):
            return None
        return _convert(value, args[0], name)
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{name}: {value!r} is not one of {allowed}")
        return value
    if origin is list:
        (item,) = typing.get_args(tp)
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{name}: expected a list, got {value!r}")
        return [_convert(v, item, name) for v in value]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{name}: expected a table, got {value!r}")
        return dict(value)
    if tp is timedelta:
        return parse_duration(value)
    if tp is bool:
        return _parse_bool(value)
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{name}: not an integer: {value!r}")
        try:
            return int(value)  # type: ignore[call-overload]
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{name}: not an integer: {value!r}") from exc
    if tp is float:
        try:
            return float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{name}: not a number: {value!r}") from exc
    if tp is str:
        return str(value)
    if tp is Any:
        return value
    raise ConfigError(f"{name}: unsupported setting type {tp!r}")


def _apply(obj: Any, data: Mapping[str, Any], where: str) -> None:
    hints = typing.get_type_hints(type(obj))
    names = {f.name for f in dataclasses.fields(obj)}
    for key, value in data.items():
        attr = key.replace("-", "_").lower()
        if attr not in names:
            raise ConfigError(f"{where}: unknown setting {key!r}")
        tp = hints[attr]
        current = getattr(obj, attr)
        if dataclasses.is_dataclass(current) and not isinstance(current, type):
            if not isinstance(value, Mapping):
                raise ConfigError(f"{where}: {key!r} must be a table")
            _apply(current, value, f"{where}.{attr}")
        else:
            setattr(obj, attr, _convert(value, tp, f"{where}.{attr}"))


def _nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in flat.items():
        parts = key.lower().split("__")
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def env_overrides(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Settings from ``WSNMOM_*`` variables, nested on ``__``."""
    env = os.environ if environ is None else environ
    flat = {k[len(ENV_PREFIX) :]: v for k, v in env.items() if k.startswith(ENV_PREFIX)}
    flat.pop("CONFIG", None)  # WSNMOM_CONFIG names the file, it is not a setting
    return _nest(flat)


def load_settings(
    config_file: str | Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Build settings: defaults < TOML file < environment < ``overrides`` (CLI).

    ``config_file`` defaults to ``$WSNMOM_CONFIG`` when set.  ``overrides`` keys may be
    nested mappings or ``section__name`` flat keys; None values are ignored.
    """
    env = os.environ if environ is None else environ
    settings = Settings()
    path = config_file or env.get(ENV_PREFIX + "CONFIG")
    if path:
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read configuration file {path}: {exc}") from exc
        _apply(settings, data, str(path))
    _apply(settings, env_overrides(env), "environment")
    if overrides:
        clean = {k: v for k, v in overrides.items() if v is not None}
        _apply(settings, _nest(clean), "command line")
    validate(settings)
    return settings


def validate(settings: Settings) -> None:
    """Reject combinations that cannot work."""
    t = settings.termination
    if t.default <= timedelta(0):
        raise ConfigError("termination.default must be positive")
    if t.maximum is not None and t.maximum < t.default:
        raise ConfigError("termination.maximum must not be shorter than termination.default")
    r = settings.retry
    if r.max_attempts < 1:
        raise ConfigError("retry.max_attempts must be at least 1")
    if r.multiplier < 1.0:
        raise ConfigError("retry.multiplier must be >= 1")
    if settings.delivery.workers < 1 or settings.delivery.batch_size < 1:
        raise ConfigError("delivery.workers and delivery.batch_size must be at least 1")
    if settings.limits.get_messages_cap < 1:
        raise ConfigError("limits.get_messages_cap must be at least 1")
    if not settings.publish_timeout > 0:
        raise ConfigError("publish_timeout must be a positive number of seconds")
