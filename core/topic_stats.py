"""Message counts and rates per topic, for operators (the admin page and API).

Core counts every notification it publishes on a topic once the middleware confirmed it
(Notify to the broker, SubscriptionEnd); copies into pull points' inboxes are not topics
and are not counted, nor are messages native producers write to the middleware
themselves.  Counts start at zero when the gateway starts.

A rate is messages per second over the last :data:`WINDOW` seconds, estimated from two
fixed windows (the current one, and the previous one weighted by how much of it still
overlaps): constant memory per topic, and it falls to zero within two windows after
publishing stops.

At most ``limit`` topics are tracked (a topic set may grow without bound); when more are
published, the topics published to least recently are forgotten, and ``forgotten`` says
how many were.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from wsnmom.topic_mapping.model import Topic

__all__ = ["WINDOW", "TopicCount", "TopicStats"]

#: seconds a rate is measured over
WINDOW = 10.0


@dataclass(frozen=True, slots=True)
class TopicCount:
    """One topic's counts (``TopicStats.snapshot``)."""

    topic: Topic
    #: notifications published on it since the gateway started
    messages: int
    #: messages per second over the last ``WINDOW`` seconds
    rate: float
    #: when the last one was published (POSIX seconds)
    last: float


class _Counts:
    __slots__ = ("current", "last", "last_mono", "previous", "total", "window_start")

    def __init__(self, now: float) -> None:
        self.total = 0
        self.window_start = now
        self.current = 0
        self.previous = 0
        self.last = 0.0
        self.last_mono = now

    def roll(self, now: float) -> None:
        """Move the windows forward to ``now``."""
        elapsed = now - self.window_start
        if elapsed < WINDOW:
            return
        self.previous = self.current if elapsed < 2 * WINDOW else 0
        self.current = 0
        self.window_start += WINDOW * int(elapsed // WINDOW)

    def rate(self, now: float) -> float:
        self.roll(now)
        overlap = 1.0 - (now - self.window_start) / WINDOW
        return (self.previous * overlap + self.current) / WINDOW


class TopicStats:
    """Thread-safe counters per topic (see the module docstring)."""

    def __init__(
        self,
        limit: int = 10_000,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.limit = limit
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._topics: dict[Topic, _Counts] = {}
        #: topics forgotten to stay within ``limit``
        self.forgotten = 0

    def count(self, topics: Iterable[Topic | None]) -> None:
        """Count one published message per item (None: a message without a topic)."""
        now = self._clock()
        wall = self._wall()
        runs: list[tuple[Topic, int]] = []
        for topic in topics:  # a Notify usually repeats one topic: count runs
            if topic is None:
                continue
            if runs and runs[-1][0] == topic:
                runs[-1] = (topic, runs[-1][1] + 1)
            else:
                runs.append((topic, 1))
        if not runs:
            return
        with self._lock:
            table = self._topics
            for topic, n in runs:
                counts = table.get(topic)
                if counts is None:
                    counts = table[topic] = _Counts(now)
                counts.roll(now)
                counts.total += n
                counts.current += n
                counts.last = wall
                counts.last_mono = now
            if len(table) > self.limit:
                self._forget()

    def _forget(self) -> None:
        """Drop the least recently published tenth (hold the lock)."""
        table = self._topics
        excess = len(table) - self.limit + max(1, self.limit // 10)
        oldest = sorted(table.items(), key=lambda item: item[1].last_mono)[:excess]
        for topic, _ in oldest:
            del table[topic]
        self.forgotten += len(oldest)

    def snapshot(self) -> list[TopicCount]:
        """Every tracked topic's counts, most messages first."""
        now = self._clock()
        with self._lock:
            out = [
                TopicCount(topic, c.total, c.rate(now), c.last) for topic, c in self._topics.items()
            ]
        out.sort(key=lambda t: (-t.messages, str(t.topic)))
        return out
