"""RabbitMQ queue priming (docs/performance.md, F5 follow-up): seconds until the broker
confirms the first and the second publish routed to N *new* subscription queues, without
and with the adapter's primers.

RabbitMQ creates a classic queue's directory and index journal lazily, with the first
persistent message (~1.3 ms of broker I/O per queue).  Unprimed, the first publish into
2,000 fresh queues is confirmed ~10x later than the second; primed (the default), about as
fast.  The claim lived as timing ratios in tests/adapters/test_rabbitmq_perf_fanout.py;
that test now checks only the outcome (both publishes confirmed, every queue holding just
the real messages) and the figures are measured here:

    .venv/bin/python -m bench.rabbitmq_priming [--queues 2000] [--json FILE]

It uses the broker named by ``WSNMOM_BENCH_AMQP_URL``, else a private local node (the test
suite's starter, as ``make bench`` does).  Targets: primed first <= unprimed first / 2,
primed first <= 3 x primed second + 0.5 s.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.middleware import started
from bench.util import print_figures


def first_and_second_confirm(url: str, options: dict[str, Any], n: int) -> tuple[float, float]:
    """Seconds until the broker confirmed the first and the second publish routed to
    ``n`` new subscription queues (not consumed), on an adapter with ``options``."""
    from wsnmom.adapters.rabbitmq.adapter import RabbitMQAdapter
    from wsnmom.core.adapter import OutboundMessage, SubscriptionHandle, SubscriptionSpec
    from wsnmom.topic_mapping.model import PathPattern, Topic

    ns = f"urn:bench:priming:{uuid.uuid4().hex}"
    adapter = RabbitMQAdapter(url, options)
    adapter.open()
    patterns = (PathPattern(ns, ("fan",)),)

    def create(i: int) -> SubscriptionHandle:
        return adapter.subscription(SubscriptionSpec(f"f-{i}", patterns))

    try:
        with ThreadPoolExecutor(16) as pool:
            handles = list(pool.map(create, range(n)))
        time.sleep(1.0)  # let the broker finish writing the primers
        times = []
        try:
            for body in (b"<first/>", b"<second/>"):
                message = OutboundMessage(Topic(ns, ("fan",)), body, message_id=uuid.uuid4().hex)
                started = time.perf_counter()
                if not adapter.publish(message, timeout=120).routed:
                    raise RuntimeError("the publish reached no queue")
                times.append(time.perf_counter() - started)
        finally:
            with ThreadPoolExecutor(16) as pool:
                list(pool.map(lambda h: h.delete(), handles))
    finally:
        adapter.close()
    return times[0], times[1]


def measure(n: int) -> dict[str, Any]:
    """Both runs on a broker of their own vhosts; the figures and the targets' verdicts."""
    with started("rabbitmq", "wsnmom-priming-") as (mw, work):
        cold = first_and_second_confirm(mw.adapter_url(work), {"prime_queues": "false"}, n)
        primed = first_and_second_confirm(mw.adapter_url(work), {}, n)
    return {
        "queues": n,
        "unprimed_first_s": cold[0],
        "unprimed_second_s": cold[1],
        "primed_first_s": primed[0],
        "primed_second_s": primed[1],
        "primed_first_vs_unprimed_first": primed[0] / cold[0] if cold[0] else None,
        "target_primed_first_le_half_unprimed": primed[0] < cold[0] / 2,
        "target_primed_first_le_3x_second": primed[0] < 3 * primed[1] + 0.5,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--queues", type=int, default=2000, help="new queues per publish")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    print_figures(measure(args.queues), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
