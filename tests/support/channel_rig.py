"""The rig of the tests that drive ``core.channel`` step by step
(tests/core/test_channel_mutants.py, test_channel_restart_mutants.py,
test_channel_feature_mutants.py): a channel on an engine that records what the channel asks
for (ready runs, timers, spawned calls, lane admissions and reports) instead of running
threads and timers, and a consumer whose answers the test scripts; for the later features,
stand-ins for the memory budget, the dead-letter sink and ``core.later.later``.  No conftest
fixture: ``make mutation`` starts these tests without the repository's plugins.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from wsnmom.core.adapter import Received
from wsnmom.core.backoff import Backoff
from wsnmom.core.channel import Channel
from wsnmom.core.channel_signals import EndSubscription
from wsnmom.core.delivery_budget import MESSAGE_OVERHEAD, MemoryBudget
from wsnmom.core.lanes import Lane, Outcome

from tests.support.handles import Handle, Msg

__all__ = ["BrokenMsg", "Budget", "Engine", "Rig", "Sink", "Timers", "counter", "rig_with", "size"]


class BrokenMsg(Msg):
    def ack(self) -> None:
        raise RuntimeError("handle gone")

    def nack(self, requeue: bool = True) -> None:
        raise RuntimeError("handle gone")


class Engine:
    """A Scheduler that records: ready channels, timers, spawned calls, lane reports."""

    def __init__(self, backoff: Backoff | None = None, wait: float | None = None) -> None:
        self.backoff = backoff or Backoff(max_attempts=3, initial_delay=1.0, max_delay=10.0)
        self.prefetch = 7
        self.ready: list[int] = []
        self.later: list[tuple[float, int]] = []
        self.spawned: list[Callable[[], None]] = []
        self.wait = wait
        self.admitted: list[Lane] = []
        self.reports: list[Outcome] = []
        #: no byte bound: these tests are about settling, retries and generations
        self.budget = MemoryBudget()

    def _ready(self, channel: Channel[Any], gen: int) -> None:
        self.ready.append(gen)

    def _later(self, delay: float, channel: Channel[Any], gen: int) -> None:
        self.later.append((delay, gen))

    def _spawn(self, fn: Callable[[], None]) -> None:
        self.spawned.append(fn)
        fn()

    def admit(self, lane: Lane) -> float | None:
        self.admitted.append(lane)
        return self.wait

    def report(self, lane: Lane, outcome: Outcome) -> None:
        self.reports.append(outcome)


class Rig:
    """A channel on a recording engine, with a consumer whose answers the test scripts."""

    def __init__(
        self,
        *,
        batch_size: int = 10,
        ordered: bool = False,
        backoff: Backoff | None = None,
        wait: float | None = None,
        drop: Callable[[int], bool] = lambda n: False,
        destination: str | None = None,
        trace: Callable[[str], str | None] | None = None,
    ) -> None:
        self.journal: list[tuple[Any, ...]] = []
        self.engine = Engine(backoff, wait)
        self.handle = Handle()
        self.sent: list[list[str]] = []
        self.failures: list[Exception] = []
        self.ended: list[EndSubscription] = []
        self.drop = drop
        self.prepared: list[list[int]] = []
        self.during_send: Callable[[], None] | None = None
        #: called once, inside the next ``prepare`` (messages arriving meanwhile)
        self.during_prepare: Callable[[], None] | None = None
        #: ``prepare`` raises this once for a batch that starts with this message
        self.refuse: tuple[int, Exception] | None = None
        self.channel: Channel[str] = Channel(
            self.engine,
            "sub-1",
            self.handle,
            self.prepare,
            self.send,
            self.ended.append,
            batch_size,
            ordered=ordered,
            destination=destination,
            trace=trace,
        )

    def prepare(self, batch: Sequence[Received]) -> Sequence[str | None]:
        ns = [m.n for m in batch]  # type: ignore[attr-defined]
        self.prepared.append(ns)
        if self.refuse is not None and ns and ns[0] == self.refuse[0]:
            error, self.refuse = self.refuse[1], None
            raise error
        hook, self.during_prepare = self.during_prepare, None
        if hook is not None:
            hook()
        return [None if self.drop(n) else f"m{n}" for n in ns]

    def send(self, items: Sequence[str]) -> None:
        self.sent.append(list(items))
        if self.during_send is not None:
            self.during_send()
        if self.failures:
            raise self.failures.pop(0)

    def deliver(self, *ns: int) -> list[Msg]:
        assert self.handle.on_message is not None
        msgs = [Msg(n, self.journal) for n in ns]
        for m in msgs:
            self.handle.on_message(m)
        return msgs

    def run(self, lane: Lane | None = None) -> None:
        self.channel._run(self.channel._gen, lane)

    def acks(self) -> list[int]:
        return [e[1] for e in self.journal if e[0] == "ack"]


def counter(c: Any) -> float:
    return float(c._value.get())


class Budget:
    """A ``MemoryBudget`` stand-in: ``room`` bytes (None: no bound), recording every
    charge, release and park; ``waiting`` is what ``has_parked`` says."""

    def __init__(self, room: int | None = None, waiting: bool = False) -> None:
        self.room = room
        self.waiting = waiting
        self.taken: list[tuple[str, int, bool]] = []
        self.released: list[tuple[str, int]] = []
        self.parks: list[tuple[str, Any]] = []

    def take(self, group: str, size: int, channel: object = None, *, force: bool = False) -> bool:
        self.taken.append((group, size, force))
        if force or self.room is None:
            return True
        if size > self.room:
            return False
        self.room -= size
        return True

    def release(self, group: str, size: int) -> None:
        self.released.append((group, size))
        if self.room is not None:
            self.room += size

    def park(self, group: str, channel: Any) -> None:
        self.parks.append((group, channel))

    def has_parked(self) -> bool:
        return self.waiting


class Sink:
    """A dead-letter sink: records (message numbers, reason, attempts, error) and answers
    ``confirm``."""

    def __init__(self, confirm: bool = True) -> None:
        self.confirm = confirm
        self.letters: list[tuple[list[int], str, int, str | None]] = []

    def __call__(
        self, messages: Sequence[Received], reason: str, attempts: int, error: str | None
    ) -> bool:
        self.letters.append(([m.n for m in messages], reason, attempts, error))  # type: ignore[attr-defined]
        return self.confirm


class Timers:
    """Stands in for ``core.later.later`` in core.channel_give_up: records, never calls."""

    made: list[Timers] = []

    def __init__(self, interval: float, function: Callable[[], None]) -> None:
        self.interval = interval
        self.function = function
        Timers.made.append(self)


def rig_with(
    budget: Budget | None = None,
    *,
    group: str = "owner",
    bounded: bool = True,
    sink: Sink | None = None,
    **kwargs: Any,
) -> Rig:
    """A rig whose channel has ``budget``, ``group``, ``bounded`` and ``sink``."""
    rig = Rig(**kwargs)
    rig.engine.budget = budget or Budget()  # type: ignore[assignment]
    ch = rig.channel
    ch.group = group
    ch.bounded = bounded
    ch.dead_letter = sink
    return rig


def size(n: int) -> int:
    return len(str(n).encode()) + MESSAGE_OVERHEAD
