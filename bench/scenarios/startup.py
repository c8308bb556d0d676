"""Scenario startup: what starting a process costs, from exec to ready.

``wsnmom serve`` on each middleware, started afresh (new store, new adapter URL) several
times: the CPU seconds the process used until ``/readyz`` first answered 200 (from
``/proc/PID/stat``, so the polling client is not counted) and the wall seconds until then.
On the embedded adapter, ``wsnmom --help`` too (CPU of the whole process): the command
line's start, which every shell command pays.

Baselines, measured in the same run on the same CPUs: ``python -c "import flask"`` for the
gateway (the least any Flask gateway imports), ``python -c "import click"`` for the
command line.  Medians of the repetitions.  Targets: the gateway's CPU to ready <= 6x the
Flask import, ``--help`` <= 8x the click import (docs/performance.md, "Process start").
"""

from __future__ import annotations

import resource
import statistics
import subprocess
import sys

from bench import cpus
from bench.middleware import Middleware
from bench.model import Metric, ScenarioResult, Target
from bench.scenarios.base import Context, Scenario
from bench.server import ServerProcess
from bench.util import process_cpu_seconds

#: starts per measurement (full run, quick run)
REPEATS = (7, 3)


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_python(args: list[str]) -> float:
    """CPU seconds of one ``python ARGS`` run to completion (on the server's CPUs)."""
    before = _child_cpu()
    subprocess.run(
        [*cpus.server_prefix(), sys.executable, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=True,
        timeout=120,
    )
    return _child_cpu() - before


def start_to_ready(ctx: Context, mw: Middleware, tag: str) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one fresh ``wsnmom serve`` until /readyz."""
    workdir = ctx.workdir / f"{tag}-{mw.name}"
    url = mw.adapter_url(workdir)
    server = ServerProcess(url, workdir)
    try:
        wall = server.start()
        assert server.pid is not None
        return process_cpu_seconds(server.pid), wall
    finally:
        server.stop()
        mw.release(url)


class Startup(Scenario):
    """CPU and wall time from exec to ready: the gateway and the command line."""

    name = "startup"
    title = "Startup: exec to /readyz (gateway) and wsnmom --help, against a bare import"

    def run(self, ctx: Context, mw: Middleware | None, result: ScenarioResult) -> None:
        assert mw is not None
        repeats = ctx.pick(*REPEATS)
        flask = [run_python(["-c", "import flask"]) for _ in range(repeats)]
        starts = [start_to_ready(ctx, mw, f"startup{i}") for i in range(repeats)]
        cpu = statistics.median(c for c, _ in starts)
        wall = statistics.median(w for _, w in starts)
        result.details.update(
            repeats=repeats, serve_cpu_s=[c for c, _ in starts], flask_import_cpu_s=flask
        )
        ctx.log(f"  serve to ready: {cpu:.2f} s CPU, {wall:.2f} s wall ({mw.name})")
        result.add(
            Metric(
                name="serve_ready_cpu_s",
                value=cpu,
                unit="s",
                baseline=statistics.median(flask),
                baseline_name='python -c "import flask" (CPU)',
                target=Target("<=", 6.0),
            )
        )
        result.add(Metric(name="serve_ready_wall_s", value=wall, unit="s"))
        if mw.name != "embedded":
            return
        click = [run_python(["-c", "import click"]) for _ in range(repeats)]
        helps = [run_python(["-m", "wsnmom", "--help"]) for _ in range(repeats)]
        result.details.update(click_import_cpu_s=click, help_cpu_s=helps)
        ctx.log(f"  wsnmom --help: {statistics.median(helps):.2f} s CPU")
        result.add(
            Metric(
                name="cli_help_cpu_s",
                value=statistics.median(helps),
                unit="s",
                baseline=statistics.median(click),
                baseline_name='python -c "import click" (CPU)',
                target=Target("<=", 8.0),
            )
        )
