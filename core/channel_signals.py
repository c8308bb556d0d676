"""What a delivery channel's ``prepare`` raises to change the channel's course (and what its
``on_give_up`` is handed): :class:`EndSubscription`, :class:`PrepareLater`."""

from __future__ import annotations

__all__ = ["EndSubscription", "PrepareLater"]


class EndSubscription(Exception):
    """The subscription cannot go on; ``cause`` says why in one word ("delivery": the
    consumer stayed unreachable, "filter": its filter exceeded its evaluation budget) and
    ``reason`` in a sentence."""

    def __init__(self, reason: str, cause: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.cause = cause


class PrepareLater(Exception):
    """``prepare`` cannot run now (the subscription used its share of the filter
    processes): the messages go back to the head of the queue and the channel runs again
    after ``delay`` seconds, holding no thread meanwhile; not a failed attempt."""

    def __init__(self, delay: float) -> None:
        super().__init__(f"prepare again in {delay:.2f}s")
        self.delay = delay
