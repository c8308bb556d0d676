"""The last hour of traffic for the admin page's charts (``core.rate_history``)."""

from __future__ import annotations

from wsnmom.core import metrics
from wsnmom.core.rate_history import RateHistory

from tests.support.waiting import wait_until


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def test_rates_are_the_counters_differences_over_each_interval() -> None:
    clock = Clock()
    backlog = iter([5.0, 7.0, 2.0])
    history = RateHistory(lambda: next(backlog), interval=15, window=3600, clock=clock)
    history.sample()
    assert history.points() == []  # one sample: no interval yet
    metrics.NOTIFICATIONS_IN.inc(30)
    metrics.NOTIFICATIONS_OUT.labels(mode="push").inc(45)
    metrics.NOTIFICATIONS_OUT.labels(mode="pull").inc(15)
    metrics.DELIVERY_FAILURES.inc(3)
    clock.now += 15
    history.sample()
    clock.now += 10
    history.sample()
    first, second = history.points()
    assert (first.at, first.notifications, first.deliveries, first.failures) == (
        1_015.0,
        2.0,
        4.0,  # every mode counts
        0.2,
    )
    assert first.backlog == 7.0
    assert (second.notifications, second.deliveries, second.failures, second.backlog) == (
        0.0,
        0.0,
        0.0,
        2.0,
    )


def test_only_the_window_is_kept_and_an_unreadable_backlog_is_none() -> None:
    clock = Clock()

    def broken() -> float:
        raise RuntimeError("middleware down")

    history = RateHistory(broken, interval=10, window=60, clock=clock)
    for _ in range(20):
        history.sample()
        clock.now += 10
    points = history.points()
    assert len(points) == 6  # 7 samples kept: 60 s of intervals
    assert all(p.backlog is None for p in points)
    assert points[-1].at == 1_000.0 + 19 * 10


def test_start_samples_in_the_background_until_stopped() -> None:
    history = RateHistory(lambda: 0.0, interval=0.05)
    history.start()
    try:
        wait_until(lambda: len(history.points()) >= 2, what="two intervals sampled")
    finally:
        history.stop()
