"""The admin page's traffic charts (the last hour), drawn on the server as small SVG images
(``/wsn/admin/api/charts/<series>.svg``): the page shows them without JavaScript and in
screenshots, and its script only reloads them.  Only numbers and fixed words go into the
SVG, so nothing a client sent can reach it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from wsnmom.core.rate_history import WINDOW, RatePoint

__all__ = ["SERIES", "chart_svg"]

#: series name -> (title, unit)
SERIES: Final = {
    "notifications": ("Notifications in", "/s"),
    "deliveries": ("Deliveries", "/s"),
    "failures": ("Failed attempts", "/s"),
    "backlog": ("Backlog", " msgs"),
}

_WIDTH, _HEIGHT = 360, 110
_LEFT, _RIGHT, _TOP, _BOTTOM = 8, 8, 22, 18
_COLOURS: Final = {
    "notifications": "#1d4fb8",
    "deliveries": "#1f7a3a",
    "failures": "#b3261e",
    "backlog": "#8a5a00",
}


def _value(point: RatePoint, series: str) -> float | None:
    value: float | None = getattr(point, series)
    return value


def _number(value: float) -> str:
    if value >= 100 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:.1f}" if value >= 1 else f"{value:.2f}"


def chart_svg(points: Sequence[RatePoint], series: str, now: float) -> bytes:
    """One series of the last hour as an SVG image (``now``: the right edge, POSIX)."""
    title, unit = SERIES[series]
    values = [(p.at, v) for p in points if (v := _value(p, series)) is not None]
    top = max((v for _, v in values), default=0.0)
    scale = top if top > 0 else 1.0
    plot_w = _WIDTH - _LEFT - _RIGHT
    plot_h = _HEIGHT - _TOP - _BOTTOM
    start = now - WINDOW

    def x(at: float) -> float:
        return _LEFT + max(0.0, min(1.0, (at - start) / WINDOW)) * plot_w

    def y(value: float) -> float:
        return _TOP + plot_h - (value / scale) * plot_h

    line = " ".join(f"{x(at):.1f},{y(v):.1f}" for at, v in values)
    last = values[-1][1] if values else None
    heading = f"{title}: {_number(last)}{unit} now" if last is not None else f"{title}: no data yet"
    colour = _COLOURS[series]
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{_HEIGHT}" '
        f'viewBox="0 0 {_WIDTH} {_HEIGHT}" role="img" aria-label="{heading}">',
        f"<title>{heading}, the last hour</title>",
        f'<rect x="0" y="0" width="{_WIDTH}" height="{_HEIGHT}" fill="#fff"/>',
        f'<text x="{_LEFT}" y="14" font-family="sans-serif" font-size="12" fill="#222">'
        f"{heading}</text>",
        f'<text x="{_WIDTH - _RIGHT}" y="14" font-family="sans-serif" font-size="10" '
        f'fill="#666" text-anchor="end">max {_number(top)}{unit}</text>',
        f'<line x1="{_LEFT}" y1="{_TOP + plot_h}" x2="{_WIDTH - _RIGHT}" y2="{_TOP + plot_h}" '
        'stroke="#ccc"/>',
        f'<text x="{_LEFT}" y="{_HEIGHT - 4}" font-family="sans-serif" font-size="10" '
        'fill="#666">-60 min</text>',
        f'<text x="{_WIDTH - _RIGHT}" y="{_HEIGHT - 4}" font-family="sans-serif" '
        'font-size="10" fill="#666" text-anchor="end">now</text>',
    ]
    if len(values) > 1:
        parts.append(
            f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="1.5"/>'
        )
    elif values:
        at, v = values[0]
        parts.append(f'<circle cx="{x(at):.1f}" cy="{y(v):.1f}" r="2" fill="{colour}"/>')
    parts.append("</svg>")
    return "".join(parts).encode()
