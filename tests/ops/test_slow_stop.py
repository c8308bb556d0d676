"""A stop that takes long logs every thread's stack (wsnmom.slow_stop): the next slow
SIGTERM hand-over explains itself (docs/scale-out.md)."""

from __future__ import annotations

import logging
import threading

import pytest

from tests.support.waiting import wait_until
from wsnmom.slow_stop import SlowStopWatch


def test_a_slow_stop_logs_the_stack_of_the_thread_it_waits_for(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = threading.Event()

    def stuck_in_a_round_trip() -> None:
        release.wait(30)

    worker = threading.Thread(target=stuck_in_a_round_trip, name="wsnmom-stuck", daemon=True)
    worker.start()
    caplog.set_level(logging.WARNING, logger="wsnmom.server")
    try:
        with SlowStopWatch("shutting down", after=0.05, dumps=2) as watch:
            wait_until(lambda: watch.dumped == 2, 10, what="two dumps")
    finally:
        release.set()
    dumps = [r.getMessage() for r in caplog.records if "still under way" in r.getMessage()]
    assert len(dumps) == 2
    assert dumps[0].startswith("shutting down still under way after")
    assert 'Thread "wsnmom-stuck"' in dumps[0]
    assert "in stuck_in_a_round_trip" in dumps[0]


def test_a_stop_that_ends_in_time_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="wsnmom.server")
    with SlowStopWatch("shutting down", after=30) as watch:
        pass
    watch._thread.join(5)  # cancelled: the watch ends at once
    assert not watch._thread.is_alive()
    assert watch.dumped == 0
    assert not [r for r in caplog.records if "still under way" in r.getMessage()]
