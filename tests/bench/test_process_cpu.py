"""bench.util.process_cpu_seconds reads another process's CPU time finer than a clock tick
(10 ms), the threads that ended included: scenario ``ha`` divides it by a few hundred
operations of a fraction of a millisecond each (docs/performance.md)."""

from __future__ import annotations

import subprocess
import sys

from bench.util import process_cpu_seconds

#: a thread spends CPU until the process has used 0.155 s (half a tick off the 10 ms
#: grid), ends, and the process prints its own CPU clock and waits on stdin
WORKER = """
import sys, threading, time
def spin():
    while time.process_time() < 0.155:
        pass
thread = threading.Thread(target=spin)
thread.start()
thread.join()
print(repr(time.process_time()), flush=True)
sys.stdin.readline()
"""


def test_cpu_seconds_of_another_process_to_the_millisecond() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        own = float(child.stdout.readline())
        seen = process_cpu_seconds(child.pid)
    finally:
        child.kill()
        child.wait()
    assert own >= 0.155
    # the child's own reading and ours differ only by what it spent after printing
    assert 0.0 <= seen - own < 0.002, (own, seen)
