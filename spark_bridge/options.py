"""Option parsing shared by the bridge's data sources, and the error that names the source
and the broker that failed.

Spark hands a data source its options as a case-insensitive mapping of strings; the bridge
copies them into a plain dict with lower-case keys (picklable, and the same in every
process) and reads typed values from it here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from wsnmom.core.config_values import InvalidValue, convert
from wsnmom.core.redaction import redact_url

__all__ = [
    "BridgeError",
    "SourceError",
    "get_bool",
    "get_float",
    "get_int",
    "get_json",
    "lower_keys",
    "redact",
]


class BridgeError(Exception):
    """A failure of the Spark bridge that a user can act on (bad options, a broker that
    does not answer, data that is gone)."""


class SourceError(BridgeError):
    """A failure of one source or sink; the message starts with what failed, e.g.
    ``kafka source 'plant' (127.0.0.1:9092): ...``."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where


def lower_keys(options: Mapping[str, Any]) -> dict[str, str]:
    """``options`` as a plain dict with lower-case keys and string values."""
    return {str(k).lower(): str(v) for k, v in options.items() if v is not None}


def get_int(
    options: Mapping[str, str], key: str, default: int | None, *, low: int = 0
) -> int | None:
    """Integer option ``key`` (lower case), at least ``low``; ValueError naming it."""
    text = options.get(key)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"option {key} must be an integer, not {text!r}") from None
    if value < low:
        raise ValueError(f"option {key} must be at least {low}, not {value}")
    return value


def get_float(options: Mapping[str, str], key: str, default: float) -> float:
    """Float option ``key`` (lower case, positive); ValueError naming it."""
    text = options.get(key)
    if text is None or text == "":
        return default
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"option {key} must be a number, not {text!r}") from None
    if value <= 0:
        raise ValueError(f"option {key} must be positive, not {value}")
    return value


def get_bool(options: Mapping[str, str], key: str, default: bool) -> bool:
    """Boolean option ``key``, by the gateway's one boolean rule; ValueError naming it."""
    text = options.get(key)
    if text is None or text == "":
        return default
    try:
        value: bool = convert(text, bool)
    except InvalidValue as exc:
        raise ValueError(f"option {key}: {exc}") from None
    return value


def get_json(options: Mapping[str, str], key: str) -> Any:
    """JSON option ``key``, None when absent; ValueError naming it."""
    text = options.get(key)
    if text is None or text == "":
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ValueError(f"option {key} is not valid JSON: {exc}") from None


#: ``url`` without its password or secret query values (the gateway's one helper)
redact = redact_url
