"""The retry schedule of a delivery channel: :class:`Backoff` (the gateway's ``[retry]``, or a
subscription's own delivery policy, ``core.delivery_policy``).

After the n-th failed attempt of a batch the channel waits ``initial_delay *
multiplier**(n-1)`` seconds (``initial_delay * n`` when linear), capped at ``max_delay``,
or what the consumer asked for with ``Retry-After`` when that is honoured; an answer with
one of the *final* HTTP statuses is not retried.  How a channel follows it:
``core.channel``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Backoff"]


@dataclass(frozen=True, slots=True)
class Backoff:
    """Retry schedule (seconds): the engine's, or a subscription's own
    (``core.delivery_policy``)."""

    max_attempts: int = 8
    initial_delay: float = 1.0
    multiplier: float = 2.0
    max_delay: float = 300.0
    give_up: str = "end"
    #: ``initial_delay * n`` after the n-th failure instead of the exponential
    linear: bool = False
    #: the longest ``Retry-After`` honoured; None: the consumer's ``Retry-After`` is ignored
    retry_after_max: float | None = None
    #: HTTP statuses after which a batch is not retried (it goes to the dead letters)
    final_statuses: frozenset[int] = frozenset()

    def delay(self, failures: int, retry_after: float | None = None) -> float:
        """Delay before the next attempt after ``failures`` consecutive failures (>= 1);
        the consumer's ``retry_after`` (seconds) instead when it is honoured."""
        if retry_after is not None and self.retry_after_max is not None:
            return float(min(max(retry_after, 0.0), self.retry_after_max))
        if failures >= self.max_attempts:
            return self.max_delay
        if self.linear:
            return float(min(self.initial_delay * failures, self.max_delay))
        return float(min(self.initial_delay * self.multiplier ** (failures - 1), self.max_delay))

    def is_final(self, status: int | None) -> bool:
        """Whether an answer with HTTP ``status`` ends the batch's retries."""
        return status is not None and status in self.final_statuses
