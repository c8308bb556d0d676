"""The results table, as plain text for the terminal or Markdown for docs/performance.md.

``python -m bench.report [bench/results/latest.json]`` prints the Markdown table of a
stored run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bench.util import REPO

_HEAD = ("scenario", "adapter", "metric", "value", "baseline (same run)", "ratio", "target", "")


def _num(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    magnitude = abs(value)
    text = (
        f"{value:,.0f}"
        if magnitude >= 100
        else f"{value:.1f}"
        if magnitude >= 10
        else f"{value:.2f}"
    )
    return f"{text} {unit}".rstrip()


def rows(report: dict[str, Any]) -> list[tuple[str, ...]]:
    """Table rows of a JSON report (``RunReport.to_json``)."""
    out: list[tuple[str, ...]] = []
    for res in report["results"]:
        if res["status"] != "ok":
            out.append(
                (
                    res["scenario"],
                    res["adapter"],
                    res["status"].replace("_", " "),
                    (res.get("reason") or "")[:110],
                    "",
                    "",
                    "",
                    "",
                )
            )
            continue
        for m in res["metrics"]:
            target = m.get("target")
            verdict = {True: "PASS", False: "MISS", None: "n/a"}[m.get("passed")] if target else ""
            tdesc = f"{target['on']} {target['op']} {target['threshold']:g}" if target else ""
            base = _num(m.get("baseline"), m["unit"]) if m.get("baseline") is not None else ""
            ratio = f"{m['ratio']:.2f}" if m.get("ratio") is not None else ""
            value = _num(m.get("value"), m["unit"])
            if m.get("note"):
                value += f" ({m['note']})"
            out.append(
                (res["scenario"], res["adapter"], m["name"], value, base, ratio, tdesc, verdict)
            )
    return out


def text_table(report: dict[str, Any]) -> str:
    """A fixed-width table for the terminal."""
    table = [_HEAD, *rows(report)]
    widths = [min(60, max(len(r[i]) for r in table)) for i in range(len(_HEAD))]
    lines = []
    for n, row in enumerate(table):
        lines.append("  ".join(cell[:60].ljust(w) for cell, w in zip(row, widths, strict=True)))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    s = report.get("summary", {})
    lines.append(
        f"\ntargets: {s.get('passed', 0)} passed, {s.get('missed', 0)} missed, "
        f"{s.get('unmeasured', 0)} not measured"
    )
    return "\n".join(lines)


def markdown_table(report: dict[str, Any]) -> str:
    """A Markdown table (for docs/performance.md)."""

    def esc(cell: str) -> str:
        return cell.replace("|", "\\|")

    lines = ["| " + " | ".join(_HEAD[:-1]) + " | verdict |", "|" + "---|" * len(_HEAD)]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows(report)]
    return "\n".join(lines)


def main() -> None:
    """Print the Markdown table of a stored report."""
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "bench" / "results" / "latest.json"
    print(markdown_table(json.loads(path.read_text())))


if __name__ == "__main__":
    main()
