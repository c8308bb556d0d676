"""The A/B tool of the benchmarks (bench/ab.py, bench/ab_launch.py): a gateway run from an
exported commit really runs that tree's code, and a short comparison measures both sides."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import ab, cpus

REPO = Path(__file__).resolve().parents[2]


def test_exported_tree_is_what_the_launcher_imports(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    short = ab.export_commit("HEAD", tree)
    assert short and (tree / "pyproject.toml").is_file() and (tree / "core").is_dir()
    marker = tree / "core" / "ab_marker.py"
    marker.write_text("WHERE = 'exported tree'\n")
    probe = (
        "import pathlib, runpy; "
        f"runpy.run_path({str(ab.LAUNCHER)!r})['install'](pathlib.Path({str(tree)!r})); "
        "import wsnmom.core.ab_marker as m, wsnmom.adapters.embedded as e; "
        "print(m.WHERE); print(e.__file__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out[0] == "exported tree"
    assert out[1].startswith(str(tree))


@pytest.mark.timeout(180)
def test_short_comparison_measures_both_sides() -> None:
    lines: list[str] = []
    affinity = os.sched_getaffinity(0)
    # the harness, not the figures: short rounds and warm-ups
    sides = ab.compare(
        "HEAD", "embedded", "notify", rounds=2, seconds=0.5, log=lines.append, warmup=0.2
    )
    # the pinning of the comparison does not outlive it (later tests need every CPU)
    assert os.sched_getaffinity(0) == affinity and cpus.current() is None
    assert [s.label.split()[0] for s in sides] == ["base", "working"]
    for side in sides:
        assert len(side.rounds) == 2
        us, rps = side.medians()
        assert 0 < us < 100_000 and rps > 0
    # rounds alternate: A B, then B A
    assert [line.split()[2] for line in lines] == ["base", "working", "working", "base"]


@pytest.mark.timeout(180)
def test_latency_load_reports_percentiles_of_both_sides() -> None:
    lines: list[str] = []
    sides = ab.compare(
        "HEAD",
        "embedded",
        "latency",
        rounds=1,
        seconds=0.5,
        log=lines.append,
        rate=50.0,
        warmup=0.2,
    )
    for side in sides:
        assert len(side.rounds) == len(side.latencies) == 1
        medians = side.latency_medians()
        assert medians is not None
        p50, p99 = medians
        # intended send time to arrival: positive, p99 not below p50
        assert 0 < p50 <= p99 < 10_000
        assert side.rounds[0][1] > 0
    assert all("p99" in line for line in lines)


@pytest.mark.timeout(180)
def test_get_load_reads_every_message_and_reports_percentiles() -> None:
    lines: list[str] = []
    # 10-message GetMessages: each round reads its fill exactly (get_round raises if not)
    sides = ab.compare(
        "HEAD", "embedded", "get-10", rounds=1, seconds=0.5, log=lines.append, answers=8
    )
    for side in sides:
        assert side.pull_point.startswith("http://127.0.0.1:")
        assert len(side.rounds) == len(side.latencies) == 1
        us, per_s = side.rounds[0]
        assert us > 0 and per_s > 0
        p50, p99 = side.latencies[0]
        assert 0 < p50 <= p99
    assert all("p99" in line for line in lines)
