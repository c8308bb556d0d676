"""In-process stand-ins for a durable subscription, for tests that drive core's delivery
parts step by step: a message that writes its settling into a journal, and a handle that
records start/stop and lets the test deliver through the callback it was started with."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from wsnmom.core.adapter import Received, SubscriptionHandle
from wsnmom.topic_mapping.model import Topic


class Msg(Received):
    """Message ``n``; its ``ack``/``nack`` append ``("ack", n)`` / ``("nack", n, requeue)``
    to ``journal``."""

    def __init__(self, n: int, journal: list[tuple[Any, ...]]) -> None:
        self.n = n
        self.journal = journal
        self.topic = Topic("urn:t", ("a",))
        self.body = str(n).encode()
        self.headers = {}
        self.content_type = "application/xml"
        self.redelivered = False

    def ack(self) -> None:
        self.journal.append(("ack", self.n))

    def nack(self, requeue: bool = True) -> None:
        self.journal.append(("nack", self.n, requeue))


class Handle(SubscriptionHandle):
    """Records ``start`` (its prefetch) and ``stop``; ``push`` delivers through the
    callback of the last ``start``; ``held`` is what ``depth`` reports."""

    def __init__(self, name: str = "h") -> None:
        self.name = name
        self.starts: list[int] = []
        self.stops = 0
        self.on_message: Callable[[Received], None] | None = None
        self.held: int | None = 0

    def start(self, on_message: Callable[[Received], None], prefetch: int = 64) -> None:
        self.starts.append(prefetch)
        self.on_message = on_message

    def stop(self) -> None:
        self.stops += 1

    def push(self, *messages: Received) -> None:
        assert self.on_message is not None, "not started"
        for m in messages:
            self.on_message(m)

    def pull(self, max_messages: int, timeout: float = 0.0) -> list[Received]:
        raise NotImplementedError

    def depth(self) -> int | None:
        return self.held

    def delete(self) -> None:
        raise NotImplementedError
