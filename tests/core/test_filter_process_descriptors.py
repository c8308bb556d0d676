"""The filter sandbox on descriptors ``select()`` cannot watch: a gateway holding many
connections gives a new filter worker's pipes numbers of 1024 and above, and every
MessageContent evaluation must still get its verdicts (with ``select.select`` each one
failed, "filedescriptor out of range in select()", and the message was dropped)."""

from __future__ import annotations

from wsnmom.core.filter_sandbox import SandboxEvaluator
from wsnmom.core.filters import MessageContentFilter

from tests.core.test_filter_budget import mc
from tests.support.descriptors import descriptors_held


def test_a_worker_started_above_descriptor_1023_gives_its_verdicts() -> None:
    f = MessageContentFilter(mc("boolean(/m:n[@k = 'yes'])"))
    payloads = [b'<n xmlns="urn:m" k="yes"/>', b'<n xmlns="urn:m" k="no"/>', b"<other/>"]
    sandbox = SandboxEvaluator(cpu_limit=0.3, memory_mb=160, processes=1)
    try:
        for w in (*sandbox._pool.idle, *sandbox._pool.costly_idle):
            w.kill()  # a pool made earlier in the process: its pipes are below 1024
        with descriptors_held():
            assert sandbox.evaluate(f, payloads) == [True, False, False]
            worker_fds = [
                w.proc.stdout.fileno()
                for w in (*sandbox._pool.idle, *sandbox._pool.costly_idle)
                if w.proc is not None and w.proc.stdout is not None
            ]
            assert worker_fds and min(worker_fds) >= 1024  # the case under test
    finally:
        sandbox.close()
