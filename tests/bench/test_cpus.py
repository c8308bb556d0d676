"""bench/cpus.py: a middleware's process tree moves to the load side's CPUs, and a raw
baseline runs on the server CPUs for its block only."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import cpus

pytestmark = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2 or shutil.which("taskset") is None,
    reason="pinning needs two CPUs and taskset",
)


@pytest.fixture
def plan() -> Iterator[cpus.CpuPlan]:
    chosen = cpus.choose(True)
    assert chosen is not None
    try:
        yield chosen
    finally:
        cpus.choose(False)


def _threads(pid: int) -> list[int]:
    return [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]


def test_process_tree_moves_to_the_load_side(plan: cpus.CpuPlan) -> None:
    # a shell whose child sleeps: the child must move with its parent
    parent = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])
    try:
        deadline = time.monotonic() + 5
        children: list[int] = []
        while not children and time.monotonic() < deadline:
            children = cpus._children(parent.pid)
            time.sleep(0.02)
        assert children, "the shell did not start its child"
        moved = cpus.pin_process_tree(parent.pid)
        assert moved >= 2
        for pid in [parent.pid, *children]:
            for tid in _threads(pid):
                assert os.sched_getaffinity(tid) == set(plan.clients)
    finally:
        for child in cpus._children(parent.pid):
            os.kill(child, 9)
        parent.kill()
        parent.wait()


def test_nothing_is_pinned_without_a_plan() -> None:
    cpus.choose(False)
    assert cpus.pin_process_tree(os.getpid()) == 0


def test_raw_baseline_runs_on_the_server_cpus_for_its_block(plan: cpus.CpuPlan) -> None:
    before = os.sched_getaffinity(0)
    seen: list[set[int]] = []
    with cpus.on_server_cpus():
        assert os.sched_getaffinity(0) == set(plan.server)
        worker = threading.Thread(target=lambda: seen.append(os.sched_getaffinity(0)))
        worker.start()
        worker.join()
    assert seen == [set(plan.server)]  # threads started in the block inherit it
    assert os.sched_getaffinity(0) == before
