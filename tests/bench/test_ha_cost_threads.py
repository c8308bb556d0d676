"""Scenario ``ha``'s cost part splits CPU per delivery by thread
(``WSNMOM_BENCH_HA_THREADS=1``) and reports messages per POST: the per-thread figures of
another process add up to its own CPU clock, by name, a pool's threads as one
(docs/performance.md, "Where cluster mode's CPU per delivery goes")."""

from __future__ import annotations

import collections
import subprocess
import sys
from pathlib import Path

from bench import ha_threads
from bench.scenarios import ha_cost
from bench.server import ServerProcess
from bench.util import process_cpu_seconds

#: two threads of one pool spend CPU and stay alive (a thread's CPU is read from its own
#: entry in /proc while it exists); the process prints its threads' ids when both spent it
WORKER = """
import sys, threading, time
spent, end = threading.Barrier(3), threading.Event()
def spin():
    while time.thread_time() < 0.05:
        pass
    spent.wait()
    end.wait()
threads = [threading.Thread(target=spin, name=f"pool-{i}") for i in range(2)]
for t in threads:
    t.start()
spent.wait()
print(" ".join(str(t.native_id) for t in threads), flush=True)
sys.stdin.readline()
end.set()
"""


class _Counting:
    address = "http://127.0.0.1:9/unused"
    posts = 4

    def count(self) -> int:
        return 0

    def close(self) -> None:
        return None


def test_thread_figures_add_up_to_the_process_and_name_pools_as_one(tmp_path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        pool = [int(tid) for tid in child.stdout.readline().split()]
        instance = ha_cost.Instance(ServerProcess("embedded://x", tmp_path), _Counting(), "x")
        instance.threads = collections.Counter(ha_threads.thread_cpu(child.pid, {}))
        instance.names = {tid: f"pool-{i}" for i, tid in enumerate(pool)}
        instance.names[child.pid] = "MainThread"
        instance.tally.deliveries = 1000
        whole = process_cpu_seconds(child.pid)
    finally:
        child.kill()
        child.wait()
    figures = dict(instance.thread_figures())
    assert set(figures) == {"pool-N", "MainThread"}
    # 2 x 50 ms in the pool: 100 µs per delivery of 1000
    assert 99.0 <= figures["pool-N"] < 110.0, figures
    assert abs(sum(figures.values()) * 1000 / 1e6 - whole) < 0.002


def test_messages_per_post_is_deliveries_over_posts() -> None:
    tally = ha_cost.Tally(notify_cpu=1.0, notifies=10, delivery_cpu=1.0, deliveries=100)
    tally.subscribe_s, tally.subscribes, tally.posts = 1.0, 1, 40
    assert tally.figures()["messages_per_post"] == 2.5


#: one thread ends 50 short waits (each a wake-up) and stays alive; the process prints its
#: id when it is done
WAKER = """
import sys, threading
done, end = threading.Event(), threading.Event()
def wake():
    tick = threading.Event()
    for _ in range(50):
        tick.wait(0.001)
    done.set()
    end.wait()
thread = threading.Thread(target=wake, name="waker-0")
thread.start()
done.wait()
print(thread.native_id, flush=True)
sys.stdin.readline()
end.set()
"""


def test_wakeups_count_each_threads_ended_waits_by_name_pools_as_one() -> None:
    """``bench.ha_threads --idle``'s wake-ups: a thread's voluntary switches (its ended
    waits), summed by pool name."""
    child = subprocess.Popen(
        [sys.executable, "-c", WAKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        tid = int(child.stdout.readline())
        woke = ha_threads.thread_wakeups(child.pid, {tid: "waker-0"})
    finally:
        child.kill()
        child.wait()
    assert "waker-N" in woke
    assert 50 <= woke["waker-N"] < 200, woke  # its 50 waits, and the GIL's few
