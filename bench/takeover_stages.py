"""The survivors' breakdown of a failover (scenario ha-scale): each gateway's
``wsnmom_takeover_seconds{stage}`` histogram (``core.takeover_timing``: seconds from the
take of a shard to each step of the first delivery of each of its subscriptions) read
from ``/metrics`` before the kill and after, the difference summed over the survivors,
and each stage's p50/p95 read off the buckets (to the bucket: 0.1 s up to 6 s)."""

from __future__ import annotations

import math
import re
import urllib.request

__all__ = ["STAGES", "Buckets", "count", "quantile", "scrape", "since"]

STAGES = ("opening", "channel", "opened", "read", "lane", "run", "post", "answer")

#: (stage, upper bound) -> cumulative count
Buckets = dict[tuple[str, float], float]

_LINE = re.compile(r"^wsnmom_takeover_seconds_bucket\{(?P<labels>[^}]*)\} (?P<n>\S+)$", re.M)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def scrape(base_url: str) -> Buckets:
    """The gateway's take-over histogram buckets (empty when it has none yet)."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=30) as answer:
        text = answer.read().decode()
    out: Buckets = {}
    for m in _LINE.finditer(text):
        labels = dict(_LABEL.findall(m["labels"]))
        out[(labels["stage"], float(labels["le"]))] = float(m["n"])
    return out


def since(after: list[Buckets], before: list[Buckets]) -> Buckets:
    """What the gateways observed between the two scrapes, summed over them."""
    total: Buckets = {}
    for a, b in zip(after, before, strict=True):
        for key, n in a.items():
            total[key] = total.get(key, 0.0) + n - b.get(key, 0.0)
    return total


def quantile(buckets: Buckets, stage: str, q: float) -> float | None:
    """The upper bound of the bucket holding the ``q`` (0-100) quantile of ``stage``;
    None when it has no observation."""
    bounds = sorted((le, n) for (s, le), n in buckets.items() if s == stage)
    if not bounds or bounds[-1][1] <= 0:
        return None
    rank = max(1, math.ceil(q / 100.0 * bounds[-1][1]))
    return next(le for le, n in bounds if n >= rank)


def count(buckets: Buckets, stage: str) -> int:
    """How many first deliveries reached ``stage``."""
    return int(max((n for (s, _), n in buckets.items() if s == stage), default=0))
