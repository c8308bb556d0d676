"""Request ids stay unique per process when a gateway process is forked from one that had
imported wsnmom (a pre-forking supervisor, the suite's zygote: tests/support/zygote.py):
the forked child draws its own random prefix (core/log_context.py)."""

from __future__ import annotations

import subprocess
import sys

#: a process that imported the module forks; parent and child each print a new id
FORKED = """
import os, sys
from wsnmom.core.log_context import new_request_id
parent_first = new_request_id()
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(w, new_request_id().encode())
    os._exit(0)
os.waitpid(pid, 0)
print(parent_first, os.read(r, 64).decode(), new_request_id())
"""


def test_a_forked_process_draws_its_own_request_id_prefix() -> None:
    out = subprocess.run(
        [sys.executable, "-c", FORKED], capture_output=True, text=True, timeout=60, check=True
    ).stdout.split()
    parent_first, child, parent_next = out
    assert len(child) == 32
    assert child[:16] != parent_first[:16]  # the child's own prefix
    assert parent_next[:16] == parent_first[:16]  # the parent's is unchanged
    assert child != parent_next
