"""``core.later``: calls made after a delay on a few shared threads, not a thread each."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from wsnmom.core.later import Later

from tests.support.waiting import wait_until


@pytest.fixture
def made_later() -> Iterator[list[Later]]:
    """The tests' own ``Later`` instances, closed at the end (their threads end too)."""
    made: list[Later] = []
    yield made
    for later in made:
        later.close()


def test_a_thousand_waiting_calls_are_served_by_a_bounded_number_of_threads(
    made_later: list[Later],
) -> None:
    """1,000 calls due in 0.2-1.2 s: each is made once, the earlier due first, on at most
    the timing thread and ``workers`` callers (a ``threading.Timer`` each took 1,000)."""
    later = Later(workers=3, name="test-later")
    made_later.append(later)
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


def test_a_call_that_blocks_or_raises_does_not_hold_the_others(made_later: list[Later]) -> None:
    """One call blocks its worker and another raises: the calls due after them are made."""
    later = Later(workers=2, name="test-later")
    made_later.append(later)
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


def test_a_call_waits_its_delay(made_later: list[Later]) -> None:
    """A call is not made before its due time (measured: its start is after it)."""
    later = Later(workers=1, name="test-later")
    made_later.append(later)
    started = time.monotonic()
    at: list[float] = []
    later.call(0.3, lambda: at.append(time.monotonic()))
    wait_until(lambda: at, 10, what="the call")
    assert at[0] - started >= 0.3


def test_close_drops_the_calls_not_due_and_ends_the_threads() -> None:
    """After ``close`` the calls not yet due are never made, every thread it started
    has ended, and a new call is refused."""
    later = Later(workers=2, name="test-later-close")
    first = threading.Event()
    late = threading.Event()
    later.call(0.0, first.set)
    later.call(3600.0, late.set)
    assert first.wait(10)
    started = [t for t in threading.enumerate() if t.name.startswith("test-later-close")]
    assert started
    later.close()
    assert not [t for t in started if t.is_alive()]
    assert not late.is_set()
    with pytest.raises(RuntimeError):
        later.call(0.0, late.set)
