"""The one-shot completion the RabbitMQ adapter's direct publish and pull paths wait on
(adapters/rabbitmq/_completion.py).  No broker needed: it is plain threading."""

from __future__ import annotations

import threading

import pytest
from wsnmom.adapters.rabbitmq._completion import Completion


def test_result_set_from_another_thread_wakes_the_waiter() -> None:
    done = Completion()
    threading.Timer(0.05, done.set_result).start()
    done.result(60.0)  # a waiter the result does not wake raises TimeoutError instead
    assert done.done()


def test_exception_is_raised_to_the_waiter() -> None:
    done = Completion()
    done.set_exception(ValueError("nack"))
    with pytest.raises(ValueError, match="nack"):
        done.result(1.0)
    with pytest.raises(ValueError, match="nack"):  # and again, not a hang
        done.result(0.0)


def test_timeout_raises_timeout_error_and_a_later_result_still_arrives() -> None:
    done = Completion()
    with pytest.raises(TimeoutError):
        done.result(0.05)
    assert not done.done()
    done.set_result()
    done.result(0.0)


def test_first_outcome_wins() -> None:
    done = Completion()
    done.set_result()
    done.set_exception(RuntimeError("late"))
    done.result(0.0)  # no exception: the result came first
    failed = Completion()
    failed.set_exception(RuntimeError("first"))
    failed.set_result()
    with pytest.raises(RuntimeError, match="first"):
        failed.result(0.0)


def test_concurrent_finishers_release_the_waiters_once() -> None:
    """Many threads finishing at once: exactly one outcome, every waiter returns."""
    for _ in range(50):
        done = Completion()
        barrier = threading.Barrier(8)
        errors: list[BaseException] = []

        def finish(i: int, done: Completion = done, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            if i % 2:
                done.set_result()
            else:
                done.set_exception(RuntimeError(str(i)))

        def wait(done: Completion = done, errors: list[BaseException] = errors) -> None:
            try:
                done.result(5.0)
            except RuntimeError:
                pass
            except BaseException as exc:  # a TimeoutError or anything else is a failure
                errors.append(exc)

        waiters = [threading.Thread(target=wait) for _ in range(3)]
        finishers = [threading.Thread(target=finish, args=(i,)) for i in range(8)]
        for t in waiters + finishers:
            t.start()
        for t in waiters + finishers:
            t.join(10)
        assert not errors and done.done()
