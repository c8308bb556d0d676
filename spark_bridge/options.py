"""Option parsing shared by the bridge's data sources, and the error that names the source
and the broker that failed.

Spark hands a data source its options as a case-insensitive mapping of strings; the bridge
copies them into a plain dict with lower-case keys (picklable, and the same in every
process) and reads typed values from it here.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from wsnmom.core.config_values import InvalidValue, convert
from wsnmom.core.redaction import redact_url

__all__ = [
    "COMMON_OPTIONS",
    "EARLIEST",
    "BridgeError",
    "SourceError",
    "check_names",
    "get_bool",
    "get_float",
    "get_int",
    "get_json",
    "lower_keys",
    "offset_values",
    "offsets_option",
    "redact",
]

#: start offset of a stream the checkpoint does not know yet: its first record
EARLIEST = -2
#: the offset options as the docs spell them (options arrive with lower-case keys)
OFFSET_OPTIONS = {"startingoffsets": "startingOffsets", "endingoffsets": "endingOffsets"}
#: the options every source takes (docs/spark.md), besides the selection's and its own
COMMON_OPTIONS = (
    "alias",
    "startingOffsets",
    "endingOffsets",
    "maxRecordsPerTrigger",
    "maxRecordsPerPartition",
    "minPartitions",
    "includeHeaders",
    "failOnDataLoss",
    "pollTimeout",
)


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


def check_names(
    options: Mapping[str, str], names: Iterable[str], what: str, *, prefixes: tuple[str, ...] = ()
) -> None:
    """Refuse an option (lower-case key) that is none of ``names`` (any case) and starts
    with none of ``prefixes``: Spark passes every option on, so a misspelt one
    (``startingOffset``) would otherwise be ignored and its default used.  ValueError naming
    the option and ``what`` it was given to, with the closest known name."""
    by_lower = {name.lower(): name for name in names}
    for key in sorted(options):
        name = key.lower()
        if name in by_lower or any(name.startswith(prefix) for prefix in prefixes):
            continue
        close = difflib.get_close_matches(name, list(by_lower), n=1, cutoff=0.6)
        hint = (
            f"did you mean {by_lower[close[0]]}?"
            if close
            else f"known: {', '.join(sorted(by_lower.values(), key=str.lower))}"
        )
        raise ValueError(f"{what} has no option {key!r} ({hint})")


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


def offsets_option(
    options: Mapping[str, str], key: str, bounds: Mapping[str, tuple[int, int]], where: str
) -> dict[str, int]:
    """Offsets option ``key`` (``startingOffsets``, ``endingOffsets``): ``earliest`` (the
    default), ``latest``, or a JSON object ``{stream: offset}`` (-2 earliest, -1 latest)
    of streams the source has now (``bounds``), no offset past a stream's end: a misspelt
    stream or offset would otherwise read from the start, or skip what arrives up to that
    offset.  SourceError naming the option otherwise."""
    text = (options.get(key) or "earliest").strip()
    if text == "earliest":
        return {s: low for s, (low, _) in bounds.items()}
    if text == "latest":
        return {s: high for s, (_, high) in bounds.items()}
    name = OFFSET_OPTIONS.get(key, key)
    data = get_json(options, key) if text.startswith("{") else None
    if not isinstance(data, dict):
        raise SourceError(
            where,
            f'{name} must be earliest, latest or a JSON object {{"<stream>": offset}}, '
            f"not {text!r}",
        )
    out = {s: low for s, (low, _) in bounds.items()}
    for stream, value in offset_values(data, key, where).items():
        if stream not in bounds:
            raise SourceError(
                where,
                f"{name} names {stream!r}, which is not a stream of this source "
                f"(its streams now: {', '.join(sorted(bounds)) or 'none'})",
            )
        low, high = bounds[stream]
        if value > high:
            raise SourceError(
                where,
                f"{name} gives offset {value} for {stream}, past its end ({high}: the "
                f"next record's offset); -1 is the end",
            )
        out[stream] = low if value == EARLIEST else high if value == -1 else value
    return out


def offset_values(data: Mapping[str, Any], key: str, where: str) -> dict[str, int]:
    """The offsets of option ``key`` (a JSON object): integers, -2 (earliest) or more."""
    out: dict[str, int] = {}
    for stream, value in data.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < EARLIEST:
            raise SourceError(
                where,
                f"{OFFSET_OPTIONS.get(key, key)}: the offset of {stream!r} must be an "
                f"integer, -2 (earliest), -1 (latest) or an offset, not {json.dumps(value)}",
            )
        out[str(stream)] = value
    return out


#: ``url`` without its password or secret query values (the gateway's one helper)
redact = redact_url
