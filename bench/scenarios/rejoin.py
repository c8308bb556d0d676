"""Scenario rejoin: how fast a RabbitMQ adapter answers once its process continues after
a stop longer than RabbitMQ's heartbeat (SIGSTOP ... SIGCONT, as a paused VM or a long
GC pause): RabbitMQ closed its connections meanwhile, and the first call that needs a
channel (a depth query) must fail at once or answer on the new connection, not wait for
a channel that never opens.

A child process (the adapter, heartbeat 1 s, ten quorum subscription queues consumed)
queries the depths of its queues once a second; it is stopped for 4 s between two
queries, continued, and the time of the first query after the SIGCONT is measured
(3 rounds; 1 with ``--quick``).  Baseline: the adapter's ``operation_timeout`` (10 s),
the time such a call took before it was fixed.  Target: the worst round <= 0.5 x that.
``tests/adapters/test_rabbitmq_fence.py`` asserts that the query answers, and right.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid

from bench.middleware import Middleware
from bench.model import Metric, ScenarioResult, Target
from bench.scenarios.base import Context, Scenario
from bench.util import REPO

#: the adapter's default ``operation_timeout``: what the first query took before the fix
OPERATION_TIMEOUT = 10.0

_SAMPLER = """
import sys, time
from wsnmom.adapters.rabbitmq.adapter import RabbitMQAdapter
from wsnmom.core.adapter import SubscriptionSpec
from wsnmom.topic_mapping.model import PathPattern
a = RabbitMQAdapter(sys.argv[1] + "?heartbeat=1", {"queue_type": "quorum"})
a.open()
a.shared_by_instances()
pattern = (PathPattern(sys.argv[2], ("t",)),)
hs = [a.subscription(SubscriptionSpec(n, pattern)) for n in sys.argv[3:]]
for h in hs:
    h.start(lambda m: m.ack())
while True:
    print("sleeping", flush=True)
    time.sleep(1.0)
    t = time.monotonic()
    a.depths(hs)
    print(f"took {time.monotonic() - t:.3f}", flush=True)
    a.depths(hs)  # the connection is back before the next stop
"""


def one_round(url: str) -> float:
    """Seconds the first depth query took after a 4 s SIGSTOP of the sampler."""
    ns = f"urn:bench:rejoin:{uuid.uuid4().hex}"
    names = [f"rejoin-{uuid.uuid4().hex[:12]}" for _ in range(10)]
    child = subprocess.Popen(
        [sys.executable, "-c", _SAMPLER, url, ns, *names],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    assert child.stdout is not None
    try:
        # one query first (queues and consumers in place), then stopped while it sleeps
        while not child.stdout.readline().startswith("took "):
            pass
        if child.stdout.readline().strip() != "sleeping":
            raise RuntimeError("the sampler said something else")
        child.send_signal(signal.SIGSTOP)
        time.sleep(4)  # longer than RabbitMQ waits for a silent connection (2-3 s)
        child.send_signal(signal.SIGCONT)
        line = child.stdout.readline().strip()
        if not line.startswith("took "):
            raise RuntimeError(f"the sampler said {line!r}")
        return float(line.split()[1])
    finally:
        child.kill()
        child.wait()


class Rejoin(Scenario):
    """The first depth query after a SIGCONT (RabbitMQ)."""

    name = "rejoin"
    title = "Rejoin: first broker call after a stop longer than the heartbeat"
    middlewares = ("rabbitmq",)
    needs_server = False

    def run(self, ctx: Context, mw: Middleware | None, result: ScenarioResult) -> None:
        assert mw is not None
        url = mw.adapter_url(ctx.workdir)
        try:
            took = [one_round(url) for _ in range(ctx.pick(3, 1))]
        finally:
            mw.release(url)
        ctx.log(f"  first depth query after SIGCONT: {', '.join(f'{t:.2f}s' for t in took)}")
        result.details["rounds_s"] = took
        result.add(
            Metric(
                name="depth_after_sigcont_s",
                value=max(took),
                unit="s",
                baseline=OPERATION_TIMEOUT,
                baseline_name="operation_timeout (the time before the fix)",
                target=Target("<=", 0.5),
                note=f"worst of {len(took)}",
            )
        )
