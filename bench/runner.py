"""Runs the selected scenarios on every available middleware and builds the report."""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

from bench import cpus
from bench.middleware import MIDDLEWARES, PLANNED, Middleware
from bench.model import AdapterInfo, RunReport, ScenarioResult, machine_info, now_iso
from bench.scenarios import SCENARIOS, Scenario
from bench.scenarios.base import Context
from bench.server import serve_available
from bench.util import REPO


def log(message: str) -> None:
    """Progress output (stderr, so stdout keeps only the table)."""
    print(message, file=sys.stderr, flush=True)


def select_scenarios(names: Sequence[str] | None) -> list[Scenario]:
    """The scenarios named (all when None), in run order; ValueError on an unknown name."""
    known = {cls.name: cls for cls in SCENARIOS}
    if not names:
        return [cls() for cls in SCENARIOS]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown scenario(s) {unknown}; known: {', '.join(known)}")
    return [cls() for cls in SCENARIOS if cls.name in names]


def run(
    scenario_names: Sequence[str] | None,
    adapter_names: Sequence[str] | None,
    quick: bool,
    json_path: Path,
    keep: bool = False,
    pin: bool = True,
    smoke: bool = False,
) -> RunReport:
    """Run everything selected; the JSON report is rewritten after every scenario."""
    scenarios = select_scenarios(scenario_names)
    report = RunReport(
        started_at=now_iso(),
        quick=quick,
        smoke=smoke,
        machine=machine_info(REPO),
        scenarios=[s.name for s in scenarios],
    )
    plan = cpus.choose(pin)
    report.machine["cpu_plan"] = plan.describe() if plan else None
    workdir = Path(tempfile.mkdtemp(prefix="wsnmom-bench-"))
    ctx = Context(quick=quick, workdir=workdir, log=log, smoke=smoke)

    def chosen(name: str) -> bool:
        return not adapter_names or name in adapter_names

    wanted = [cls() for cls in MIDDLEWARES if chosen(cls.name)]
    planned = [p for p in PLANNED if chosen(p.name)]
    needs_mw = {
        mw.name
        for s in scenarios
        if s.middlewares != ()
        for mw in wanted
        if s.middlewares is None or mw.name in s.middlewares
    }
    if any(s.needs_server for s in scenarios):
        ctx.serve_unavailable = serve_available()
        if ctx.serve_unavailable:
            log(f"! {ctx.serve_unavailable}")
    live: dict[str, Middleware] = {}
    infos: dict[str, AdapterInfo] = {}
    try:
        for mw in wanted:
            reason = mw.unavailable()
            if reason is None and mw.name in needs_mw and ctx.serve_unavailable is None:
                try:
                    log(f"starting {mw.name} ...")
                    mw.start(workdir / f"mw-{mw.name}")
                except Exception as exc:
                    reason = f"could not start: {exc}"[:500]
            infos[mw.name] = AdapterInfo(mw.name, reason is None, reason, mw.describe())
            if reason is None:
                live[mw.name] = mw
        for p in planned:
            infos[p.name] = AdapterInfo(p.name, False, p.unavailable(), None)
        for info in infos.values():
            report.adapters.append(info)
            if not info.available:
                log(f"- {info.name}: not available ({info.reason})")
        if plan is not None:
            # brokers are not under test: they share the load side's CPUs
            for mw in live.values():
                for pid in mw.pids():
                    cpus.pin_process_tree(pid)
            cpus.pin_bench_to_clients()
            log(
                f"CPUs: process under test {plan.server}, load side and middleware "
                f"{plan.clients}, raw baselines {plan.server}"
            )
        for scenario in scenarios:
            log(f"== {scenario.name}: {scenario.title}")
            if scenario.middlewares == ():
                report.results.append(_run_one(ctx, scenario, None))
            else:
                for name, info in infos.items():
                    if scenario.middlewares is not None and name not in scenario.middlewares:
                        continue
                    res = ScenarioResult(scenario.name, name)
                    target = live.get(name)
                    if target is None:
                        res.status = "not_available"
                        res.reason = info.reason
                    elif scenario.needs_server and ctx.serve_unavailable:
                        res.status = "not_available"
                        res.reason = ctx.serve_unavailable
                    else:
                        res = _run_one(ctx, scenario, target)
                    report.results.append(res)
            report.finished_at = now_iso()
            report.write(json_path)
    finally:
        for mw in live.values():
            try:
                mw.stop()
            except Exception as exc:
                log(f"! stopping {mw.name}: {exc}")
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            log(f"work directory kept: {workdir}")
    report.finished_at = now_iso()
    report.write(json_path)
    return report


def _run_one(ctx: Context, scenario: Scenario, mw: Middleware | None) -> ScenarioResult:
    result = ScenarioResult(scenario.name, mw.name if mw else "-")
    if mw is not None:
        log(f"-- {scenario.name} on {mw.name}")
    started = time.perf_counter()
    try:
        scenario.run(ctx, mw, result)
    except Exception as exc:
        result.status = "error"
        result.reason = f"{type(exc).__name__}: {exc}"[:1000]
        result.details["traceback"] = traceback.format_exc()[-3000:]
        log(f"! {scenario.name}/{result.adapter} failed: {result.reason}")
    result.duration_s = time.perf_counter() - started
    return result
