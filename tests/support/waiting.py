"""Waiting for a condition in a test: the one polling helper of the suite.

``wait_until(check, what=...)`` calls ``check`` until it returns something truthy and returns
that value; after ``timeout`` seconds it fails with an AssertionError that names what was
awaited and the last value ``check`` returned (or the exception it raised).  A test never
sleeps a fixed time and then asserts: it waits for the outcome, or for a sentinel (see the
"Barriers" section of docs/testing.md) before asserting that something did not happen.

Polling interval: by default the first checks come 20 ms apart and the interval doubles up
to :data:`SLOWEST` (0.1 s): most outcomes come within a few checks, and a long wait no
longer checks 50 times a second (a check against a gateway costs it and the test 3-5 ms of
CPU, and the suite is CPU-bound).  A test that times an outcome through ``wait_until`` (a
failover gap) passes a fixed ``interval`` (:data:`FINE`, 20 ms): the back-off would make
the time it reads up to 0.1 s late.  A wait whose timeout is the bound ("within 1 s") needs
nothing: the last check comes at the deadline.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal, TypeVar

__all__ = ["FINE", "SLOWEST", "wait_until"]

T = TypeVar("T")

#: the first interval of the back-off, and the fixed interval of a test that times outcomes
FINE = 0.02
#: the longest interval of the back-off
SLOWEST = 0.1


def wait_until(
    check: Callable[[], T | Literal[False] | None],
    timeout: float = 10.0,
    *,
    what: str = "the condition",
    interval: float | None = None,
    errors: tuple[type[BaseException], ...] = (),
) -> T:
    """Poll ``check`` until its value is truthy; return that value.

    ``errors`` are exceptions of ``check`` that mean "not yet" (e.g. a connection refused
    while a server starts); any other exception fails the test at once.  ``interval``:
    seconds between checks, fixed (None: the back-off, :data:`FINE` doubling up to
    :data:`SLOWEST`).
    """
    deadline = time.monotonic() + timeout
    pause = FINE if interval is None else interval
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
        now = time.monotonic()
        if now >= deadline:
            raise AssertionError(
                f"timed out after {timeout:g} s waiting for {what}; last: {last!r}"
            )
        # the last check comes at the deadline, not up to an interval after it: a wait
        # whose timeout is the bound of an outcome ("within 1 s") is not loosened
        time.sleep(min(pause, deadline - now))
        if interval is None:
            pause = min(pause * 2, SLOWEST)
