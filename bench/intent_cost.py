"""What the orphan sweep's intents cost a Subscribe (``core.orphans``): Subscribes through
one in-process ``BrokerService`` on the embedded adapter (``--rabbitmq``: a private
RabbitMQ node), with a SQLite store (single instance) and with a PostgreSQL store
(cluster mode), with intents ("after") and with the path before them ("before": no
intent, the record written by ``put_subscription``, as the code did), one Subscribe of
each after the other in the same run, so that the machine's load falls on both alike.
Prints the median per Subscribe of each, their ratio, and the load average.

    python -m bench.intent_cost [--subscribes 200] [--rounds 5] [--rabbitmq]

PostgreSQL: ``WSNMOM_BENCH_POSTGRES_URL`` or a private server (the test suite's fixture
code).  Nothing here is a timed test: the ratio is read, not asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from wsnmom.core.model import ExpressionSource
from wsnmom.topic_mapping.dialects import CONCRETE
from wsnmom.topic_mapping.namespaces import TopicSet

from tests.core.conftest import Broker, FakeClock, RecordingOutbound, make_settings, sub_req

TOPIC = ExpressionSource(CONCRETE, "t:bench/intents", {"t": "urn:bench"})


@contextmanager
def _postgres() -> Iterator[str]:
    from tests.fixtures.postgres import PostgresNode, fresh_database

    with ExitStack() as stack:
        url = os.environ.get("WSNMOM_BENCH_POSTGRES_URL")
        if not url:
            node = PostgresNode()
            node.start()
            stack.callback(node.cleanup)
            url = node.url
        yield stack.enter_context(fresh_database(url))


def _before(store: Any) -> Callable[[], None]:
    """Make ``store`` behave as before intents; the returned call undoes it."""
    store.put_intent = lambda name, at=None: None
    store.add_subscription = store.put_subscription

    def undo() -> None:
        del store.put_intent
        del store.add_subscription

    return undo


def _round(broker: Broker, n: int, results: dict[str, list[float]]) -> None:
    """``n`` Subscribes of each kind, alternating one by one (the load falls on both
    alike), then their Unsubscribes (every round starts from the same store)."""
    service = broker.service
    assert service is not None
    made = []
    for i in range(2 * n):
        kind = "before" if i % 2 else "after"
        undo = _before(service.store) if kind == "before" else None
        try:
            start = time.perf_counter()
            sub = service.subscribe(sub_req("http://127.0.0.1:9/bench", topic=TOPIC))
            results[kind].append(time.perf_counter() - start)
        finally:
            if undo is not None:
                undo()
        made.append(sub.id)
    for sub_id in made:
        service.unsubscribe(sub_id)


def measure(
    label: str, store_url: str | None, adapter_url: str | None, tmp: Path, n: int, rounds: int
) -> None:
    broker = Broker(
        tmp / label,
        RecordingOutbound(),
        FakeClock(),
        make_settings(),
        lambda: TopicSet(fixed=False),
        adapter_url=adapter_url,
        store_url=store_url,
    )
    broker.start()
    try:
        results: dict[str, list[float]] = {"before": [], "after": []}
        _round(broker, 10, {"before": [], "after": []})  # warm-up
        for _ in range(rounds):
            _round(broker, n, results)
        before = statistics.median(results["before"]) * 1000
        after = statistics.median(results["after"]) * 1000
        print(
            f"{label}: Subscribe median before {before:.2f} ms, after {after:.2f} ms, "
            f"ratio {after / before:.2f} ({rounds} x {n} each; load {_load()})"
        )
    finally:
        broker.stop()


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subscribes", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--rabbitmq", action="store_true", help="a private RabbitMQ node instead of embedded"
    )
    args = parser.parse_args()
    print(f"load before: {_load()}")
    with tempfile.TemporaryDirectory(prefix="wsnmom-intent-cost-") as tmp, ExitStack() as stack:
        adapter_url = None
        if args.rabbitmq:
            from tests.fixtures.brokers import RabbitNode, local_broker

            rabbit = local_broker(RabbitNode)
            stack.callback(rabbit.close)
            adapter_url = rabbit.url
        middleware = "rabbitmq" if args.rabbitmq else "embedded"
        n, rounds = args.subscribes, args.rounds
        measure(f"{middleware}+sqlite", None, adapter_url, Path(tmp), n, rounds)
        with _postgres() as url:
            measure(f"{middleware}+postgresql", url, adapter_url, Path(tmp), n, rounds)
    print(f"load after: {_load()}")


if __name__ == "__main__":
    main()
