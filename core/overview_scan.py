"""The admin overview's light scan of every live subscription (F31): what each one's
channel failed and holds, and its depth, read for each of up to 100,000 subscriptions on
every poll of the admin page at a fraction of the cost of its full status; the counts
over all of them (:class:`SubscriptionTotals`), and the few that need attention most,
which ``core.operations`` then reads in full.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from wsnmom.core.channel import Channel
from wsnmom.core.registry import LiveSubscription

__all__ = ["Found", "Seen", "SubscriptionTotals", "needing_attention", "scan", "totals"]


@dataclass(frozen=True, slots=True)
class SubscriptionTotals:
    """The overview's counts over every live subscription."""

    count: int
    paused: int
    #: push subscriptions whose delivery failed at least once since its last success
    failing: int
    #: the known backlogs summed (those of routed subscriptions are 0)
    backlog: int
    #: subscriptions with a queue of their own whose backlog the middleware cannot tell
    backlog_unknown: int


@dataclass(slots=True)
class Found:
    """What the overview reads of each live subscription under the registry's lock (not
    frozen: a frozen dataclass's ``__init__`` costs several times more, made 100,000
    times per poll)."""

    state: LiveSubscription
    id: str
    paused: bool
    creation_time: datetime
    pull_point_id: str | None


@dataclass(slots=True)
class Seen:
    """One subscription as the overview's scan saw it: its channel's failures (0 for a
    routed one or a channel not open) and its backlog (None: unknown)."""

    found: Found
    failures: int
    backlog: int | None


def scan(
    found: Sequence[Found],
    depths: dict[int, int | None],
    channel: Callable[[str], Channel[Any] | None],
) -> list[Seen]:
    """Each subscription's failures and backlog, as :class:`SubscriptionStatus` gives them
    (``delivery.failures``, ``backlog``), from its channel's ``failures`` and ``held()``:
    a tenth of the cost of its ``status()``, which copies the whole delivery state."""
    out = []
    for f in found:
        handle = f.state.handle
        if handle is None:
            out.append(Seen(f, 0, 0))
            continue
        open_channel = channel(f.id)
        failures, held = 0, 0
        if open_channel is not None:
            failures, held = open_channel.failures, open_channel.held()
        waiting = depths.get(id(handle))
        out.append(Seen(f, failures, None if waiting is None else waiting + held))
    return out


def totals(seen: Sequence[Seen]) -> SubscriptionTotals:
    """The overview's counts over ``seen`` (every live subscription)."""
    queued = [s.backlog for s in seen if s.found.state.handle is not None]
    return SubscriptionTotals(
        count=len(seen),
        paused=sum(1 for s in seen if s.found.paused),
        failing=sum(1 for s in seen if s.failures),
        backlog=sum(b for b in queued if b is not None),
        backlog_unknown=sum(1 for b in queued if b is None),
    )


def needing_attention(seen: list[Seen], limit: int | None) -> list[Seen]:
    """All of ``seen`` oldest first (no ``limit``, or no more than it), else the
    ``limit`` that need attention most, failing first, then the largest backlogs, then
    the oldest, shown oldest first (ties: the more urgent first)."""
    if limit is None or len(seen) <= limit:
        return sorted(seen, key=lambda s: (s.found.creation_time, s.found.id))
    chosen = heapq.nsmallest(limit, seen, key=_urgency)
    chosen.sort(key=lambda s: (s.found.creation_time, *_urgency(s)))
    return chosen


def _urgency(s: Seen) -> tuple[int, int, datetime, str]:
    return (-s.failures, -(s.backlog or 0), s.found.creation_time, s.found.id)
