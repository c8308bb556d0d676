"""The last hour of the gateway's traffic, for the admin page's charts: notifications in,
deliveries, failed attempts and the backlog, sampled every :data:`INTERVAL` seconds.

A daemon thread reads the gateway's own counters (``core.metrics``, through
``prometheus_client``'s public ``collect``) and the backlog (one bulk depth call to the
adapter, as a ``/metrics`` scrape does), and keeps :data:`WINDOW` seconds of samples in
memory (240 of them): rates are the differences between consecutive samples.  Nothing is
stored: the charts start empty when the gateway starts.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import Counter

from . import metrics

__all__ = ["INTERVAL", "WINDOW", "RateHistory", "RatePoint"]

log = logging.getLogger(__name__)

#: seconds between samples
INTERVAL = 15.0
#: seconds of history kept
WINDOW = 3600.0
#: seconds ``stop`` waits for a sample under way (the thread is a daemon)
STOP_WAIT = 0.2


@dataclass(frozen=True, slots=True)
class RatePoint:
    """One interval of the history: per-second rates over it, and the backlog at its end."""

    #: the end of the interval (POSIX seconds)
    at: float
    notifications: float
    deliveries: float
    failures: float
    #: messages waiting at ``at`` (None: the middleware could not tell)
    backlog: float | None


@dataclass(frozen=True, slots=True)
class _Sample:
    at: float
    notifications: float
    deliveries: float
    failures: float
    backlog: float | None


def _total(counter: Counter) -> float:
    """The sum of a counter over its labels."""
    return sum(
        s.value for family in counter.collect() for s in family.samples if s.name.endswith("_total")
    )


class RateHistory:
    """Samples the traffic every ``interval`` seconds while started."""

    def __init__(
        self,
        backlog: Callable[[], float],
        *,
        interval: float = INTERVAL,
        window: float = WINDOW,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._backlog = backlog
        self.interval = interval
        self._clock = clock
        self._samples: deque[_Sample] = deque(maxlen=int(window / interval) + 1)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Take a first sample now and one every interval in a daemon thread."""
        if self._thread is not None:
            return
        self.sample()
        self._thread = threading.Thread(target=self._run, name="wsnmom-rates", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling (the history is kept)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            # a sample only reads: a stop does not wait long for one under way (right
            # after a SIGCONT, its depth query waits for the middleware connection to
            # be restored; a SIGTERM then waited 5 s here before handing over)
            thread.join(timeout=STOP_WAIT)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sample()
            except Exception:
                log.debug("sampling the traffic failed", exc_info=True)

    def sample(self) -> None:
        """Take one sample of the counters and the backlog."""
        try:
            backlog: float | None = self._backlog()
        except Exception:
            backlog = None
        sample = _Sample(
            at=self._clock(),
            notifications=_total(metrics.NOTIFICATIONS_IN),
            deliveries=_total(metrics.NOTIFICATIONS_OUT),
            failures=_total(metrics.DELIVERY_FAILURES),
            backlog=backlog,
        )
        with self._lock:
            self._samples.append(sample)

    def points(self) -> list[RatePoint]:
        """The history, oldest first: one point per interval between two samples."""
        with self._lock:
            samples = list(self._samples)
        out: list[RatePoint] = []
        for before, after in itertools.pairwise(samples):
            span = after.at - before.at
            if span <= 0:
                continue
            out.append(
                RatePoint(
                    at=after.at,
                    notifications=max(after.notifications - before.notifications, 0.0) / span,
                    deliveries=max(after.deliveries - before.deliveries, 0.0) / span,
                    failures=max(after.failures - before.failures, 0.0) / span,
                    backlog=after.backlog,
                )
            )
        return out
