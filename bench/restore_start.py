"""Cost of a gateway start that restores many subscriptions on the embedded adapter, as
ratios to baselines measured in the same run.

Writes ``--count`` push subscriptions into a new SQLite store (``SqliteStore.put_subscription``,
one in a thousand paused, as tests/soap_frontend/test_admin_lists_10k.py does), then times
``wsnmom.server.build_runtime`` until it returns (the gateway is ready):

- ``empty``: the same start on an empty store (the baseline of the start itself);
- ``first``: the first start on the store, which also makes every durable subscription
  on the new embedded middleware (an INSERT each);
- ``restart``: the start after it, on the same store and middleware (a restart: every
  durable subscription exists);
- ``subscribe``: ``--subscribes`` Subscribes on the restarted gateway, the cost of making
  one subscription, to compare a restored one with.

Each start is repeated ``--repeat`` times (a fresh store for ``first``); the medians are
reported, wall-clock and CPU time of the process (all threads: the embedded dispatcher's
work counts).  The ratios: ``restart_per_sub_vs_subscribe`` (a restored subscription's
CPU against one Subscribe's: restoring must stay well below making) and
``restart_vs_empty`` (the whole start against the empty one).  ``--profile`` prints the
restart's profile (main thread).  Docs: docs/performance/findings.md, F29.

Usage::

    python -m bench.restore_start [--count 10000] [--repeat 3] [--subscribes 500]
        [--profile] [--json PATH]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from wsnmom.core.config import Settings
from wsnmom.core.model import (
    EndpointReference,
    ExpressionSource,
    SubscribeRequest,
    Subscription,
    SubscriptionState,
    new_resource_id,
)
from wsnmom.core.store_sqlite import SqliteStore
from wsnmom.topic_mapping.dialects import SIMPLE

from bench.util import print_figures
from wsnmom.server import Runtime, build_runtime

NS = "urn:wsnmom:bench:restore"


def _seed(store_db: Path, count: int) -> None:
    """``count`` subscriptions written into a new SQLite store (one a thousand paused)."""
    start = datetime.now(UTC) - timedelta(hours=1)
    store = SqliteStore(str(store_db))
    try:
        for n in range(count):
            store.put_subscription(
                Subscription(
                    id=new_resource_id(),
                    consumer=EndpointReference(f"http://127.0.0.1:9/plc-{n:06d}"),
                    creation_time=start,
                    termination_time=start + timedelta(days=1),
                    topic=ExpressionSource(SIMPLE, f"t:line{n % 100}", {"t": NS}),
                    state=SubscriptionState.PAUSED if n % 1000 == 999 else SubscriptionState.ACTIVE,
                )
            )
    finally:
        store.close()


def _settings(tmp: Path) -> Settings:
    return Settings(
        adapter_url=f"embedded://{tmp / 'mw'}", store_url=f"sqlite:///{tmp / 'store.db'}"
    )


def _start(
    tmp: Path, then: Callable[[Runtime], None] | None = None, profile: bool = False
) -> tuple[float, float]:
    """Wall-clock and process CPU seconds of one start on ``tmp`` (``then`` runs on the
    started gateway before it is closed, untimed)."""
    # thread CPU, not wall-clock: on a loaded machine wall time lands on whatever ran
    prof = cProfile.Profile(time.thread_time) if profile else None
    wall, cpu = time.perf_counter(), time.process_time()
    if prof is not None:
        prof.enable()
    runtime = build_runtime(_settings(tmp))
    if prof is not None:
        prof.disable()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    try:
        if then is not None:
            then(runtime)
    finally:
        runtime.close()
    if prof is not None:
        pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(30)
    return wall, cpu


def _subscribe_cost(runtime: Runtime, n: int, into: list[tuple[float, float]]) -> None:
    """Per-Subscribe wall-clock and process CPU seconds of ``n`` Subscribes."""
    service = runtime.service
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(n):
        service.subscribe(
            SubscribeRequest(
                EndpointReference(f"http://127.0.0.1:9/new-{i:06d}"),
                topic=ExpressionSource(SIMPLE, f"t:line{i % 100}", {"t": NS}),
            )
        )
    into.append(((time.perf_counter() - wall) / n, (time.process_time() - cpu) / n))


def _median(pairs: list[tuple[float, float]]) -> tuple[float, float]:
    return statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)


def measure(count: int, repeat: int, subscribes: int, profile: bool) -> dict[str, Any]:
    """The medians of each start and the ratios (see the module docstring)."""
    empty, first, restart, made = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="wsnmom-bench-restore-") as top:
        for r in range(repeat):
            tmp = Path(top) / f"run{r}"
            tmp.mkdir()
            empty.append(_start(tmp))
            _seed(tmp / "store.db", count)
            # a new middleware directory: the first start makes the durable subscriptions
            (tmp / "mw").rename(tmp / "mw-empty")
            first.append(_start(tmp))
            last = r == repeat - 1
            restart.append(
                _start(
                    tmp,
                    (lambda rt: _subscribe_cost(rt, subscribes, made)) if last else None,
                    profile=profile and last,
                )
            )
    (ew, ec), (fw, fc), (rw, rc), (sw, sc) = map(_median, (empty, first, restart, made))
    per_sub_cpu = max(rc - ec, 0.0) / count
    return {
        "count": count,
        "repeat": repeat,
        "empty_s": round(ew, 3),
        "empty_cpu_s": round(ec, 3),
        "first_s": round(fw, 2),
        "first_cpu_s": round(fc, 2),
        "restart_s": round(rw, 2),
        "restart_cpu_s": round(rc, 2),
        "restart_cpu_us_per_subscription": round(per_sub_cpu * 1e6, 1),
        "first_cpu_us_per_subscription": round(max(fc - ec, 0.0) / count * 1e6, 1),
        "subscribe_cpu_us": round(sc * 1e6, 1),
        "subscribe_us": round(sw * 1e6, 1),
        "restart_per_sub_vs_subscribe": round(per_sub_cpu / max(sc, 1e-9), 3),
        "restart_vs_empty": round(rc / max(ec, 1e-9), 1),
        "load": os.getloadavg(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--subscribes", type=int, default=500)
    parser.add_argument("--profile", action="store_true", help="profile the last restart")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)
    print_figures(measure(args.count, args.repeat, args.subscribes, args.profile), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
