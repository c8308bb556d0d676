"""Password-hash checks off the request threads, bounded (:class:`HashWorkers`).

A password check costs a scrypt hash (some 50 ms of CPU and 16 MiB), and a client that
sends wrong passwords makes the gateway pay one per request.  Unbounded, a flood of them
took the CPU from every other client: a bearer client's Notify median went from 9 to
112 ms.  So checks run on their own threads (``auth.hash_threads``, at the lowest CPU
priority where the system allows a thread its own: Linux), and at most
``auth.hash_queue`` more wait for one; a check beyond that, or one that waited
:data:`MAX_WAIT` seconds, is refused at once with :class:`PasswordChecksBusy` (HTTP 503,
``Retry-After``).  Requests that need no hash (a bearer token, a name and password
verified before, a client certificate) never wait here.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from .identity import AuthenticationFailed

__all__ = ["MAX_WAIT", "HashWorkers", "PasswordChecksBusy"]

#: seconds a request waits for its check at most
MAX_WAIT = 5.0
#: the niceness of the hashing threads (the lowest priority)
NICENESS = 19


class PasswordChecksBusy(AuthenticationFailed):
    """Too many password checks in flight: try again shortly (never a verdict on the
    credentials; where no better answer exists it is a refusal like any other)."""


def _lower_priority() -> None:
    """Give the calling thread the lowest CPU priority (Linux: per thread)."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICENESS)


class HashWorkers:
    """Runs password checks on ``threads`` threads with at most ``queue`` waiting."""

    def __init__(self, threads: int = 1, queue: int = 16, *, max_wait: float = MAX_WAIT) -> None:
        self.threads = threads
        self.queue = queue
        self.max_wait = max_wait
        self._slots = threading.BoundedSemaphore(threads + queue)
        self._pool = ThreadPoolExecutor(
            max_workers=threads, thread_name_prefix="wsnmom-hash", initializer=_lower_priority
        )

    def run(self, check: Callable[[str, str], bool], password: str, stored: str) -> bool:
        """``check(password, stored)`` on a hashing thread.

        :raises PasswordChecksBusy: every thread is busy and the queue full, or the check
            did not start and finish within ``max_wait``."""
        if not self._slots.acquire(blocking=False):
            raise PasswordChecksBusy(
                f"{self.threads + self.queue} password checks in flight (auth.hash_threads "
                "+ auth.hash_queue)"
            )
        try:
            future: Future[bool] = self._pool.submit(check, password, stored)
        except BaseException:
            self._slots.release()
            raise
        future.add_done_callback(lambda _: self._slots.release())
        try:
            return future.result(timeout=self.max_wait)
        except FutureTimeout:
            future.cancel()  # not started yet: it never will; running: it finishes unread
            raise PasswordChecksBusy(
                f"a password check waited more than {self.max_wait:g} s"
            ) from None

    def close(self) -> None:
        """Stop the threads (checks still queued are dropped)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
