"""Scenario 4, matching: topic matching cost per message against subscription count, by
running ``bench/topic_matching.py`` (owned separately) with ``--json`` and reading it back.

Baseline: the cost at the smallest size (1k) in the same run.  Target: cost at 100k <= 5x.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.middleware import Middleware
from bench.model import Metric, ScenarioResult, Target
from bench.scenarios.base import Context, Scenario
from bench.util import REPO

SCRIPT = REPO / "bench" / "topic_matching.py"


class Matching(Scenario):
    """Matching cost at 1k .. 100k subscriptions (TopicIndex)."""

    name = "matching"
    title = "Matching: topic matching cost vs subscriptions"
    middlewares = ()
    needs_server = False

    def run(self, ctx: Context, mw: Middleware | None, result: ScenarioResult) -> None:
        if not SCRIPT.exists():
            result.status = "not_available"
            result.reason = "bench/topic_matching.py does not exist yet"
            return
        sizes = "1000,10000" if ctx.quick else "1000,10000,100000"
        messages = "500" if ctx.quick else "5000"
        if ctx.smoke:
            sizes, messages = "1000,2000", "100"
        with tempfile.TemporaryDirectory(prefix="wsnmom-match-") as tmp:
            out_path = Path(tmp) / "matching.json"
            proc = subprocess.run(
                [
                    sys.executable,
                    str(SCRIPT),
                    "--sizes",
                    sizes,
                    "--messages",
                    messages,
                    "--json",
                    str(out_path),
                ],
                capture_output=True,
                text=True,
                cwd=REPO,
                timeout=900,
                check=False,
            )
            if proc.returncode != 0 or not out_path.exists():
                raise RuntimeError(
                    f"topic_matching.py failed ({proc.returncode}): {proc.stderr[-600:]}"
                )
            data = json.loads(out_path.read_text())
        rows = sorted(data["rows"], key=lambda r: r["subscriptions"])
        result.details["rows"] = rows
        for row in rows:
            result.add(
                Metric(
                    name=f"match_us_{row['subscriptions']}",
                    value=row["match_us"],
                    unit="us/msg",
                    note=f"{row.get('mean_matches', 0):.1f} matches/msg",
                )
            )
            ctx.log(f"  {row['subscriptions']:>7} subscriptions: {row['match_us']:.1f} us/msg")
        small, large = rows[0], rows[-1]
        result.add(
            Metric(
                name=f"match_cost_{large['subscriptions']}_vs_{small['subscriptions']}",
                value=large["match_us"],
                unit="us/msg",
                baseline=small["match_us"],
                baseline_name=f"cost at {small['subscriptions']}",
                target=Target("<=", 5.0),
            )
        )
