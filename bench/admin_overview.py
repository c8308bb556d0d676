"""CPU of the admin overview (``GET /wsn/admin/api/overview``, which the admin page polls
every few seconds while it is open) with many subscriptions, as ratios in the same run.

For each of ``--sizes`` it writes that many subscriptions into a new SQLite store (one in
a thousand paused, consumers that are never called: nothing is published), starts an
in-process gateway on it (``wsnmom.server.build_runtime``: the embedded adapter restores
them as after a restart, the Flask app is driven by its test client, no sockets), then
times ``--repeat`` overview requests and as many requests of the subscription list's
first page (``?limit=100``, the light rows of F28).  Reports the medians, wall-clock and
the CPU time of the request's thread (the machine's other load does not count), and:

- ``overview_to_first_page``: overview CPU / first-page CPU at the same size.  Both look
  at every subscription; the overview also reads each one's backlog and delivery state
  for its totals.  Target: at most :data:`TARGET_TO_FIRST_PAGE` at the largest size.
- ``cpu_us_per_subscription`` of the overview at each size, and ``growth``: its CPU at
  each size over its CPU at the smallest.

Docs: docs/performance.md, docs/performance/findings.md F31.

Usage::

    python -m bench.admin_overview [--sizes 100,10000] [--repeat 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from wsnmom.core.config import Settings
from wsnmom.core.model import (
    EndpointReference,
    ExpressionSource,
    Subscription,
    SubscriptionState,
    new_resource_id,
)
from wsnmom.core.store_sqlite import SqliteStore
from wsnmom.topic_mapping.dialects import SIMPLE

from bench.util import print_figures
from wsnmom.server import build_runtime

NS = "urn:wsnmom:bench:overview"
ADMIN = "/wsn/admin/api"
#: the overview's CPU at most this many times the list's first page at the largest size
#: (with every full status built it was 7.5 at 10,000 and 10.6 at 100,000; F31)
TARGET_TO_FIRST_PAGE = 3.5


def _seed(path: Path, count: int) -> None:
    """``count`` subscriptions in a new SQLite store at ``path``, a millisecond apart."""
    start = datetime.now(UTC) - timedelta(hours=1)
    store = SqliteStore(str(path))
    try:
        for n in range(count):
            store.put_subscription(
                Subscription(
                    id=new_resource_id(),
                    consumer=EndpointReference(f"http://127.0.0.1:9/plc-{n:06d}"),
                    creation_time=start + timedelta(milliseconds=n),
                    termination_time=start + timedelta(days=1),
                    topic=ExpressionSource(SIMPLE, f"t:line{n % 100}", {"t": NS}),
                    state=(
                        SubscriptionState.PAUSED if n % 1000 == 999 else SubscriptionState.ACTIVE
                    ),
                )
            )
    finally:
        store.close()


def _time(client: Any, path: str, repeat: int) -> tuple[float, float, dict[str, Any]]:
    """Median wall-clock and thread-CPU seconds of ``repeat`` GETs of ``path``."""
    walls, cpus, body = [], [], {}
    for _ in range(repeat):
        began, cpu = time.perf_counter(), time.thread_time()
        resp = client.get(path)
        cpus.append(time.thread_time() - cpu)
        walls.append(time.perf_counter() - began)
        assert resp.status_code == 200, resp.get_data(as_text=True)
        body = resp.json or {}
    return statistics.median(walls), statistics.median(cpus), body


def _one_size(count: int, repeat: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="wsnmom-bench-overview-") as tmp:
        began = time.perf_counter()
        _seed(Path(tmp) / "store.db", count)
        seeded = time.perf_counter() - began
        runtime = build_runtime(
            Settings(
                adapter_url=f"embedded://{Path(tmp) / 'mw'}",
                store_url=f"sqlite:///{Path(tmp) / 'store.db'}",
            )
        )
        try:
            started = time.perf_counter() - began - seeded
            client = runtime.app.test_client()
            client.environ_base["REMOTE_ADDR"] = "127.0.0.1"
            wall, cpu, body = _time(client, f"{ADMIN}/overview", repeat)
            assert body["totals"]["subscriptions"] == count, body["totals"]
            page_wall, page_cpu, page = _time(client, f"{ADMIN}/subscriptions?limit=100", repeat)
            assert page["count"] == count, page["count"]
        finally:
            runtime.close()
    return {
        "seed_s": round(seeded, 2),
        "start_s": round(started, 2),
        "overview_ms": round(wall * 1000, 2),
        "overview_cpu_ms": round(cpu * 1000, 2),
        "first_page_ms": round(page_wall * 1000, 2),
        "first_page_cpu_ms": round(page_cpu * 1000, 2),
        "overview_to_first_page": round(cpu / max(page_cpu, 1e-6), 2),
        "cpu_us_per_subscription": round(cpu * 1e6 / count, 2),
        "load_after": os.getloadavg()[0],
    }


def measure(sizes: list[int], repeat: int) -> dict[str, Any]:
    """The figures at each size (see the module docstring)."""
    out: dict[str, Any] = {"repeat": repeat, "load": os.getloadavg()}
    results = {str(n): _one_size(n, repeat) for n in sorted(sizes)}
    smallest = results[str(min(sizes))]["overview_cpu_ms"]
    for entry in results.values():
        entry["growth"] = round(entry["overview_cpu_ms"] / max(smallest, 1e-6), 1)
    out["sizes"] = results
    largest = results[str(max(sizes))]["overview_to_first_page"]
    out["target_to_first_page"] = TARGET_TO_FIRST_PAGE
    out["met"] = largest <= TARGET_TO_FIRST_PAGE
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,10000", help="comma-separated counts")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    print_figures(measure(sizes, args.repeat), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
