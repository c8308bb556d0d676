"""Which CPUs the process under test and the load side run on.

On a small machine the Python server under test and the load generators (wrk, the paced
sender, the consumer servers, the bench's own clients) otherwise share every core, and the
server's threads hand the GIL to each other across cores.  On the 2-core reference machine
that made the same bare Flask endpoint measure anywhere from 363 to 2,725 requests/s, and
cost the broker 1,400-1,700 µs of CPU per Notify instead of ~620 µs pinned
(docs/performance.md, F8).

With pinning (the default when there are at least two CPUs and ``taskset`` exists):

* the process under test -- ``wsnmom serve``, the bare-Flask baseline or the minimal relay,
  always the same CPUs for all -- runs on the first allowed CPU (:func:`server_prefix`);
* the bench process itself, and so every load generator and consumer it starts afterwards,
  runs on the others (:func:`pin_bench_to_clients`);
* middleware brokers the bench starts (RabbitMQ, ...) run on the load side too
  (:func:`pin_process_tree`): they are not under test, and in a deployment they run on
  other hosts.  Left on every CPU, the broker took CPU time from the gateway under test;
  pinned, the RabbitMQ ingress rate rose from 2,049 to 2,366 Notifies/s (docs/performance.md,
  F15);
* a raw middleware baseline (the raw client publishing and consuming, the raw fan-out) runs
  on the server CPUs (:func:`on_server_cpus`), where the gateway runs in the measurement it
  is compared with: both then have the broker on the load side's CPUs;
* a scenario whose subject uses every core (Spark in ``local[2]``) runs it, and the
  baseline it is compared with, on all allowed CPUs (:func:`on_all_cpus`): pinned to the
  load side, the two-core Spark job ran on one CPU, beside the broker.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class CpuPlan:
    """The CPU sets of the process under test and of the load side."""

    server: tuple[int, ...]
    clients: tuple[int, ...]

    def describe(self) -> dict[str, list[int]]:
        """JSON-able form for the report (middleware brokers share the clients' CPUs)."""
        return {
            "server": list(self.server),
            "clients": list(self.clients),
            "middleware": list(self.clients),
            "raw_baselines": list(self.server),
        }


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


def _children(pid: int) -> list[int]:
    """Direct child processes of ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # the command name in parentheses may contain spaces: split after the last ')'
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def pin_process_tree(pid: int) -> int:
    """Move every thread of ``pid`` and of its descendants to the client CPUs; children
    they start later inherit them.  Returns the number of threads moved (0 when nothing
    is pinned in this run)."""
    if _plan is None:
        return 0
    moved = 0
    todo = [pid]
    while todo:
        proc = todo.pop()
        try:
            tids = [int(t.name) for t in Path(f"/proc/{proc}/task").iterdir()]
        except OSError:
            continue
        for tid in tids:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, _plan.clients)
                moved += 1
        todo.extend(_children(proc))
    return moved


@contextlib.contextmanager
def on_server_cpus() -> Iterator[None]:
    """Run the calling thread (and the threads it starts) on the server CPUs for the
    block: for raw middleware baselines (see the module docstring)."""
    if _plan is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, _plan.server)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@contextlib.contextmanager
def on_all_cpus() -> Iterator[None]:
    """Run the calling thread (and the threads and processes it starts) on every CPU the
    bench may use for the block; brokers stay where they were pinned."""
    if _plan is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, (*_plan.server, *_plan.clients))
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
