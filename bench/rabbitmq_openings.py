"""RabbitMQ openings after a take-over (issue 23; docs/scale-out.md, "Failover at scale"):
how long a survivor takes to start consuming N subscriptions another instance made, and
how many times each opening waits for the broker.

Instance A (cluster mode, quorum queues) makes N subscriptions of one binding each;
instance B follows them (``origin`` "elsewhere": never declared there) and opens them as
its opener threads do after a failover: ``subscription`` then ``start``, from ``--threads``
threads at once.  Reported: the seconds for all of them, per opening, and the broker
round trips of an opening, counted on B's channels (an awaited ``channel.open``, an RPC
answered, a consume's write answered: each one wait on the broker; a channel begun
without waiting, ``Link.begin_channel``, is not one).

    .venv/bin/python -m bench.rabbitmq_openings [--subscriptions 300] [--threads 8]

It uses the broker named by ``WSNMOM_BENCH_AMQP_URL``, else a private local node (the test
suite's starter).  Informative: no target (the failover's gap is ``ha-scale``'s).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.middleware import started
from bench.util import print_figures


@contextmanager
def counted_waits() -> Iterator[Callable[[], int]]:
    """Counts, while open, the broker round trips the adapter's channels wait for: a
    channel opened and waited for, an RPC (``Channel.call``), a consume's write
    (``Channel.consume``)."""
    from wsnmom.adapters.rabbitmq._channel import Channel
    from wsnmom.adapters.rabbitmq._link import Link

    count = [0]
    lock = threading.Lock()
    originals = {
        (Link, "open_channel"): Link.open_channel,
        (Channel, "call"): Channel.call,
        (Channel, "consume"): Channel.consume,
    }

    def counting(real: Any) -> Any:
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            with lock:
                count[0] += 1
            return await real(*args, **kwargs)

        return wrapper

    for (owner, name), real in originals.items():
        setattr(owner, name, counting(real))
    try:
        yield lambda: count[0]
    finally:
        for (owner, name), real in originals.items():
            setattr(owner, name, real)


def openings(url: str, n: int, threads: int) -> dict[str, Any]:
    """Seconds and round trips for a follower to open ``n`` subscriptions made elsewhere."""
    from wsnmom.adapters.rabbitmq.adapter import RabbitMQAdapter
    from wsnmom.core.adapter import Received, SubscriptionSpec
    from wsnmom.topic_mapping.model import PathPattern

    ns = f"urn:bench:openings:{uuid.uuid4().hex}"
    maker, follower = (RabbitMQAdapter(url, {"queue_type": "quorum"}) for _ in range(2))
    for adapter in (maker, follower):
        adapter.open()
        adapter.shared_by_instances()
    patterns = (PathPattern(ns, ("t",)),)
    names = [f"o-{uuid.uuid4().hex[:12]}" for _ in range(n)]

    def on_message(m: Received) -> None:
        m.ack()

    def make(name: str) -> None:
        maker.subscription(SubscriptionSpec(name, patterns, origin="new"))

    def open_(name: str) -> None:
        handle = follower.subscription(SubscriptionSpec(name, patterns, origin="elsewhere"))
        handle.start(on_message, prefetch=10)

    try:
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(make, names))
        follower.subscription(SubscriptionSpec(names[0], patterns, origin="elsewhere"))
        open_(names[0])  # the exchanges and declaration channels in place: not counted
        load = os.getloadavg()[0]
        with counted_waits() as waits, ThreadPoolExecutor(threads) as pool:
            started = time.perf_counter()
            list(pool.map(open_, names[1:]))
            seconds = time.perf_counter() - started
            trips = waits()
    finally:
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(maker.delete_subscription, names))
        follower.close()
        maker.close()
    return {
        "subscriptions": n - 1,
        "threads": threads,
        "seconds": seconds,
        "ms_per_opening": 1000 * seconds / (n - 1),
        "round_trips_per_opening": trips / (n - 1),
        "load_average": load,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--subscriptions", type=int, default=300)
    ap.add_argument("--threads", type=int, default=8, help="opener threads")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    with started("rabbitmq", "wsnmom-openings-") as (mw, work):
        figures = openings(mw.adapter_url(work), args.subscriptions, args.threads)
    print_figures(figures, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
