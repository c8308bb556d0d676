"""What the orphan sweep's intents cost a Subscribe and an Unsubscribe (``core.orphans``):
Subscribes, then their Unsubscribes, through one in-process ``BrokerService`` on the
embedded adapter (``--rabbitmq``: a private RabbitMQ node), with a SQLite store (single
instance) and with a PostgreSQL store (cluster mode), with intents ("after") and with the
path before them ("before": no intent, the record written by ``put_subscription`` and
deleted without an intent, as the code did), one of each after the other in the same
run, so that the machine's load falls on both alike.  Prints the median per Subscribe
and per Unsubscribe of each, their ratios, and the load average.

    python -m bench.intent_cost [--subscribes 200] [--rounds 5] [--rabbitmq]

PostgreSQL: ``WSNMOM_BENCH_POSTGRES_URL`` or a private server (the test suite's fixture
code).  Nothing here is a timed test: the ratio is read, not asserted.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

from wsnmom.core.model import ExpressionSource
from wsnmom.topic_mapping.dialects import CONCRETE
from wsnmom.topic_mapping.topic_set import TopicSet

from bench.util import postgres
from tests.core.conftest import Broker, FakeClock, RecordingOutbound, make_settings, sub_req

TOPIC = ExpressionSource(CONCRETE, "t:bench/intents", {"t": "urn:bench"})


def _before(store: Any) -> Callable[[], None]:
    """Make ``store`` behave as before intents; the returned call undoes it."""
    delete = store.delete_subscription
    store.put_intent = lambda name, at=None: None
    store.add_subscription = store.put_subscription
    store.delete_subscription = lambda sub_id, intent=False: delete(sub_id)
    store.delete_intent = lambda name, older_than=None: False

    def undo() -> None:
        for name in ("put_intent", "add_subscription", "delete_subscription", "delete_intent"):
            delattr(store, name)

    return undo


def _timed(service: Any, kind: str, call: Callable[[], Any], into: list[float]) -> Any:
    """``call()`` as ``kind`` ("before": without intents), its time added to ``into``."""
    undo = _before(service.store) if kind == "before" else None
    try:
        start = time.perf_counter()
        result = call()
        into.append(time.perf_counter() - start)
        return result
    finally:
        if undo is not None:
            undo()


def _round(broker: Broker, n: int, results: dict[str, list[float]]) -> None:
    """``n`` Subscribes of each kind, alternating one by one (the load falls on both
    alike), then their Unsubscribes, alternating too (every round starts from the same
    store)."""
    service = broker.service
    assert service is not None
    made = []
    for i in range(2 * n):
        kind = "before" if i % 2 else "after"
        request = sub_req("http://127.0.0.1:9/bench", topic=TOPIC)
        sub = _timed(service, kind, partial(service.subscribe, request), results[kind])
        made.append((kind, sub.id))
    for kind, sub_id in made:
        unsubscribe = partial(service.unsubscribe, sub_id)
        _timed(service, kind, unsubscribe, results["unsubscribe " + kind])


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
        kinds = ("before", "after", "unsubscribe before", "unsubscribe after")
        results: dict[str, list[float]] = {kind: [] for kind in kinds}
        _round(broker, 10, {kind: [] for kind in kinds})  # warm-up
        for _ in range(rounds):
            _round(broker, n, results)
        for operation, prefix in (("Subscribe", ""), ("Unsubscribe", "unsubscribe ")):
            before = statistics.median(results[prefix + "before"]) * 1000
            after = statistics.median(results[prefix + "after"]) * 1000
            print(
                f"{label}: {operation} median before {before:.2f} ms, after {after:.2f} ms, "
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
        with postgres() as url:
            measure(f"{middleware}+postgresql", url, adapter_url, Path(tmp), n, rounds)
    print(f"load after: {_load()}")


if __name__ == "__main__":
    main()
