"""bench/spark_runs.tree_cpu: the CPU time of a process tree counts live descendants (found
through every process's parent, not /proc/<pid>/task/*/children) and leaves out excluded
trees, as scenario 7 needs to part Spark's JVM and workers from the broker."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from bench.spark_runs import tree_cpu

BUSY = "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass\n"
# a grandchild does the work; the live child has reaped it (its cutime)
SPAWN = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {BUSY!r}])\ninput()\n"


def test_live_children_and_what_they_reaped_count_excluded_trees_do_not() -> None:
    before = tree_cpu(os.getpid())
    assert before is not None
    child = subprocess.Popen([sys.executable, "-c", SPAWN], stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while (tree_cpu(child.pid) or 0.0) < 0.6 and time.monotonic() < deadline:
            time.sleep(0.05)
        spent = tree_cpu(child.pid)
        assert spent is not None and spent >= 0.6
        mine = tree_cpu(os.getpid())
        assert mine is not None and mine - before >= 0.6
        without = tree_cpu(os.getpid(), frozenset([child.pid]))
        assert without is not None and without - before < 0.5
    finally:
        child.kill()
        child.wait()


def test_a_missing_process_tells_nothing() -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert tree_cpu(dead.pid) is None
