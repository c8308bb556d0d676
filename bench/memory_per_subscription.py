"""Python heap bytes per pull-point subscription, traced with ``tracemalloc``.

Builds an in-process broker (embedded adapter and SQLite store in a temporary directory,
no HTTP), creates pull points (one per ten subscriptions, on 1,000 topics, like the memory
scenario) and then ``count`` subscriptions whose consumers are those pull points, and
reports the traced growth per subscription, in total and by source file.  This is the
Python-object share of F2 in docs/performance.md (RSS also holds allocator overhead and
SQLite's page cache).

Usage::

    python -m bench.memory_per_subscription [--count 5000] [--top 8] [--json PATH]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import tracemalloc
from collections import Counter
from pathlib import Path

from wsnmom.adapters.embedded.adapter import EmbeddedAdapter
from wsnmom.core.config import Settings
from wsnmom.core.model import (
    CreatePullPointRequest,
    EndpointReference,
    ExpressionSource,
    SubscribeRequest,
)
from wsnmom.core.ports import OutboundSoap
from wsnmom.core.service import BrokerService
from wsnmom.core.store_sqlite import SqliteStore
from wsnmom.topic_mapping.dialects import SIMPLE

TOPIC_NS = "urn:wsnmom:bench:memory"
TOPICS = 1000


class _NoOutbound:
    """Pull points need no outbound SOAP; any call is a bug in this script."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"unexpected outbound call {name}")


def measure(count: int, top: int = 8) -> dict[str, object]:
    """Create ``count`` pull-point subscriptions; traced bytes per subscription."""
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings()
        settings.public_url = "http://127.0.0.1:8080"
        adapter = EmbeddedAdapter(f"embedded://{Path(tmp) / 'mw'}")
        adapter.open()
        outbound: OutboundSoap = _NoOutbound()  # type: ignore[assignment]
        service = BrokerService(
            settings, adapter, SqliteStore(str(Path(tmp) / "store.db")), outbound
        )
        try:
            pull_points = [
                service.create_pull_point(CreatePullPointRequest())
                for _ in range(max(1, count // 10))
            ]
            addresses = [service.pull_point_address(p.id) for p in pull_points]

            def subscribe(i: int) -> None:
                topic = ExpressionSource(SIMPLE, f"b:t{i % TOPICS}", {"b": TOPIC_NS})
                consumer = EndpointReference(addresses[i % len(addresses)])
                service.subscribe(SubscribeRequest(consumer, topic=topic))

            for i in range(min(200, count)):  # warm caches and lazily created objects
                subscribe(count + i)
            gc.collect()
            tracemalloc.start(1)
            before = tracemalloc.take_snapshot()
            for i in range(count):
                subscribe(i)
            gc.collect()
            after = tracemalloc.take_snapshot()
            tracemalloc.stop()
        finally:
            service.close()
            adapter.close()
    by_file: Counter[str] = Counter()
    blocks: Counter[str] = Counter()
    for stat in after.compare_to(before, "filename"):
        name = stat.traceback[0].filename
        for marker in ("/site-packages/", "/lib/python"):
            if marker in name:
                name = name.split(marker, 1)[1]
                break
        else:
            name = name.replace(str(Path(__file__).resolve().parents[1]) + "/", "")
        by_file[name] += stat.size_diff
        blocks[name] += stat.count_diff
    total = sum(by_file.values())
    return {
        "subscriptions": count,
        "bytes_per_subscription": round(total / count),
        "by_file": [
            {
                "file": name,
                "bytes_per_subscription": round(size / count),
                "blocks_per_subscription": round(blocks[name] / count, 1),
            }
            for name, size in by_file.most_common(top)
        ],
    }


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=5000)
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    result = measure(args.count, args.top)
    print(
        f"{result['bytes_per_subscription']:,} traced bytes per subscription "
        f"({args.count:,} pull-point subscriptions)"
    )
    for row in result["by_file"]:  # type: ignore[attr-defined]
        print(
            f"  {row['bytes_per_subscription']:>7,} B  {row['blocks_per_subscription']:>5} "
            f"blocks  {row['file']}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
