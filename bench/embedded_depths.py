"""CPU of the embedded adapter's ``depths`` (one call for many subscriptions, as the admin
overview and the sweep make it) with and without a ``max_age``, as a ratio in one run.

It opens one embedded store in a temporary directory with ``--count`` subscriptions that
have a ``max_age`` (7 days, the service's default) and as many that have none, all on one
topic, publishes ``--messages`` messages to it (each queue holds them all, none expired),
then times ``--repeat`` ``depths`` calls over each half, alternating.  Reports the medians
of the calling thread's CPU time (the machine's other load does not count), and:

- ``aged_to_unaged``: ``depths`` CPU over the aged half / over the unaged half.  Both read
  every queue's count; the aged half also reads each queue's oldest message's publish
  time, so that no expired message is counted.
  Target: at most :data:`TARGET_AGED_TO_UNAGED` (one expiry query per aged queue made it
  3.3 at 10,000; findings F32).

Docs: docs/performance.md, docs/performance/findings.md F32.

Usage::

    python -m bench.embedded_depths [--count 10000] [--messages 2] [--repeat 7] [--json PATH]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from wsnmom.adapters.embedded import EmbeddedAdapter
from wsnmom.core.adapter import OutboundMessage, QueueLimits, SubscriptionHandle, SubscriptionSpec
from wsnmom.topic_mapping.model import PathPattern, Topic

from bench.util import print_figures

NS = "urn:wsnmom:bench:depths"
#: the aged half's ``depths`` CPU at most this many times the unaged half's
TARGET_AGED_TO_UNAGED = 2.0


def _cpu_ms(adapter: EmbeddedAdapter, handles: list[SubscriptionHandle]) -> float:
    """Thread CPU of one ``depths`` call over ``handles``, in milliseconds."""
    start = time.thread_time()
    adapter.depths(handles)
    return (time.thread_time() - start) * 1000


def measure(count: int, messages: int, repeat: int) -> dict[str, Any]:
    """Open a store with ``count`` aged and ``count`` unaged queues; time ``depths``."""
    pattern = (PathPattern(NS, ("t",)),)
    aged_limits = QueueLimits(max_age=timedelta(days=7))
    unaged_limits = QueueLimits(max_age=None)
    with tempfile.TemporaryDirectory(prefix="wsnmom-depths-") as tmp:
        adapter = EmbeddedAdapter(f"embedded://{Path(tmp) / 'store.sqlite3'}")
        adapter.open()
        try:
            aged = [
                adapter.subscription(SubscriptionSpec(f"aged-{i}", pattern, aged_limits))
                for i in range(count)
            ]
            unaged = [
                adapter.subscription(SubscriptionSpec(f"unaged-{i}", pattern, unaged_limits))
                for i in range(count)
            ]
            for _ in range(messages):
                adapter.publish(OutboundMessage(Topic(NS, ("t",)), b"x", uuid.uuid4().hex))
            expected = [messages] * count
            assert adapter.depths(aged) == expected and adapter.depths(unaged) == expected
            aged_ms: list[float] = []
            unaged_ms: list[float] = []
            for _ in range(repeat):
                aged_ms.append(_cpu_ms(adapter, aged))
                unaged_ms.append(_cpu_ms(adapter, unaged))
        finally:
            adapter.close()
    aged_med, unaged_med = statistics.median(aged_ms), statistics.median(unaged_ms)
    ratio = aged_med / unaged_med
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    return {
        "queues_per_half": count,
        "messages_per_queue": messages,
        "repeat": repeat,
        "aged_cpu_ms": round(aged_med, 2),
        "unaged_cpu_ms": round(unaged_med, 2),
        "aged_to_unaged": round(ratio, 2),
        "target_aged_to_unaged": TARGET_AGED_TO_UNAGED,
        "target_met": ratio <= TARGET_AGED_TO_UNAGED,
        "loadavg_1m": float(load),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000, help="queues per half")
    parser.add_argument("--messages", type=int, default=2, help="messages in each queue")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)
    figures = measure(args.count, args.messages, args.repeat)
    print_figures(figures, args.json)
    return 0 if figures["target_met"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
