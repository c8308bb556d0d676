"""Result records of a benchmark run: metrics, targets, scenario results, the run report.

A metric that depends on machine speed carries the baseline measured in the same run and the
ratio ``value / baseline``; its target (when it has one) is checked against that ratio.
Machine-independent metrics (RSS, a latency bound, a time budget) are checked on the value.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

Status = Literal["ok", "not_available", "error", "skipped"]

#: version of the JSON layout of ``bench/results/latest.json``
SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class Target:
    """A goal for one metric: ``<on> <op> <threshold>`` (e.g. ratio >= 0.75)."""

    op: Literal[">=", "<="]
    threshold: float
    #: "ratio" checks value/baseline (or a derived ratio), "value" checks the raw value
    on: Literal["ratio", "value"] = "ratio"

    def describe(self) -> str:
        """Human-readable form, e.g. ``ratio >= 0.75``."""
        return f"{self.on} {self.op} {self.threshold:g}"

    def met(self, value: float | None) -> bool | None:
        """True/False when ``value`` meets the target; None when nothing was measured."""
        if value is None:
            return None
        return value >= self.threshold if self.op == ">=" else value <= self.threshold


@dataclass(slots=True)
class Metric:
    """One reported figure, optionally with its same-run baseline and a target."""

    name: str
    value: float | None
    unit: str
    baseline: float | None = None
    baseline_name: str | None = None
    #: value/baseline, or a derived ratio set explicitly (e.g. cost at 10k / cost at 100)
    ratio: float | None = None
    target: Target | None = None
    passed: bool | None = None
    note: str | None = None

    def finalize(self) -> None:
        """Compute the ratio (when a baseline is known) and the target verdict."""
        if (
            self.ratio is None
            and self.value is not None
            and self.baseline not in (None, 0)
            and self.baseline is not None
        ):
            self.ratio = self.value / self.baseline
        if self.target is not None:
            checked = self.ratio if self.target.on == "ratio" else self.value
            self.passed = self.target.met(checked)


@dataclass(slots=True)
class ScenarioResult:
    """What one scenario measured on one adapter."""

    scenario: str
    adapter: str
    status: Status = "ok"
    reason: str | None = None
    metrics: list[Metric] = field(default_factory=list)
    #: seconds spent preparing (creating subscriptions ...), kept apart from the figures
    setup: dict[str, float] = field(default_factory=dict)
    #: parameters and raw series (for plots and for reading the JSON later)
    details: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0

    def add(self, metric: Metric) -> Metric:
        """Append ``metric`` (finalized) and return it."""
        metric.finalize()
        self.metrics.append(metric)
        return metric

    def metric(self, name: str) -> Metric | None:
        """The metric called ``name``, if measured."""
        return next((m for m in self.metrics if m.name == name), None)


@dataclass(slots=True)
class AdapterInfo:
    """Whether a middleware could be benchmarked in this run, and why not."""

    name: str
    available: bool
    reason: str | None = None
    url: str | None = None


def _git_commit(repo: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def machine_info(repo: Path) -> dict[str, Any]:
    """CPU, memory, OS and interpreter of this machine, and the commit benchmarked."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib: float | None = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
                break
    except OSError:
        pass
    return {
        "hostname": platform.node(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": mem_gib,
        "os": platform.platform(),
        "python": platform.python_version(),
        "commit": _git_commit(repo),
    }


@dataclass(slots=True)
class RunReport:
    """The whole run: machine, adapters, scenario results, target summary."""

    started_at: str
    quick: bool
    machine: dict[str, Any]
    adapters: list[AdapterInfo] = field(default_factory=list)
    results: list[ScenarioResult] = field(default_factory=list)
    finished_at: str | None = None
    scenarios: list[str] = field(default_factory=list)
    #: ``--smoke``: the harness ran through, the figures mean nothing
    smoke: bool = False

    def targets(self) -> list[tuple[ScenarioResult, Metric]]:
        """Every (result, metric) pair that has a target."""
        return [(r, m) for r in self.results for m in r.metrics if m.target is not None]

    def missed(self) -> list[tuple[ScenarioResult, Metric]]:
        """Targets measured and missed (unmeasured ones are not counted as missed)."""
        return [(r, m) for r, m in self.targets() if m.passed is False]

    def to_json(self) -> dict[str, Any]:
        """The JSON document written to ``bench/results/latest.json``."""
        pairs = self.targets()
        return {
            "schema": SCHEMA_VERSION,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "quick": self.quick,
            "smoke": self.smoke,
            "scenarios": self.scenarios,
            "machine": self.machine,
            "adapters": [asdict(a) for a in self.adapters],
            "results": [asdict(r) for r in self.results],
            "summary": {
                "targets": len(pairs),
                "passed": sum(1 for _, m in pairs if m.passed is True),
                "missed": sum(1 for _, m in pairs if m.passed is False),
                "unmeasured": sum(1 for _, m in pairs if m.passed is None),
                "missed_list": [
                    f"{r.scenario}/{r.adapter}/{m.name}" for r, m in pairs if m.passed is False
                ],
            },
        }

    def write(self, path: Path) -> None:
        """Write the JSON report atomically."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2, default=str) + "\n")
        tmp.replace(path)


def now_iso() -> str:
    """The current UTC time, ISO 8601 with seconds."""
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
