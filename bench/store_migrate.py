"""What ``wsnmom store migrate`` costs on a large gateway's store: a SQLite store of N
subscriptions (10,000 by default), N/10 named pull points, N/10 registrations, N/20
current messages and as many recorded topics, copied into an empty PostgreSQL database by
the command in a process of its own: its seconds, records per second and peak RSS, against
a baseline measured in the same run (``wsnmom store info`` on the same source: the same
imports and opening, and the same listing of every record, which ``store info`` counts;
nothing written), with the load average read next to each.

    python -m bench.store_migrate [--subscriptions 10000] [--json PATH]

PostgreSQL: ``WSNMOM_BENCH_POSTGRES_URL`` or a private server (the test suite's fixture
code, fsync off: a server on a disk that syncs each commit is slower per record).  Prints
the figures as JSON; nothing here is a timed test.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from wsnmom.core.model import (
    EndpointReference,
    ExpressionSource,
    NotificationMessage,
    PublisherRegistration,
    PullPoint,
    Subscription,
)
from wsnmom.core.store_sqlite import SqliteStore
from wsnmom.topic_mapping.model import Topic

from bench.util import postgres, print_figures

NOW = datetime(2026, 1, 1, tzinfo=UTC)
TOPIC = ExpressionSource(
    "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Concrete",
    "t:plant/line-4/press/temperature",
    {"t": "urn:example:plant"},
)


def fill(path: str, count: int) -> int:
    """The source store; how many records it holds."""
    store = SqliteStore(path)
    try:
        for n in range(count):
            store.put_subscription(
                Subscription(
                    id=f"sub-{n:08d}-5f0c2a9e",
                    consumer=EndpointReference(
                        f"http://consumer-{n % 500}.example.org:8080/wsn/notify",
                        (f"<c:Id xmlns:c='urn:example:consumer'>{n}</c:Id>".encode(),),
                    ),
                    creation_time=NOW,
                    termination_time=NOW + timedelta(days=30),
                    topic=TOPIC,
                    filter_xml=b"<wsnt:Filter xmlns:wsnt='http://docs.oasis-open.org/wsn/b-2'/>",
                    owner="plant-operator",
                )
            )
        for n in range(count // 10):
            store.put_pull_point(PullPoint(f"pp-{n:07d}", NOW, None, f"queue-{n}"))
            store.put_registration(
                PublisherRegistration(
                    f"reg-{n:07d}", NOW, None, EndpointReference(f"http://pub-{n}.example.org/")
                )
            )
        topics = [Topic("urn:example:plant", ("line", f"m{n}")) for n in range(count // 20)]
        for topic in topics:
            store.put_current_message(
                NotificationMessage(
                    f"m-{topic.path[1]}", b"<r>21.5</r>" * 20, topic, published_at=NOW
                )
            )
        store.record_topics(topics)
    finally:
        store.close()
    return count + 2 * (count // 10) + 2 * (count // 20)


def run(args: list[str]) -> dict[str, Any]:
    """``wsnmom ARGS`` in a process of its own: seconds, peak RSS (MiB), load before/after."""
    load = os.getloadavg()[0]
    started = time.perf_counter()
    # a wrapper whose only child is the command: its RUSAGE_CHILDREN is the command's
    probe = (
        "import resource, subprocess, sys; "
        "done = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
        "print(done.returncode); print(done.stdout[-300:] + done.stderr[-300:])"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, sys.executable, "-m", "wsnmom", *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n", 2)
    seconds = time.perf_counter() - started
    if out[1] != "0":
        raise SystemExit(f"wsnmom {args[0]} {args[1]} failed: {out[2]}")
    return {
        "seconds": round(seconds, 2),
        "peak_rss_mib": round(int(out[0]) / 1024, 1),
        "load": [round(load, 1), round(os.getloadavg()[0], 1)],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subscriptions", type=int, default=10_000)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp, postgres() as url:
        source = f"sqlite:///{tmp}/store.db"
        records = fill(f"{tmp}/store.db", args.subscriptions)
        baseline = run(["store", "info", source])
        copied = run(["store", "migrate", "--from", source, "--to", url])
    print_figures(
        {
            "subscriptions": args.subscriptions,
            "records": records,
            "migrate": copied,
            "records_per_second": round(records / copied["seconds"]),
            "baseline_store_info": baseline,
            "rss_over_baseline_mib": round(copied["peak_rss_mib"] - baseline["peak_rss_mib"], 1),
            "time_over_baseline": round(copied["seconds"] / baseline["seconds"], 1),
        },
        args.json,
    )


if __name__ == "__main__":
    main()
