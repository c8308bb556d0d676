"""A test broker dies with the pytest that started it: a SIGKILLed pytest left RabbitMQ's
``beam.smp`` running for ever (session 9: two nodes an hour after the runs).

Each test starts a node the way a session fixture does, in a child process that plays
pytest, SIGKILLs that process, and waits until no process of the node's process group is
left.  RabbitMQ (``beam.smp`` under shell scripts) and PostgreSQL (not SIGKILLed: its
shared memory) have the watchdog of ``tests/fixtures/orphan_watch.py``; Mosquitto and
tansu, started directly, their parent-death signal.
Cost: a RabbitMQ node's start (~5 s of CPU), the others' well under a second.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.waiting import wait_until
from wsnmom.testing.components import missing

ROOT = Path(__file__).resolve().parents[2]

#: the child: start the node, say its process group and directory, then wait for ever
CHILD = """
import sys
from tests.fixtures.brokers import BrokerUnavailable
{import_line}
try:
    node = {node}()
    node.start()
except BrokerUnavailable as exc:
    print("unavailable", exc, flush=True)
    sys.exit(0)
print("started", node.pid, node.dir, flush=True)
sys.stdin.read()
"""

NODES = {
    "rabbitmq": ("from tests.fixtures.brokers import RabbitNode", "RabbitNode"),
    "postgres": ("from tests.fixtures.postgres import PostgresNode", "PostgresNode"),
    "mosquitto": ("from tests.fixtures.mosquitto import MosquittoNode", "MosquittoNode"),
    "tansu": ("from tests.fixtures.tansu import TansuNode", "TansuNode"),
}


def _group(pgid: int) -> list[int]:
    """The processes of process group ``pgid`` now (zombies not counted)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        state, group = fields[0], int(fields[2])
        if group == pgid and state != "Z":
            members.append(int(entry.name))
    return members


@pytest.fixture
def pytest_stand_in() -> Iterator[list[subprocess.Popen[str]]]:
    """The child processes a test starts; anything of theirs left is killed afterwards."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for child in started:
        child.kill()
        child.wait(timeout=30)


@pytest.mark.parametrize("name", sorted(NODES))
def test_a_node_dies_with_the_pytest_that_started_it(
    name: str, pytest_stand_in: list[subprocess.Popen[str]]
) -> None:
    import_line, node = NODES[name]
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(import_line=import_line, node=node)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    pytest_stand_in.append(child)
    assert child.stdout is not None
    line = child.stdout.readline().split(maxsplit=2)
    if line and line[0] == "unavailable":
        missing(f"{name}: {' '.join(line[1:])}")
    assert line and line[0] == "started", line
    pgid, directory = int(line[1]), Path(line[2].strip())
    try:
        assert _group(pgid), "the node runs"
        child.send_signal(signal.SIGKILL)  # pytest killed: no fixture finalizer runs
        child.wait(timeout=30)
        wait_until(lambda: not _group(pgid), 60, what=f"the {name} node's processes to end")
        wait_until(lambda: not directory.exists(), 30, what=f"the {name} node's directory gone")
    finally:
        if _group(pgid):
            os.killpg(pgid, signal.SIGKILL)  # the test failed: not left running either
