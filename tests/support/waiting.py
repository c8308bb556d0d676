"""Waiting for a condition in a test: the one polling helper of the suite.

``wait_until(check, what=...)`` calls ``check`` until it returns something truthy and returns
that value; after ``timeout`` seconds it fails with an AssertionError that names what was
awaited and the last value ``check`` returned (or the exception it raised).  A test never
sleeps a fixed time and then asserts: it waits for the outcome, or for a sentinel (see the
"Barriers" section of docs/testing.md) before asserting that something did not happen.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["wait_until"]

T = TypeVar("T")


def wait_until(
    check: Callable[[], T],
    timeout: float = 10.0,
    *,
    what: str = "the condition",
    interval: float = 0.02,
    errors: tuple[type[BaseException], ...] = (),
) -> T:
    """Poll ``check`` until its value is truthy; return that value.

    ``errors`` are exceptions of ``check`` that mean "not yet" (e.g. a connection refused
    while a server starts); any other exception fails the test at once.
    """
    deadline = time.monotonic() + timeout
    last: object = "(not called)"
    while True:
        try:
            value = check()
        except errors as exc:
            last = f"{type(exc).__name__}: {exc}"
        else:
            if value:
                return value
            last = value
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout:g} s waiting for {what}; last: {last!r}"
            )
        time.sleep(interval)
