"""``wsnmom/slow_stop.py``: a shutdown still under way after its time logs every thread's
stack once, naming the call it waits in; a prompt one logs nothing."""

from __future__ import annotations

import logging
import threading

import pytest

from tests.support.waiting import wait_until
from wsnmom.slow_stop import reporting_a_slow_stop


def _waiting_in_a_stuck_close(release: threading.Event) -> None:
    release.wait(600)


def test_a_slow_stop_logs_the_stack_of_every_thread_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="wsnmom.server")
    release = threading.Event()
    stuck = threading.Thread(target=_waiting_in_a_stuck_close, args=(release,), name="stuck-close")
    stuck.start()
    try:
        with reporting_a_slow_stop(after=0.05):
            wait_until(lambda: caplog.records, 30, what="the slow-stop report")
    finally:
        release.set()
        stuck.join()
    [record] = caplog.records
    text = record.getMessage()
    assert record.levelno == logging.WARNING
    assert text.startswith("shutdown still under way after 0 s; the threads are at:")
    assert "thread stuck-close" in text and "_waiting_in_a_stuck_close" in text


def test_a_prompt_stop_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="wsnmom.server")
    with reporting_a_slow_stop(after=0.2):
        pass
    # the timer is cancelled and its thread has ended: no report can come any more
    assert not [t for t in threading.enumerate() if t.name == "wsnmom-slow-stop"]
    assert caplog.records == []
