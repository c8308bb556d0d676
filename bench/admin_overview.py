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
- ``depths``: the embedded adapter's ``depths`` as it is against the one before F32
  (:func:`_depths_before_f32`, one expiry query per queue with a ``max_age`` in a write
  transaction), swapped in on the same gateway and alternated round by round.  Every
  subscription has the service's default ``max_age`` (7 days); ``--stale`` more of them,
  paused, get a message published before each timed call and aged past it, so each call
  expires those (and counts them 0: asserted).  With ``--backlog N`` every subscription is
  paused and its queue holds ``N`` young messages during these rounds (the grouped read
  then reads them all).  It reports both versions' CPU per
  overview request and per ``depths`` call over every handle, and ``depths_ratio``: the
  ``depths`` call's CPU now over before.  Target: at most :data:`TARGET_DEPTHS_RATIO` at
  the largest size.

Docs: docs/performance.md, docs/performance/findings.md F31, F32.

Usage::

    python -m bench.admin_overview [--sizes 100,10000] [--repeat 5] [--stale 10]
        [--backlog 0] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import MethodType
from typing import Any

from wsnmom.adapters.embedded import EmbeddedAdapter
from wsnmom.adapters.embedded.store import Engine
from wsnmom.core.adapter import OutboundMessage
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
from wsnmom.topic_mapping.model import Topic

from bench.util import print_figures
from wsnmom.server import Runtime, build_runtime

NS = "urn:wsnmom:bench:overview"
ADMIN = "/wsn/admin/api"
#: the overview's CPU at most this many times the list's first page at the largest size
#: (with every full status built it was 7.5 at 10,000 and 10.6 at 100,000; F31)
TARGET_TO_FIRST_PAGE = 3.5
#: ``depths`` CPU now over before F32 at most this at the largest size (before F32 it ran
#: an expiry query per queue with a ``max_age``)
TARGET_DEPTHS_RATIO = 0.6
#: the topic of the ``--stale`` subscriptions (paused: nothing delivers their messages)
STALE = ("stale",)
#: how far a stale message is aged: past the default ``max_age`` of 7 days
AGED_BY = timedelta(days=8).total_seconds()


def _seed(path: Path, count: int, stale: int, backlog: int) -> None:
    """``count`` subscriptions in a new SQLite store at ``path``, a millisecond apart (all
    paused with a ``backlog``), and ``stale`` paused ones on :data:`STALE`."""
    start = datetime.now(UTC) - timedelta(hours=1)
    store = SqliteStore(str(path))
    try:
        for n in range(count + stale):
            paused = n >= count or backlog > 0 or n % 1000 == 999
            store.put_subscription(
                Subscription(
                    id=new_resource_id(),
                    consumer=EndpointReference(f"http://127.0.0.1:9/plc-{n:06d}"),
                    creation_time=start + timedelta(milliseconds=n),
                    termination_time=start + timedelta(days=1),
                    topic=ExpressionSource(
                        SIMPLE, "t:stale" if n >= count else f"t:line{n % 100}", {"t": NS}
                    ),
                    state=SubscriptionState.PAUSED if paused else SubscriptionState.ACTIVE,
                )
            )
    finally:
        store.close()


def _depths_before_f32(engine: Engine, sids: Sequence[int]) -> list[int]:
    """``Queues.depths`` before F32 (integ ``37be44c``): an expiry query for every queue
    with a ``max_age``, in one write transaction, then one grouped count."""
    with engine.lock:
        bounded = [engine.subs[s] for s in sids if s in engine.subs]
        aged = [st for st in bounded if st.limits.max_age is not None]
        if aged or engine._pending_acks:
            with engine.tx():
                for st in aged:
                    engine._expire(st)
        counts = dict(
            engine.conn.execute(
                "SELECT sub, count(*) FROM queue_entries WHERE state = 0 GROUP BY sub"
            ).fetchall()
        )
    return [int(counts.get(s, 0)) for s in sids]


def _age_stale_heads(runtime: Runtime, engine: Engine) -> None:
    """Publish one message to the stale subscriptions and age it past their ``max_age``."""
    runtime.adapter.publish(OutboundMessage(Topic(NS, STALE), b"<stale/>", uuid.uuid4().hex))
    with engine.lock, engine.tx() as c:
        c.execute(
            "UPDATE messages SET published = published - ? WHERE id = "
            "(SELECT max(id) FROM messages)",
            (AGED_BY,),
        )


def _thread_cpu(action: Callable[[], object]) -> float:
    """Thread-CPU seconds of ``action``."""
    cpu = time.thread_time()
    action()
    return time.thread_time() - cpu


def _depths_ab(
    runtime: Runtime, client: Any, repeat: int, stale: int, backlog: int
) -> dict[str, Any]:
    """The overview's and ``depths``' CPU with ``depths`` as now and as before F32,
    alternated on one gateway, stale heads aged before each call."""
    assert isinstance(runtime.adapter, EmbeddedAdapter)
    engine = runtime.adapter._require()
    handles = runtime.service.registry.handles()
    expected = backlog * (len(handles) - stale)  # the stale ones' messages are expired
    cpu: dict[str, dict[str, list[float]]] = {
        v: {"overview": [], "depths": []} for v in ("now", "before")
    }

    def overview() -> None:
        resp = client.get(f"{ADMIN}/overview")
        assert resp.status_code == 200, resp.get_data(as_text=True)
        assert resp.json["totals"]["backlog"] == expected, resp.json["totals"]

    def depths() -> None:
        assert sum(d or 0 for d in runtime.adapter.depths(handles)) == expected

    for _ in range(repeat):
        for version in ("before", "now"):
            if version == "before":
                setattr(engine, "depths", MethodType(_depths_before_f32, engine))  # noqa: B010
            for name, action in (("overview", overview), ("depths", depths)):
                if stale:
                    _age_stale_heads(runtime, engine)
                cpu[version][name].append(_thread_cpu(action))
            if version == "before":
                delattr(engine, "depths")
    ms = {
        v: {k: round(statistics.median(x) * 1000, 2) for k, x in d.items()} for v, d in cpu.items()
    }
    return {
        "stale_queues": stale,
        "messages_per_queue": backlog,
        "overview_cpu_ms": {v: ms[v]["overview"] for v in ms},
        "depths_cpu_ms": {v: ms[v]["depths"] for v in ms},
        "depths_ratio": round(ms["now"]["depths"] / max(ms["before"]["depths"], 1e-3), 2),
        "overview_ratio": round(ms["now"]["overview"] / max(ms["before"]["overview"], 1e-3), 2),
        "load_after": os.getloadavg()[0],
    }


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


def _publish_backlog(runtime: Runtime, count: int, backlog: int) -> None:
    """``backlog`` messages into each of the ``count`` subscriptions' queues."""
    lines = [Topic(NS, (f"line{k}",)) for k in range(min(count, 100))]
    runtime.adapter.publish_many(
        [OutboundMessage(t, b"<m/>", uuid.uuid4().hex) for _ in range(backlog) for t in lines]
    )


def _one_size(count: int, repeat: int, stale: int, backlog: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="wsnmom-bench-overview-") as tmp:
        began = time.perf_counter()
        _seed(Path(tmp) / "store.db", count, stale, backlog)
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
            assert body["totals"]["subscriptions"] == count + stale, body["totals"]
            page_wall, page_cpu, page = _time(client, f"{ADMIN}/subscriptions?limit=100", repeat)
            assert page["count"] == count + stale, page["count"]
            _publish_backlog(runtime, count, backlog)
            depths = _depths_ab(runtime, client, repeat, stale, backlog)
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
        "depths": depths,
    }


def measure(sizes: list[int], repeat: int, stale: int = 10, backlog: int = 0) -> dict[str, Any]:
    """The figures at each size (see the module docstring)."""
    out: dict[str, Any] = {"repeat": repeat, "load": os.getloadavg()}
    results = {str(n): _one_size(n, repeat, stale, backlog) for n in sorted(sizes)}
    smallest = results[str(min(sizes))]["overview_cpu_ms"]
    for entry in results.values():
        entry["growth"] = round(entry["overview_cpu_ms"] / max(smallest, 1e-6), 1)
    out["sizes"] = results
    largest = results[str(max(sizes))]["overview_to_first_page"]
    out["target_to_first_page"] = TARGET_TO_FIRST_PAGE
    depths_ratio = results[str(max(sizes))]["depths"]["depths_ratio"]
    out["target_depths_ratio"] = TARGET_DEPTHS_RATIO
    out["met"] = largest <= TARGET_TO_FIRST_PAGE and depths_ratio <= TARGET_DEPTHS_RATIO
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,10000", help="comma-separated counts")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--stale", type=int, default=10, help="paused queues aged each call")
    parser.add_argument("--backlog", type=int, default=0, help="young messages per queue")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    print_figures(measure(sizes, args.repeat, args.stale, args.backlog), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
