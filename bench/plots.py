"""One PNG per scenario from a JSON report (matplotlib, headless).

``python -m bench.plots [REPORT.json] [OUT_DIR]`` redraws them from a stored report
(defaults: bench/results/latest.json, docs/performance/).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from bench.util import REPO

Result = dict[str, Any]


def _ok(report: dict[str, Any], scenario: str) -> list[Result]:
    return [r for r in report["results"] if r["scenario"] == scenario and r["status"] == "ok"]


def _metric(res: Result, name: str) -> dict[str, Any] | None:
    return next((m for m in res["metrics"] if m["name"] == name), None)


def _title(fig: Figure, text: str, report: dict[str, Any]) -> None:
    m = report["machine"]
    fig.suptitle(text, fontsize=12, fontweight="bold")
    fig.text(
        0.99,
        0.005,
        f"{m.get('cpu', '?')}, {m.get('cores')} cores; commit {m.get('commit')}; "
        f"{report['started_at']}{' (quick)' if report.get('quick') else ''}",
        ha="right",
        va="bottom",
        fontsize=7,
        color="gray",
    )


def _ingress(report: dict[str, Any], out: Path) -> Path | None:
    results = _ok(report, "ingress")
    if not results:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
    for ax, batch in zip(axes, (1, 100), strict=True):
        labels, base, got, ratios = [], [], [], []
        for res in results:
            m = _metric(res, f"notify_{batch}msg_rps")
            if m is None:
                continue
            labels.append(res["adapter"])
            base.append(m["baseline"] or 0)
            got.append(m["value"] or 0)
            ratios.append(m["ratio"])
        xs = range(len(labels))
        base_label = "baseline: Flask+lxml" + (", serialising payloads" if batch > 1 else "")
        ax.bar([x - 0.2 for x in xs], base, 0.4, label=base_label, color="#bbbbbb")
        bars = ax.bar([x + 0.2 for x in xs], got, 0.4, label="wsnmom", color="#1f77b4")
        for bar, ratio in zip(bars, ratios, strict=True):
            if ratio is not None:
                ax.annotate(
                    f"{ratio:.2f}x",
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center",
                    va="bottom",
                    fontsize=9,
                )
        ax.set_xticks(list(xs), labels)
        ax.set_ylabel("Notify requests/s")
        ax.set_title(f"{batch} message(s) per Notify (target >= 0.75x)")
        ax.legend(fontsize=8)
    _title(fig, "Ingress: SOAP Notify requests/s vs bare Flask baseline", report)
    return _save(fig, out / "ingress.png")


def _delivery(report: dict[str, Any], out: Path) -> Path | None:
    results = _ok(report, "delivery")
    if not results:
        return None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4.5))
    labels = [r["adapter"] for r in results]
    relay = [(_metric(r, "push_throughput") or {}).get("baseline") or 0 for r in results]
    got = [(_metric(r, "push_throughput") or {}).get("value") or 0 for r in results]
    xs = range(len(labels))
    ax1.bar([x - 0.2 for x in xs], relay, 0.4, label="minimal relay, same CPU", color="#bbbbbb")
    bars = ax1.bar([x + 0.2 for x in xs], got, 0.4, label="wsnmom end to end", color="#1f77b4")
    for bar, res in zip(bars, results, strict=True):
        ratio = (_metric(res, "push_throughput") or {}).get("ratio")
        if ratio is not None:
            ax1.annotate(
                f"{ratio:.2f}x",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=9,
            )
    ax1.set_xticks(list(xs), labels)
    ax1.set_ylabel("notifications/s")
    ax1.set_title("Throughput, 1 subscription (target >= 0.5x)")
    ax1.legend(fontsize=8)
    for res in results:
        lat = sorted(res["details"].get("latencies_ms") or [])
        if lat:
            ys = [(i + 1) / len(lat) for i in range(len(lat))]
            rate = res["details"].get("offered_rate", 0)
            ax2.plot(lat, ys, label=f"{res['adapter']} @ {rate:,.0f}/s")
    ax2.axvline(50, color="red", linestyle="--", linewidth=1, label="p99 target 50 ms")
    ax2.axhline(0.99, color="gray", linestyle=":", linewidth=1)
    ax2.set_xscale("log")
    ax2.set_xlabel("end-to-end latency (ms, log)")
    ax2.set_ylabel("fraction delivered")
    ax2.set_title("Latency CDF at 50 % of max load")
    ax2.legend(fontsize=8)
    _title(fig, "Delivery: Notify in -> middleware -> Notify out", report)
    return _save(fig, out / "delivery.png")


def _fanout(report: dict[str, Any], out: Path) -> Path | None:
    results = _ok(report, "fanout")
    if not results:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for res in results:
        for mode, style in (("push", "-o"), ("pull", "--s"), ("raw", ":^")):
            costs = res["details"].get(f"{mode}_cost_us") or {}
            pts = sorted((int(k), v) for k, v in costs.items() if v is not None)
            if pts:
                ax.plot(
                    [p[0] for p in pts],
                    [p[1] for p in pts],
                    style,
                    label=f"{res['adapter']} {mode}"
                    + (" (raw client, no gateway)" if mode == "raw" else ""),
                )
                if mode == "raw":
                    continue
                largest = (res["details"].get("sizes") or [pts[-1][0]])[-1]
                ax.plot([largest], [pts[0][1] * 1.5], "x", color="red")
                if pts[-1][0] < largest:
                    ax.annotate(
                        f"{res['adapter']} {mode}: failed at {largest:,}",
                        (pts[-1][0], pts[-1][1]),
                        fontsize=7,
                        color="red",
                        xytext=(5, -12),
                        textcoords="offset points",
                    )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("subscriptions on the topic")
    ax.set_ylabel("time until all delivered / N (us per delivery)")
    ax.set_title("x = target: 1.5 x cost at the smallest size")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    _title(fig, "Fan-out: one Notify to N subscriptions", report)
    return _save(fig, out / "fanout.png")


def _matching(report: dict[str, Any], out: Path) -> Path | None:
    results = _ok(report, "matching")
    if not results:
        return None
    rows = results[0]["details"].get("rows") or []
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    xs = [r["subscriptions"] for r in rows]
    ax.plot(xs, [r["match_us"] for r in rows], "-o", label="mean")
    if all("match_us_p95" in r for r in rows):
        ax.plot(xs, [r["match_us_p95"] for r in rows], "--", label="p95")
    ax.axhline(
        rows[0]["match_us"] * 5,
        color="red",
        linestyle="--",
        linewidth=1,
        label="target: 5 x cost at 1k",
    )
    ax.set_xscale("log")
    ax.set_xlabel("subscriptions in the index")
    ax.set_ylabel("us per published message")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    _title(fig, "Matching: TopicIndex.match cost vs subscriptions", report)
    return _save(fig, out / "matching.png")


def _memory(report: dict[str, Any], out: Path) -> Path | None:
    results = _ok(report, "memory")
    if not results:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for res in results:
        samples = res["details"].get("samples") or []
        ax.plot([s[0] for s in samples], [s[1] for s in samples], "-o", label=res["adapter"])
        extra = next((m for m in res["metrics"] if "extrapolated" in (m.get("note") or "")), None)
        if extra is not None and samples:
            target_n = int(extra["name"].split("_")[1].rstrip("k")) * 1000
            ax.plot([samples[-1][0], target_n], [samples[-1][1], extra["value"]], ":", color="gray")
            ax.plot(
                [target_n],
                [extra["value"]],
                "o",
                mfc="none",
                color="gray",
                label=f"extrapolated: {extra['value']:.0f} MB at {target_n:,}",
            )
    ax.axhline(500, color="red", linestyle="--", linewidth=1, label="target 500 MB")
    ax.set_xlabel("active subscriptions (pull point consumers)")
    ax.set_ylabel("server RSS (MB)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    _title(fig, "Memory: gateway RSS vs subscriptions", report)
    return _save(fig, out / "memory.png")


def _recovery(report: dict[str, Any], out: Path) -> Path | None:
    results = _ok(report, "recovery")
    if not results:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    names = ("ready_s", "resumed_all_s", "drained_all_s")
    width = 0.8 / len(results)
    for n, res in enumerate(results):
        vals = [
            (_metric(res, k) or _metric(res, "drained_partial_s") or {}).get("value") or 0
            if k == "drained_all_s"
            else (_metric(res, k) or {}).get("value") or 0
            for k in names
        ]
        xs = [i + n * width for i in range(len(names))]
        bars = ax.bar(xs, vals, width, label=res["adapter"])
        for bar, v in zip(bars, vals, strict=True):
            ax.annotate(
                f"{v:.1f}s",
                (bar.get_x() + bar.get_width() / 2, v),
                ha="center",
                va="bottom",
                fontsize=9,
            )
    ax.axhline(10, color="red", linestyle="--", linewidth=1, label="target: resumed <= 10 s")
    ax.set_xticks(
        [i + width * (len(results) - 1) / 2 for i in range(len(names))],
        ["/readyz answers", "every subscription\nresumed", "all accumulated\ndrained"],
    )
    d = results[0]["details"]
    ax.set_ylabel(
        f"seconds after restart ({d.get('subscriptions')} subs, "
        f"{d.get('accumulated')} notifications)"
    )
    ax.legend(fontsize=8)
    _title(fig, "Recovery: restart with accumulated notifications", report)
    return _save(fig, out / "recovery.png")


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout(rect=(0, 0.03, 1, 0.95))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(report: dict[str, Any], out: Path) -> list[Path]:
    """Draw every scenario that has results; the paths written."""
    written = []
    for draw in (_ingress, _delivery, _fanout, _matching, _memory, _recovery):
        path = draw(report, out)
        if path is not None:
            written.append(path)
    return written


def main() -> None:
    """Redraw the plots of a stored report."""
    src = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "bench" / "results" / "latest.json"
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else REPO / "docs" / "performance"
    for path in write_plots(json.loads(src.read_text()), out):
        print(path)


if __name__ == "__main__":
    main()
