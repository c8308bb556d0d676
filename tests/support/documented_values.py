"""The value a default written in a documentation table means (``5 min``, ``PT8H``,
``10 MiB``, ``10,000``, ``268435456 (256 MiB)``, ``none``, ``true``, ``[]``...), read as the
code's value is typed, so that a table can be compared with the code."""

from __future__ import annotations

import re
from datetime import timedelta

HOME = "/nohome"
_SECONDS = {"s": 1, "min": 60, "hour": 3600, "hours": 3600, "day": 86400, "days": 86400}
_BYTES = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
_ISO = re.compile(r"P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?)?")


def documented_value(text: str, actual: object) -> object:
    """What ``text`` means where the code's default is ``actual`` (a duration is a
    timedelta, or seconds where the code counts seconds in a number)."""
    value = _read(text, actual)
    if isinstance(value, timedelta) and not isinstance(actual, timedelta):
        return value.total_seconds()
    return value


def _read(text: str, actual: object) -> object:
    text = re.sub(r"\s*\(.*\)$", "", text.strip())  # "268435456 (256 MiB)", "none (every topic)"
    text = text[1:-1] if text.startswith("`") and text.endswith("`") else text
    text = text.replace("~", HOME).replace("<data_dir>", f"{HOME}/.local/share/wsnmom")
    words: dict[str, object] = {
        "none": type(actual)() if isinstance(actual, list | dict | str) else None
    }
    words |= {"[]": [], "{}": {}, "true": True, "false": False, '""': ""}
    if text in words:
        return words[text]
    if isinstance(actual, str):
        return text
    if match := re.fullmatch(r"([\d.]+) (KiB|MiB|GiB)", text):
        return int(float(match.group(1)) * _BYTES[match.group(2)])
    if (match := re.fullmatch(r"([\d.]+) ([a-z]+)", text)) and match.group(2) in _SECONDS:
        return timedelta(seconds=float(match.group(1)) * _SECONDS[match.group(2)])
    if text != "P" and (match := _ISO.fullmatch(text)):
        days, hours, minutes, seconds = (int(part or 0) for part in match.groups())
        return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    if re.fullmatch(r"-?[\d,]+(?:\.\d+)?", text):
        number = float(text.replace(",", ""))
        return timedelta(seconds=number) if isinstance(actual, timedelta) else number
    if text.startswith("["):
        return re.findall(r'"([^"]*)"', text)
    return text


def split_defaults(cell: str, count: int) -> list[str]:
    """The defaults of a row naming ``count`` settings: ``1 s, 2, 5 min`` is one each, a
    single default (``none``, ``10,000``) is everyone's."""
    parts = [part.strip() for part in cell.split(", ")]
    return parts if len(parts) == count else [cell] * count
