"""Which CPUs the process under test and the load side run on.

On a small machine the Python server under test and the load generators (wrk, the paced
sender, the consumer servers, the bench's own clients) otherwise share every core, and the
server's threads hand the GIL to each other across cores.  On the 2-core reference machine
that made the same bare Flask endpoint measure anywhere from 363 to 2,725 requests/s, and
cost the broker 1,400-1,700 µs of CPU per Notify instead of ~620 µs pinned
(docs/performance.md, F8).

With pinning (the default when there are at least two CPUs and ``taskset`` exists):

* the process under test -- ``wsnmom serve`` or the bare-Flask baseline, always the same
  CPUs for both -- runs on the first allowed CPU (:func:`server_prefix`);
* the bench process itself, and so every load generator and consumer it starts afterwards,
  runs on the others (:func:`pin_bench_to_clients`);
* middleware brokers started before that (RabbitMQ, ...) keep every CPU.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CpuPlan:
    """The CPU sets of the process under test and of the load side."""

    server: tuple[int, ...]
    clients: tuple[int, ...]

    def describe(self) -> dict[str, list[int]]:
        """JSON-able form for the report."""
        return {"server": list(self.server), "clients": list(self.clients)}


_plan: CpuPlan | None = None


def choose(enabled: bool) -> CpuPlan | None:
    """Decide the plan for this run (None: nothing is pinned) and remember it."""
    global _plan
    _plan = None
    if not enabled or shutil.which("taskset") is None or not hasattr(os, "sched_getaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        return None
    _plan = CpuPlan(server=(allowed[0],), clients=tuple(allowed[1:]))
    return _plan


def current() -> CpuPlan | None:
    """The plan chosen for this run, if any."""
    return _plan


def server_prefix() -> list[str]:
    """Command prefix that runs a process under test on the server CPUs ([] when unpinned)."""
    if _plan is None:
        return []
    return ["taskset", "-c", ",".join(map(str, _plan.server))]


def pin_bench_to_clients() -> None:
    """Move the calling thread (the bench's main thread) to the client CPUs; threads and
    processes it creates from now on inherit them."""
    if _plan is not None:
        os.sched_setaffinity(0, _plan.clients)
