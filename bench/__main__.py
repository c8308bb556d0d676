"""``python -m bench``: run the benchmarks, print the table, write the JSON report.

Exit status is 0 whatever was measured (benchmarks never fail CI), unless ``--check`` is
given: then it is 1 when a measured figure misses its target.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.report import text_table
from bench.runner import log, run
from bench.scenarios import SCENARIOS
from bench.util import REPO

DEFAULT_JSON = REPO / "bench" / "results" / "latest.json"
DEFAULT_PLOTS = REPO / "docs" / "performance"


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    names = ", ".join(cls.name for cls in SCENARIOS)
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small counts: a smoke run")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="smaller than --quick (implies it): each scenario only runs through; "
        "the figures mean nothing (the harness's test)",
    )
    parser.add_argument("--scenarios", type=_csv, help=f"comma-separated subset of: {names}")
    parser.add_argument(
        "--adapters", type=_csv, help="comma-separated subset of: embedded, rabbitmq, kafka, mqtt"
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="report path")
    parser.add_argument(
        "--plots",
        type=Path,
        default=None,
        help=f"write one PNG per scenario here (default for full runs: {DEFAULT_PLOTS})",
    )
    parser.add_argument("--no-plots", action="store_true", help="write no plots")
    parser.add_argument(
        "--no-pin",
        action="store_true",
        help="do not pin the process under test and the load side to separate CPUs",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary work directory")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run and return the exit status."""
    args = parse_args(argv)
    args.quick = args.quick or args.smoke
    try:
        report = run(
            args.scenarios,
            args.adapters,
            args.quick,
            args.json,
            args.keep,
            pin=not args.no_pin,
            smoke=args.smoke,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    data = report.to_json()
    print(text_table(data))
    print(f"\nreport: {args.json}")
    plots_dir = args.plots or (None if args.quick else DEFAULT_PLOTS)
    if plots_dir is not None and not args.no_plots:
        try:
            from bench.plots import write_plots

            for path in write_plots(json.loads(args.json.read_text()), plots_dir):
                log(f"plot: {path}")
        except ImportError as exc:
            log(f"no plots: {exc} (pip install -e '.[bench]')")
    if args.check:
        missed = report.missed()
        for res, metric in missed:
            print(
                f"MISSED {res.scenario}/{res.adapter}/{metric.name}: "
                f"{metric.target.describe() if metric.target else ''} "
                f"(ratio {metric.ratio}, value {metric.value})",
                file=sys.stderr,
            )
        return 1 if missed else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
