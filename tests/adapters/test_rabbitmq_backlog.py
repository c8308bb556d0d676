"""The RabbitMQ adapter's backlog estimate (``adapters/rabbitmq/_backlog.py``): the
``Retry-After`` of an overload fault is the work waiting on the connection divided by the
rate at which it finished work lately, within bounds."""

from __future__ import annotations

from wsnmom.adapters.rabbitmq._backlog import MAX_RETRY, MIN_RETRY, WINDOW, Backlog


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_retry_after_is_waiting_over_recent_rate() -> None:
    clock = Clock()
    backlog = Backlog(clock)
    for _ in range(20):  # 20 answered in the window: 4 per second
        backlog.begin()
        backlog.end()
    for _ in range(40):
        backlog.begin()
    assert backlog.waiting == 40
    assert backlog.retry_after(10.0) == 40 / (20 / WINDOW)  # 10 s


def test_retry_after_is_the_timeout_when_nothing_was_answered_lately() -> None:
    clock = Clock()
    backlog = Backlog(clock)
    backlog.begin()
    backlog.end()
    clock.now += WINDOW + 1  # that answer is too old to say anything about the rate
    backlog.begin()
    assert backlog.retry_after(7.0) == 7.0


def test_retry_after_stays_within_bounds_and_timeouts_do_not_count_as_answers() -> None:
    clock = Clock()
    backlog = Backlog(clock)
    for _ in range(1000):
        backlog.begin()
        backlog.end()
    backlog.begin()
    assert backlog.retry_after(10.0) == MIN_RETRY
    for _ in range(20_000):  # 20,000 / 200 per second = 100 s
        backlog.begin()
    assert backlog.retry_after(10.0) == MAX_RETRY
    fresh = Backlog(clock)
    fresh.begin()
    fresh.end(completed=False)  # timed out: no evidence of throughput
    fresh.begin()
    assert fresh.retry_after(3.0) == 3.0
    assert fresh.waiting == 1
