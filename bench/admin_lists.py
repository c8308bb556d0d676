"""Time of the admin API's subscription list (searched, sorted, paged on the server) with
many subscriptions, as a ratio to the same queries with few.

Builds an in-process gateway (``wsnmom.server.build_runtime``: embedded adapter and
SQLite store in a temporary directory, the Flask app driven by its test client, no
sockets), creates ``--small`` and then ``--large`` push subscriptions (consumers that are
never called: every subscription is paused, so nothing is delivered), and times each
query of :data:`QUERIES` ``--repeat`` times at both sizes.  Reports the median per query
and the ratio large / small, wall-clock and CPU time of the request (the thread's: the
machine's other load does not count).  Searching and sorting look at every subscription,
so the cost grows with their number; what must stay small is the cost per subscription
(``cpu_us_per_subscription``).  Docs: docs/performance.md, F27.

Usage::

    python -m bench.admin_lists [--small 1000] [--large 10000] [--repeat 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from wsnmom.core.config import Settings
from wsnmom.core.model import EndpointReference, ExpressionSource, SubscribeRequest
from wsnmom.topic_mapping.dialects import SIMPLE

from bench.util import print_figures
from wsnmom.server import Runtime, build_runtime

NS = "urn:wsnmom:bench:admin"
API = "/wsn/admin/api/subscriptions"

#: name -> query string of ``GET /wsn/admin/api/subscriptions``
QUERIES: dict[str, str] = {
    "first_page": "limit=100",
    "search_one": "q={needle}&limit=100",
    "search_many": "q=plc-009&limit=100",
    "sort_consumer_page_50": "sort=consumer&order=desc&offset=5000&limit=100",
    "sort_backlog": "sort=backlog&order=desc&limit=100",
    "count_only": "q=paused&limit=1",
}


def _subscribe(runtime: Runtime, start: int, stop: int) -> list[str]:
    service = runtime.service
    ids = []
    for n in range(start, stop):
        req = SubscribeRequest(
            EndpointReference(f"http://127.0.0.1:9/plc-{n:05d}"),
            topic=ExpressionSource(SIMPLE, f"t:line{n % 100}", {"t": NS}),
        )
        sub = service.subscribe(req)
        service.pause(sub.id)
        ids.append(sub.id)
    return ids


def _time(runtime: Runtime, query: str, repeat: int) -> tuple[float, float, dict[str, Any]]:
    """Median wall-clock and CPU seconds of ``repeat`` requests (the test client answers
    on this thread, so its CPU time is the request's, whatever else loads the machine)."""
    client = runtime.app.test_client()
    client.environ_base["REMOTE_ADDR"] = "127.0.0.1"
    walls, cpus, body = [], [], {}
    for _ in range(repeat):
        began, cpu = time.perf_counter(), time.thread_time()
        resp = client.get(f"{API}?{query}")
        cpus.append(time.thread_time() - cpu)
        walls.append(time.perf_counter() - began)
        assert resp.status_code == 200, resp.get_data(as_text=True)
        body = resp.json or {}
    return statistics.median(walls), statistics.median(cpus), body


def measure(small: int, large: int, repeat: int) -> dict[str, Any]:
    """The medians at both sizes and their ratios (see the module docstring)."""
    with tempfile.TemporaryDirectory(prefix="wsnmom-bench-admin-") as tmp:
        settings = Settings(
            adapter_url=f"embedded://{Path(tmp) / 'mw'}",
            store_url=f"sqlite:///{Path(tmp) / 'store.db'}",
        )
        runtime = build_runtime(settings)
        try:
            ids = _subscribe(runtime, 0, small)
            out: dict[str, Any] = {"small": small, "large": large, "repeat": repeat}
            results: dict[str, dict[str, Any]] = {}
            for size, upto in (("small", small), ("large", large)):
                began = time.perf_counter()
                ids += _subscribe(runtime, len(ids), upto)
                out[f"subscribe_{size}_s"] = round(time.perf_counter() - began, 2)
                for name, template in QUERIES.items():
                    needle = ids[len(ids) // 2][:12]
                    wall, cpu, body = _time(runtime, template.format(needle=needle), repeat)
                    entry = results.setdefault(name, {"query": template})
                    entry[f"{size}_ms"] = round(wall * 1000, 2)
                    entry[f"{size}_cpu_ms"] = round(cpu * 1000, 2)
                    entry[f"{size}_count"] = body.get("count")
            for entry in results.values():
                entry["ratio"] = round(entry["large_ms"] / max(entry["small_ms"], 1e-6), 2)
                entry["cpu_ratio"] = round(
                    entry["large_cpu_ms"] / max(entry["small_cpu_ms"], 1e-6), 2
                )
                entry["cpu_us_per_subscription"] = round(entry["large_cpu_ms"] * 1000 / large, 2)
            out["queries"] = results
        finally:
            runtime.close()
    out["load"] = os.getloadavg()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=1000)
    parser.add_argument("--large", type=int, default=10000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)
    print_figures(measure(args.small, args.large, args.repeat), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
