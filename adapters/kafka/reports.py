"""The delivery reports of one ``Publisher.publish_many`` call (:class:`Batch`)."""

from __future__ import annotations

import _thread
from collections.abc import Callable, Sequence
from functools import partial

from confluent_kafka import KafkaError, Message

__all__ = ["Batch"]


class Batch:
    """Delivery reports of one ``publish_many`` call.

    The publishing thread waits on one C lock, held from creation and released when the
    last report arrived (``wait``): a ``threading.Event`` per publish builds a
    ``Condition`` and runs Python-level lock handling in ``wait`` and ``set``, 17 % of the
    gateway's GIL samples under 1-message Notifies (py-spy).

    Each produce is one *attempt* (``reporter``); ``rearm`` starts the next, and a report
    of an earlier attempt, or one after ``fail_all``, counts for nothing: it could
    otherwise stand for a record produced again and not yet acknowledged."""

    __slots__ = ("_signal", "attempt", "errors", "lock", "remaining", "reports")

    def __init__(self, size: int) -> None:
        self.lock = _thread.allocate_lock()
        self.remaining = size
        self.attempt = 0
        self.errors: list[KafkaError | None] = [None] * size
        #: the delivered message per index (read only for what the receipts need)
        self.reports: list[Message | None] = [None] * size
        self._signal = _thread.allocate_lock()
        if size > 0:
            self._signal.acquire()

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every report; whether they all came."""
        if self._signal.acquire(timeout=max(timeout, 0.0)):
            self._signal.release()  # done for good: any later wait passes at once
            return True
        return False

    def reporter(self, index: int) -> Callable[[KafkaError | None, Message], None]:
        """The delivery callback of ``index`` produced now (this attempt)."""
        return partial(self.report, self.attempt, index)

    def report(self, attempt: int, index: int, error: KafkaError | None, message: Message) -> None:
        with self.lock:
            if attempt != self.attempt or self.remaining <= 0:
                return  # late: a record an earlier attempt produced, or after fail_all
            if error is None:
                self.reports[index] = message
            self.errors[index] = error
            self.remaining -= 1
            last = self.remaining == 0
        if last:
            self._signal.release()

    def rearm(self, indices: Sequence[int]) -> None:
        """Wait again for the reports of ``indices`` (produced again, a new attempt);
        only once every report came (``wait`` returned True)."""
        with self.lock:
            self.attempt += 1
            for index in indices:
                self.errors[index] = None
                self.reports[index] = None
            self.remaining = len(indices)
        if indices:
            self._signal.acquire()

    def fail_all(self, error: KafkaError) -> None:
        with self.lock:
            for i, report in enumerate(self.reports):
                if report is None and self.errors[i] is None:
                    self.errors[i] = error
            waiting = self.remaining > 0
            self.remaining = 0
        if waiting:
            self._signal.release()
