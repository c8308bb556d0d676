"""``core.later``: calls made after a delay on a few shared threads, not a thread each."""

from __future__ import annotations

import threading
import time

from wsnmom.core.later import Later

from tests.support.waiting import wait_until


def test_a_thousand_waiting_calls_are_served_by_a_bounded_number_of_threads() -> None:
    """1,000 calls due in 0.2-1.2 s: each is made once, the earlier due first, on at most
    the timing thread and ``workers`` callers (a ``threading.Timer`` each took 1,000)."""
    later = Later(workers=3, name="test-later")
    made: list[int] = []
    lock = threading.Lock()
    before = threading.active_count()

    def make(n: int) -> None:
        with lock:
            made.append(n)

    for n in reversed(range(1000)):
        later.call(0.2 + n / 1000, lambda n=n: make(n))
    assert threading.active_count() - before <= 1 + 3
    wait_until(lambda: len(made) == 1000, 20, what="the 1,000 calls")
    assert sorted(made) == list(range(1000))
    assert made[:10] == list(range(10))  # the earliest due first
    assert later.threads() <= 1 + 3


def test_a_call_that_blocks_or_raises_does_not_hold_the_others() -> None:
    """One call blocks its worker and another raises: the calls due after them are made."""
    later = Later(workers=2, name="test-later")
    release = threading.Event()
    made = threading.Event()

    def fails() -> None:
        raise RuntimeError("a call that fails")

    later.call(0.0, lambda: release.wait(30) and None)
    later.call(0.01, fails)
    later.call(0.02, made.set)
    try:
        assert made.wait(10)
    finally:
        release.set()


def test_a_call_waits_its_delay() -> None:
    """A call is not made before its due time (measured: its start is after it)."""
    later = Later(workers=1, name="test-later")
    started = time.monotonic()
    at: list[float] = []
    later.call(0.3, lambda: at.append(time.monotonic()))
    wait_until(lambda: at, 10, what="the call")
    assert at[0] - started >= 0.3
