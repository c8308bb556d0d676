"""Small helpers shared by the benchmark modules: ports, polling, percentiles, RSS, the
CPU time of a process, a one-off measurement's figures printed (and written) as JSON, a
PostgreSQL database to measure on, publishers on threads timed until a round trip ends."""

from __future__ import annotations

import ctypes
import json
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def print_figures(figures: Mapping[str, Any], path: Path | None) -> None:
    """Print ``figures`` as indented JSON, and write them to ``path`` too (``--json``)."""
    text = json.dumps(figures, indent=2)
    print(text)
    if path is not None:
        path.write_text(text + "\n")


@contextmanager
def postgres() -> Iterator[str]:
    """A fresh database on ``WSNMOM_BENCH_POSTGRES_URL``'s server, else on a private
    PostgreSQL server (the test suite's fixture code) stopped on leaving; its URL."""
    from tests.fixtures.postgres import PostgresNode, fresh_database

    with ExitStack() as stack:
        url = os.environ.get("WSNMOM_BENCH_POSTGRES_URL")
        if not url:
            node = PostgresNode()  # its own temporary directory: the postgres user owns it
            node.start()
            stack.callback(node.cleanup)
            url = node.url
        yield stack.enter_context(fresh_database(url))


def timed_threads(
    target: Callable[[int], object], count: int, done: threading.Event, timeout: float = 120.0
) -> tuple[bool, float]:
    """``target(k)`` for k in range(``count``), each on a thread of its own, then a wait of
    up to ``timeout`` seconds for ``done``: whether it was set, and the seconds from before
    the threads started until then."""
    started = time.perf_counter()
    threads = [threading.Thread(target=target, args=(k,)) for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    finished = done.wait(timeout)
    return finished, time.perf_counter() - started


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(predicate: Callable[[], bool], timeout: float, poll: float = 0.05) -> bool:
    """Poll ``predicate`` until it is true (True) or ``timeout`` seconds passed (False)."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` percentile (0-100) of ``values`` by nearest rank; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def rss_bytes(pid: int) -> int | None:
    """Resident set size of process ``pid`` (psutil when installed, else /proc)."""
    try:
        import psutil

        return int(psutil.Process(pid).memory_info().rss)
    except ImportError:
        pass
    except Exception:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def median(values: Sequence[float]) -> float | None:
    """The median of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _cpu_clock(pid: int) -> int | None:
    """The id of the CPU-time clock of process ``pid`` (``clock_getcpuclockid``), None
    where the C library or the kernel does not offer one."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        clock = ctypes.c_int()
        if libc.clock_getcpuclockid(pid, ctypes.byref(clock)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return clock.value


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a whole process (all its threads, those that ended too)
    has used so far (a process of ours that has not been waited for).

    Read from the process's CPU-time clock, which counts nanoseconds; ``/proc/PID/stat``
    counts clock ticks (10 ms), too coarse for a few hundred operations of 0.3 ms each,
    and is read only where that clock is not available."""
    clock = _cpu_clock(pid)
    if clock is not None:
        try:
            return time.clock_gettime(clock)
        except OSError:
            pass
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
