"""The rig of tests/core/test_unordered_channel.py: an unordered channel
(``core.unordered``) on an engine that records its ready runs and timers instead of running
them, with a consumer the test scripts per message (``hold`` stalls a message's send until
released, ``fail`` makes its next sends fail) and a clock it can move ahead to make every
retry due.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from wsnmom.core import unordered
from wsnmom.core.adapter import Received
from wsnmom.core.backoff import Backoff
from wsnmom.core.channel import Channel
from wsnmom.core.channel_signals import EndSubscription
from wsnmom.core.delivery_budget import MemoryBudget
from wsnmom.core.lanes import Lane, Outcome
from wsnmom.core.ports import DeliveryFailed
from wsnmom.core.unordered import UnorderedChannel

from tests.support.handles import Handle, Msg

__all__ = ["LATER", "NOW", "Engine", "Rig"]

#: retries due at once
NOW = Backoff(max_attempts=3, initial_delay=0.0, multiplier=2.0, max_delay=0.0)
#: retries due after a second: a step-by-step test makes them due with ``Rig.elapse``
LATER = Backoff(max_attempts=3, initial_delay=1.0, multiplier=1.0, max_delay=1.0)


class Engine:
    """A Scheduler that records ready runs and timers instead of running them."""

    def __init__(self, backoff: Backoff = LATER) -> None:
        self.backoff = backoff
        self.prefetch = 64
        self.budget = MemoryBudget()
        self.ready: list[int] = []
        self.later: list[tuple[float, int]] = []
        self.reports: list[Outcome] = []
        #: what ``admit`` answers: seconds the destination's circuit stays open, or None
        self.wait: float | None = None
        self._lock = threading.Lock()

    def _ready(self, channel: Channel[Any], gen: int) -> None:
        with self._lock:
            self.ready.append(gen)

    def _later(self, delay: float, channel: Channel[Any], gen: int) -> None:
        with self._lock:
            self.later.append((delay, gen))

    def _spawn(self, fn: Callable[[], None]) -> None:
        fn()

    def admit(self, lane: Lane) -> float | None:
        return self.wait

    def report(self, lane: Lane, outcome: Outcome) -> None:
        self.reports.append(outcome)

    def take_ready(self) -> int | None:
        with self._lock:
            return self.ready.pop(0) if self.ready else None


class Rig:
    """An unordered channel (batch size 1) whose consumer the test scripts per message:
    ``hold`` stalls a message's send until released, ``fail`` makes its next sends fail."""

    def __init__(
        self,
        in_flight: int = 4,
        *,
        ordered: bool = False,
        batch_size: int = 1,
        monkeypatch: pytest.MonkeyPatch | None = None,
    ):
        self.monkeypatch = monkeypatch
        self.skew = 0.0
        self.journal: list[tuple[Any, ...]] = []
        self.engine = Engine()
        self.handle = Handle()
        self.sent: list[list[str]] = []
        self.holds: dict[str, threading.Event] = {}
        self.arrived: dict[str, threading.Event] = {}
        self.fail: dict[str, list[DeliveryFailed]] = {}
        self.drop: set[int] = set()
        self.ended: list[EndSubscription] = []
        self.letters: list[tuple[list[int], str, int]] = []
        self.confirm = True
        self.channel: UnorderedChannel[str] = UnorderedChannel(
            self.engine,
            "sub-u",
            self.handle,
            self.prepare,
            self.send,
            self.ended.append,
            batch_size,
            ordered,
            in_flight=in_flight,
        )
        self.channel.dead_letter = self.bury
        self.threads: list[threading.Thread] = []

    def prepare(self, batch: Sequence[Received]) -> Sequence[str | None]:
        return [None if m.n in self.drop else f"m{m.n}" for m in batch]  # type: ignore[attr-defined]

    def send(self, items: Sequence[str]) -> None:
        self.sent.append(list(items))
        for item in items:
            self.arrived.setdefault(item, threading.Event()).set()
            hold = self.holds.get(item)
            if hold is not None:
                assert hold.wait(10), f"{item} never released"
            failures = self.fail.get(item)
            if failures:
                raise failures.pop(0)

    def bury(self, messages: Sequence[Received], reason: str, attempts: int, error: Any) -> bool:
        self.letters.append(([m.n for m in messages], reason, attempts))  # type: ignore[attr-defined]
        return self.confirm

    def deliver(self, *ns: int) -> None:
        self.handle.push(*(Msg(n, self.journal) for n in ns))

    def elapse(self) -> None:
        """Make every retry due (the channel's clock jumps ahead by a minute)."""
        assert self.monkeypatch is not None
        self.skew += 60.0
        skew = self.skew
        self.monkeypatch.setattr(unordered, "_monotonic", lambda: time.monotonic() + skew)

    def retry(self) -> None:
        """The retry timer fires: its run (the retry is due by then)."""
        self.elapse()
        self.channel._run(self.channel._gen)

    def run_ready(self) -> None:
        """Run every scheduled run inline (those they schedule too)."""
        while (gen := self.engine.take_ready()) is not None:
            self.channel._run(gen)

    def run_in_thread(self) -> None:
        """Take one scheduled run and run it in a thread (its send may stall)."""
        gen = self.engine.take_ready()
        assert gen is not None, "nothing scheduled"
        t = threading.Thread(target=self.channel._run, args=(gen,), daemon=True)
        t.start()
        self.threads.append(t)

    def wait_arrived(self, item: str) -> None:
        assert self.arrived.setdefault(item, threading.Event()).wait(10), item

    def join(self) -> None:
        for t in self.threads:
            t.join(10)
            assert not t.is_alive()

    def acks(self) -> list[int]:
        return [e[1] for e in self.journal if e[0] == "ack"]

    def requeued(self) -> list[int]:
        return [e[1] for e in self.journal if e[0] == "nack" and e[2]]
