"""``adapters/kafka/closing.py``: once the adapter's close begins, every wait for the
cluster ends by its deadline -- also one already under way on another thread (the engine's
commit thread saving positions when SIGTERM came).  No broker: futures nobody completes
stand for requests a broker leaves unanswered (``tests/e2e/test_kafka_gateway.py`` has the
gateway and a paused broker)."""

from __future__ import annotations

import concurrent.futures
import threading

import pytest

pytest.importorskip("confluent_kafka")

from wsnmom.adapters.kafka.closing import Closing

#: a wait no test may sit out: what the close cuts short
LONG = 600.0


def test_a_wait_under_way_ends_when_the_close_begins_and_reports_only_what_was_done() -> None:
    closing = Closing()
    answered: concurrent.futures.Future[object] = concurrent.futures.Future()
    unanswered: concurrent.futures.Future[object] = concurrent.futures.Future()
    answered.set_result("saved")
    result: list[set[concurrent.futures.Future[object]]] = []
    waiter = threading.Thread(
        target=lambda: result.append(closing.wait([answered, unanswered], LONG))
    )
    waiter.start()
    assert not closing.begun
    closing.begin(0.0)
    waiter.join(timeout=60)
    assert not waiter.is_alive()
    assert result == [{answered}]
    assert closing.begun and closing.remaining(LONG) == 0.0


def test_before_the_close_a_wait_ends_when_everything_is_done() -> None:
    closing = Closing()
    futures: list[concurrent.futures.Future[object]] = [
        concurrent.futures.Future() for _ in range(3)
    ]

    def answer() -> None:
        for future in futures:
            future.set_result(None)

    threading.Thread(target=answer).start()
    assert closing.wait(futures, LONG) == set(futures)
    assert closing.remaining(7.0) == 7.0  # no close: every timeout stays as asked


def test_work_that_outlives_the_close_is_left_to_finish_in_the_background() -> None:
    closing = Closing()
    closing.begin(0.0)
    release = threading.Event()
    finished = threading.Event()

    def hanging_close() -> None:  # a client's close waiting for an unanswered request
        release.wait(LONG)
        finished.set()

    closing.run(hanging_close, "test-close", LONG)  # returns: the deadline has passed
    assert not finished.is_set()
    release.set()
    assert finished.wait(60)  # and the work still ran to its end


def test_work_within_the_time_is_waited_for() -> None:
    closing = Closing()
    closing.begin(LONG)
    done: list[str] = []
    closing.run(lambda: done.append("closed"), "test-close", LONG)
    assert done == ["closed"]


def test_a_wait_begun_before_the_close_ends_when_it_begins_even_with_time_left() -> None:
    """The commit thread's periodic save, stuck on a connection the broker no longer
    answers, took the close's whole deadline, and the close's own save of every position
    then found none left (131 subscriptions "timed out" at once): it ends when the close
    begins, and a wait begun after that still has the close's time."""
    closing = Closing()
    stuck: concurrent.futures.Future[object] = concurrent.futures.Future()
    result: list[set[concurrent.futures.Future[object]]] = []
    waiter = threading.Thread(target=lambda: result.append(closing.wait([stuck], LONG)))
    waiter.start()
    try:
        closing.begin(LONG)
        waiter.join(timeout=30)
        assert not waiter.is_alive()
        assert result == [set()]
        later: concurrent.futures.Future[object] = concurrent.futures.Future()
        threading.Timer(0.2, later.set_result, ("saved",)).start()
        assert closing.wait([later], LONG) == {later}
    finally:
        stuck.set_result(None)  # releases the waiter of the code before the fix
        waiter.join(timeout=30)
