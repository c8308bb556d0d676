"""Turning raw setting values (TOML values, environment strings, command-line values) into
the types of :mod:`wsnmom.core.config`'s dataclasses, and checking their ranges.

:func:`convert` raises :class:`InvalidValue` with the problem only ("not a duration:
'5min'"); :mod:`wsnmom.core.config` adds the setting's name and where the value came from.
Ranges and choices are declared on the dataclass fields with :func:`limits`.
:class:`ConfigError` is the error with both (defined here, below every settings module;
imported from :mod:`wsnmom.core.config`).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import re
import types
import typing
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, Literal
from urllib.parse import urlsplit

import isodate
from wsnmom.core.dead_letter_records import check_destination

__all__ = [
    "LOG_LEVELS",
    "ConfigError",
    "InvalidValue",
    "check_log_level",
    "check_statuses",
    "convert",
    "limits",
    "parse_duration",
]

#: the level names ``log_level`` and ``log_levels`` accept (case-insensitive)
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class InvalidValue(ValueError):
    """A raw value cannot be used for a setting (the message says why, without the name)."""


class ConfigError(ValueError):
    """A setting has an unusable value (the message names it and where it came from)."""


def limits(
    minimum: float | None = None,
    maximum: float | None = None,
    *,
    above: float | None = None,
    check: str | None = None,
) -> dict[str, Any]:
    """Field metadata: inclusive ``minimum``/``maximum``, exclusive ``above`` (numbers;
    durations in seconds), or a named ``check`` ("log_level", "http_url", "networks",
    "gateway_id")."""
    return {"minimum": minimum, "maximum": maximum, "above": above, "check": check}


# --------------------------------------------------------------------------------------------
# scalar parsers
# --------------------------------------------------------------------------------------------

_EPOCH = datetime(2000, 1, 1)
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def parse_duration(value: object) -> timedelta:
    """A duration from seconds (int/float/numeric string), ``timedelta`` or xsd:duration."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise InvalidValue(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise InvalidValue(f"not a duration: {value!r}")
        return timedelta(seconds=value)
    if isinstance(value, str):
        text = value.strip()
        try:
            seconds = float(text)
        except ValueError:
            pass
        else:
            if not math.isfinite(seconds):
                raise InvalidValue(f"not a duration: {value!r}")
            return timedelta(seconds=seconds)
        try:
            parsed = isodate.parse_duration(text)
        except (isodate.ISO8601Error, ValueError) as exc:
            raise InvalidValue(
                f"not a duration: {value!r} (use seconds or an xsd:duration such as PT5M)"
            ) from exc
        if isinstance(parsed, timedelta):
            return parsed
        approx: timedelta = parsed.totimedelta(start=_EPOCH)  # years/months: approximated
        return approx
    raise InvalidValue(f"not a duration: {value!r}")


def _parse_bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise InvalidValue(f"not a boolean: {value!r} (use true/false, yes/no, on/off or 1/0)")


def _parse_int(value: object) -> int:
    if isinstance(value, bool):
        raise InvalidValue(f"not an integer: {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip().replace("_", ""))
        except ValueError:
            pass
    raise InvalidValue(f"not an integer: {value!r}")


def _parse_float(value: object) -> float:
    if isinstance(value, bool):
        raise InvalidValue(f"not a number: {value!r}")
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise InvalidValue(f"not a number: {value!r}") from exc
    if not math.isfinite(number):
        raise InvalidValue(f"not a finite number: {value!r}")
    return number


def _is_none_text(value: object) -> bool:
    return isinstance(value, str) and value.strip().lower() in {"", "none", "null", "unbounded"}


# --------------------------------------------------------------------------------------------
# conversion by type
# --------------------------------------------------------------------------------------------


def convert(value: object, tp: Any, meta: Mapping[str, Any] | None = None) -> Any:
    """``value`` as type ``tp`` (a dataclass field's annotation), checked against the
    field's :func:`limits` metadata.  :raises InvalidValue: it cannot be used."""
    meta = meta or {}
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if (value is None or _is_none_text(value)) and len(args) < len(typing.get_args(tp)):
            return None
        return convert(value, args[0], meta)
    if origin is Literal:
        allowed = typing.get_args(tp)
        candidate = value.strip().lower() if isinstance(value, str) else value
        if "true" in allowed and (isinstance(value, bool) or candidate in _TRUE | _FALSE):
            candidate = "true" if _parse_bool(value) else "false"
        if candidate not in allowed:
            raise InvalidValue(f"{value!r} is not one of: {', '.join(map(str, allowed))}")
        return candidate
    if origin is list:
        (item,) = typing.get_args(tp)
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list | tuple):
            raise InvalidValue(f"expected a list, got {value!r}")
        if dataclasses.is_dataclass(item) and isinstance(item, type):
            return [_record(v, item, i) for i, v in enumerate(value)]
        items = [convert(v, item) for v in value]
        return _check_named(items, meta)
    if origin is dict:
        if not isinstance(value, Mapping):
            raise InvalidValue(f"expected a table, got {value!r}")
        return _check_named(dict(value), meta)
    result = _convert_scalar(value, tp)
    _check_range(result, meta)
    return _check_named(result, meta)


def _record(value: object, cls: type, index: int) -> Any:
    """One table of an array of tables (``[[upstream]]``) as the dataclass ``cls``: each
    key converted as its field says; an unknown key is an error (a typo would otherwise
    silently drop a credential or a filter)."""
    if not isinstance(value, Mapping):
        raise InvalidValue(f"entry {index + 1}: expected a table, got {value!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for key, item in value.items():
        name = str(key).replace("-", "_").lower()
        if name not in fields:
            raise InvalidValue(
                f"entry {index + 1}: unknown key {key!r} (known: {', '.join(fields)})"
            )
        try:
            kwargs[name] = convert(item, hints[name], fields[name].metadata)
        except InvalidValue as exc:
            raise InvalidValue(f"entry {index + 1}: {name}: {exc}") from None
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise InvalidValue(f"entry {index + 1}: {exc}") from None


def _convert_scalar(value: object, tp: Any) -> Any:
    if tp is timedelta:
        return parse_duration(value)
    if tp is bool:
        return _parse_bool(value)
    if tp is int:
        return _parse_int(value)
    if tp is float:
        return _parse_float(value)
    if tp is str:
        if isinstance(value, Mapping | list | tuple):
            raise InvalidValue(f"expected a text value, got {value!r}")
        return str(value)
    if tp is Any:
        return value
    raise InvalidValue(f"unsupported setting type {tp!r}")  # pragma: no cover


def _check_range(value: object, meta: Mapping[str, Any]) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float | timedelta):
        return
    number = value.total_seconds() if isinstance(value, timedelta) else float(value)
    unit = " seconds" if isinstance(value, timedelta) else ""
    low, high, above = meta.get("minimum"), meta.get("maximum"), meta.get("above")
    if low is not None and high is not None and not low <= number <= high:
        raise InvalidValue(f"{_show(value)} is out of range ({_num(low)}..{_num(high)}{unit})")
    if low is not None and number < low:
        raise InvalidValue(f"{_show(value)} is too small (at least {_num(low)}{unit})")
    if high is not None and number > high:
        raise InvalidValue(f"{_show(value)} is too large (at most {_num(high)}{unit})")
    if above is not None and number <= above:
        raise InvalidValue(f"{_show(value)} must be greater than {_num(above)}{unit}")


def _show(value: object) -> str:
    if isinstance(value, timedelta):
        return f"{_num(value.total_seconds())} seconds"
    return _num(value) if isinstance(value, float) else str(value)


def _num(number: object) -> str:
    if isinstance(number, float) and number.is_integer():
        return str(int(number))
    return str(number)


def _check_named(value: Any, meta: Mapping[str, Any]) -> Any:
    """``value`` after the field's named check (which may normalise it)."""
    check = meta.get("check")
    if check is None:
        return value
    if check == "log_level":
        if isinstance(value, dict):
            return {str(k): _log_level(v, f" for logger {k!r}") for k, v in value.items()}
        return _log_level(value)
    if check == "http_url":
        _check_http_url(value)
    elif check == "networks":
        for item in value if isinstance(value, list) else [value]:
            _check_network(item)
    elif check == "gateway_id":
        if value and not re.fullmatch(r"[A-Za-z0-9._:-]{1,64}", str(value)):
            raise InvalidValue(f"{value!r}: 1-64 of the characters A-Z a-z 0-9 . _ : -")
    elif check == "http_statuses":
        try:
            value = list(check_statuses(value))
        except ValueError as exc:
            raise InvalidValue(str(exc)) from None
    elif check == "dead_letter_destination":
        try:
            check_destination(str(value))
        except ValueError as exc:
            raise InvalidValue(str(exc)) from None
    else:  # pragma: no cover - a typo in a field declaration
        raise AssertionError(f"unknown check {check!r}")
    return value


def check_statuses(values: Iterable[object]) -> tuple[int, ...]:
    """HTTP statuses a delivery may treat as final: integers 300 to 599 (a 2xx is a
    success), sorted, without repeats.  :raises ValueError: one is not."""
    out: set[int] = set()
    for value in values:
        text = str(value).strip()
        if isinstance(value, bool) or not re.fullmatch(r"[0-9]{3}", text):
            raise ValueError(f"{value!r} is not an HTTP status (three digits)")
        status = int(text)
        if not 300 <= status <= 599:
            raise ValueError(f"{status} is not a failure status (300 to 599)")
        out.add(status)
    return tuple(sorted(out))


def _log_level(value: object, what: str = "") -> str:
    name = str(value).strip().upper()
    if name not in LOG_LEVELS:
        raise InvalidValue(f"not a log level{what}: {value!r} (one of {', '.join(LOG_LEVELS)})")
    return name


def check_log_level(value: object) -> str:
    """``value`` as an upper-case level name.  :raises InvalidValue: it is none."""
    return _log_level(value)


def _check_http_url(value: object) -> None:
    if value is None:
        return
    text = str(value)
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise InvalidValue(f"not a URL: {text!r} ({exc})") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidValue(f"not an http:// or https:// URL: {text!r}")
    if port == 0 or parts.query or parts.fragment:
        raise InvalidValue(f"not a base URL (no port 0, query or fragment): {text!r}")


def _check_network(item: object) -> None:
    text = str(item).strip()
    if text == "*":
        return
    try:
        ipaddress.ip_network(text, strict=False)
    except ValueError as exc:
        raise InvalidValue(f"not an IP address or network: {text!r} (or '*')") from exc
