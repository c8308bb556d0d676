"""A one-shot completion that a calling thread waits for and the loop thread sets.

The adapter's direct paths (a publish waiting for its confirms, a GetMessages waiting for
its ``basic.get`` replies) need the part of ``concurrent.futures.Future`` that one waiter
and one setter use.  A ``Future`` builds a ``threading.Condition`` for each instance and
runs Python-level lock juggling in ``wait``/``notify_all``: per 1-message Notify that was
~13 % of the gateway's GIL time under load.  Here one C lock, held from creation and
released once when the outcome is known, is the whole signal.
"""

from __future__ import annotations

import _thread


class Completion:
    """Set once (result or exception) from any thread; waited for by one or more threads.

    The first outcome wins; later ``set_result``/``set_exception`` calls are ignored, as
    they are on a ``Future`` that is already done (the callers check ``done()`` first).
    """

    __slots__ = ("_done", "_error", "_guard", "_signal")

    def __init__(self) -> None:
        self._signal = _thread.allocate_lock()
        self._signal.acquire()
        #: makes "first outcome wins" atomic when two threads finish at once
        self._guard = _thread.allocate_lock()
        self._done = False
        self._error: BaseException | None = None

    def done(self) -> bool:
        """Whether an outcome is set."""
        return self._done

    def set_result(self, _value: None = None) -> None:
        """Finish successfully (unless already finished)."""
        self._finish(None)

    def set_exception(self, error: BaseException) -> None:
        """Finish with ``error`` (unless already finished)."""
        self._finish(error)

    def _finish(self, error: BaseException | None) -> None:
        with self._guard:
            if self._done:
                return
            self._error = error
            self._done = True
        self._signal.release()

    def result(self, timeout: float | None = None) -> None:
        """Wait for the outcome; raise its exception, or ``TimeoutError`` after
        ``timeout`` seconds (None: wait as long as it takes)."""
        if not self._done:
            if not self._signal.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
                raise TimeoutError(f"not completed within {timeout}s")
            self._signal.release()  # let any other waiter through as well
        if self._error is not None:
            raise self._error


__all__ = ["Completion"]
