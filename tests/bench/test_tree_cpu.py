"""bench/spark_runs.tree_cpu: the CPU time of a process tree counts live descendants (found
through every process's parent, not /proc/<pid>/task/*/children) and leaves out excluded
trees, as scenario 7 needs to part Spark's JVM and workers from the broker."""

from __future__ import annotations

import subprocess
import sys

from bench.spark_runs import tree_cpu

BUSY = "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass\n"
# a grandchild does the work; the live child has reaped it (its cutime)
SPAWN = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {BUSY!r}])\ninput()\n"


#: the measurement, run in a process of its own: the test process (a pytest-xdist worker,
#: say) may have other children of its own (brokers, gateways) spending CPU meanwhile
MEASURE = f"""
import subprocess, sys, time
from bench.spark_runs import tree_cpu
import os
before = tree_cpu(os.getpid())
child = subprocess.Popen([sys.executable, "-c", {SPAWN!r}], stdin=subprocess.PIPE)
deadline = time.monotonic() + 20
while (tree_cpu(child.pid) or 0.0) < 0.6 and time.monotonic() < deadline:
    time.sleep(0.05)
spent = tree_cpu(child.pid)
mine = tree_cpu(os.getpid())
without = tree_cpu(os.getpid(), frozenset([child.pid]))
child.kill()
child.wait()
print(before, spent, mine, without)
"""


def test_live_children_and_what_they_reaped_count_excluded_trees_do_not() -> None:
    done = subprocess.run(
        [sys.executable, "-c", MEASURE], capture_output=True, text=True, timeout=60, check=True
    )
    before, spent, mine, without = (float(v) for v in done.stdout.split())
    assert spent >= 0.6
    assert mine - before >= 0.6
    assert without - before < 0.5


def test_a_missing_process_tells_nothing() -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert tree_cpu(dead.pid) is None
