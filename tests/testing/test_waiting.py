"""The suite's one polling helper (tests/support/waiting.py) and its one port picker
(wsnmom.testing.gateway.free_port)."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest

from tests.support import waiting
from tests.support.waiting import FINE, SLOWEST, wait_until
from wsnmom.testing.gateway import PORT_RANGE, free_port


def test_wait_until_returns_the_first_truthy_value() -> None:
    values = iter([0, [], "ready"])
    assert wait_until(lambda: next(values), 5, what="readiness") == "ready"


def test_wait_until_names_what_it_awaited_and_the_last_value() -> None:
    with pytest.raises(AssertionError, match=r"waiting for the answer; last: \[\]"):
        wait_until(list, 0.05, what="the answer")


def test_wait_until_retries_the_named_errors_only() -> None:
    calls = iter([ConnectionError("refused"), ConnectionError("refused"), "up"])

    def check() -> str:
        value = next(calls)
        if isinstance(value, Exception):
            raise value
        return value

    assert wait_until(check, 5, errors=(ConnectionError,)) == "up"

    def refused() -> str:
        raise ConnectionError("refused")

    with pytest.raises(AssertionError, match="ConnectionError: refused"):
        wait_until(refused, 0.05, errors=(OSError,))
    with pytest.raises(KeyError):
        wait_until(lambda: {}["missing"], 5)


class FakeClock:
    """``time`` for tests/support/waiting.py: sleeping moves the clock, and each sleep is
    recorded (no real waiting, so the schedule is exact on a loaded machine)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(round(seconds, 6))
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(
        waiting, "time", SimpleNamespace(monotonic=fake.monotonic, sleep=fake.sleep)
    )
    return fake


def test_wait_until_backs_off_from_fine_to_slowest(clock: FakeClock) -> None:
    values = iter([0] * 6 + [1])
    assert wait_until(lambda: next(values), 5) == 1
    assert clock.sleeps == [FINE, 2 * FINE, 4 * FINE, SLOWEST, SLOWEST, SLOWEST]


def test_wait_until_keeps_an_interval_it_is_given(clock: FakeClock) -> None:
    values = iter([0] * 4 + [1])
    assert wait_until(lambda: next(values), 5, interval=FINE) == 1
    assert clock.sleeps == [FINE] * 4


def test_wait_until_checks_last_at_the_deadline(clock: FakeClock) -> None:
    started = clock.now
    checked: list[float] = []

    def check() -> bool:
        checked.append(clock.now - started)
        return False

    with pytest.raises(AssertionError, match=r"timed out after 0\.25 s"):
        wait_until(check, 0.25)
    # 0.02 + 0.04 + 0.08 + 0.1 = 0.24, then 0.1 would pass the deadline: 0.01 ends at it
    assert clock.sleeps == [FINE, 2 * FINE, 4 * FINE, SLOWEST, pytest.approx(0.01)]
    assert checked[-1] == pytest.approx(0.25)


def test_free_port_is_below_the_ephemeral_range_and_bindable() -> None:
    port = free_port()
    assert PORT_RANGE[0] <= port <= PORT_RANGE[1]
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
