"""The benchmark harness run as a user runs it, for the tests of its reports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def smoke_report(out: Path, scenarios: str, timeout: float) -> tuple[dict[str, Any], str]:
    """``python -m bench --smoke`` (the harness and the report, not the figures) on the
    embedded adapter for ``scenarios`` (comma-separated), without plots, its JSON report
    written to ``out``: the report and what the run printed.  Asserts that it exited 0."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--smoke",
            "--scenarios",
            scenarios,
            "--adapters",
            "embedded",
            "--no-plots",
            "--json",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    data: dict[str, Any] = json.loads(out.read_text())
    return data, proc.stdout
