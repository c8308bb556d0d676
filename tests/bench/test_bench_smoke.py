"""Smoke test of the benchmark harness: ``python -m bench --smoke`` (``--quick`` with
shorter load runs still) on three cheap scenarios (embedded adapter) must run to the end
and write a well-formed JSON report.

It checks the harness, not the figures: targets are never asserted here.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.support.bench_runs import smoke_report


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench") / "report.json"
    data, printed = smoke_report(out, "ingress,isolation,matching", timeout=300)
    assert "targets:" in printed
    return data


@pytest.mark.timeout(180)
def test_report_structure(report: dict[str, Any]) -> None:
    assert report["schema"] == 1
    assert report["quick"] is True and report["smoke"] is True
    assert report["scenarios"] == ["ingress", "isolation", "matching"]
    assert {"cpu", "cores", "python", "commit"} <= set(report["machine"])
    assert [a["name"] for a in report["adapters"]] == ["embedded"]
    summary = report["summary"]
    assert summary["targets"] == summary["passed"] + summary["missed"] + summary["unmeasured"]
    for res in report["results"]:
        assert {"scenario", "adapter", "status", "metrics", "setup", "details"} <= set(res)
        assert res["status"] in ("ok", "not_available"), res.get("reason")
        if res["status"] != "ok":
            assert isinstance(res["reason"], str) and res["reason"]
        for metric in res["metrics"]:
            assert {"name", "value", "unit", "baseline", "ratio", "target", "passed"} <= set(metric)


@pytest.mark.timeout(180)
def test_ratios_against_same_run_baselines(report: dict[str, Any]) -> None:
    by_scenario = {r["scenario"]: r for r in report["results"]}
    assert set(by_scenario) == {"ingress", "isolation", "matching"}
    ingress = by_scenario["ingress"]
    if ingress["status"] == "ok":
        for batch in (1, 100):
            m = next(m for m in ingress["metrics"] if m["name"] == f"notify_{batch}msg_rps")
            assert m["baseline"] > 0 and m["value"] >= 0
            assert m["ratio"] == pytest.approx(m["value"] / m["baseline"])
            assert m["target"] == {"op": ">=", "threshold": 0.75, "on": "ratio"}
            assert m["passed"] is (m["ratio"] >= 0.75)
        # 100 messages: the target's baseline also serialises each payload; the ratio against
        # the parse-only baseline (the definition before) is reported too, without a target
        by_name = {m["name"]: m for m in ingress["metrics"]}
        new, old = by_name["notify_100msg_rps"], by_name["notify_100msg_rps_vs_parse_only"]
        assert "serialising" in new["baseline_name"] and "parse only" in old["baseline_name"]
        assert old["value"] == new["value"] and old["baseline"] > 0 and old["target"] is None
        assert old["ratio"] == pytest.approx(old["value"] / old["baseline"])
        assert len(ingress["details"]["baseline_serialising_100"]) == ingress["details"]["rounds"]
        assert "notify_1msg_rps_vs_parse_only" not in by_name
    isolation = by_scenario["isolation"]
    if isolation["status"] == "ok":
        # the healthy consumer's p99 with 100 hanging tarpit deliveries, against its p99
        # alone in the same run
        m = next(m for m in isolation["metrics"] if m["name"] == "healthy_p99_with_tarpits")
        assert m["target"] == {"op": "<=", "threshold": 2.0, "on": "ratio"}
        assert m["baseline"] > 0 and m["value"] > 0
        assert m["ratio"] == pytest.approx(m["value"] / m["baseline"])
        assert isolation["details"]["tarpit_connections"] >= isolation["details"]["tarpits"]
    matching = by_scenario["matching"]
    if matching["status"] == "ok":
        ratio = matching["metrics"][-1]
        assert ratio["target"]["op"] == "<=" and ratio["baseline"] > 0


@pytest.mark.timeout(180)
def test_process_under_test_and_load_side_on_separate_cpus(report: dict[str, Any]) -> None:
    plan = report["machine"]["cpu_plan"]
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2 or shutil.which("taskset") is None:
        assert plan is None
        return
    assert plan == {
        "server": allowed[:1],
        "clients": allowed[1:],
        "middleware": allowed[1:],
        "raw_baselines": allowed[:1],
    }


def test_no_pin_chooses_no_plan() -> None:
    from bench import cpus

    try:
        assert cpus.choose(False) is None
        assert cpus.server_prefix() == []
        plan = cpus.choose(True)
        if plan is not None:
            assert set(plan.server).isdisjoint(plan.clients)
            assert cpus.server_prefix() == ["taskset", "-c", ",".join(map(str, plan.server))]
    finally:
        cpus.choose(False)


def test_each_gateway_process_has_a_data_directory_of_its_own(tmp_path: Path) -> None:
    """The gateway's data directory overrides an adapter URL's ``data_dir``: without its
    own ``--data-dir`` every MQTT gateway of a run (and of other runs on the machine)
    shared one session and one set of queues."""
    from bench.server import ServerProcess

    dirs = []
    for name in ("a", "b"):
        command = ServerProcess("embedded://", tmp_path / name).command()
        dirs.append(Path(command[command.index("--data-dir") + 1]))
    assert dirs[0] != dirs[1]
    assert all(d.is_relative_to(tmp_path) for d in dirs)
