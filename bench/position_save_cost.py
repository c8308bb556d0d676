"""What one position save pass costs in cluster mode on Kafka (docs/scale-out.md, "Kafka"):
``N`` cursors' positions written (1) in the PostgreSQL store by the fenced statement
(``core.positions_postgres``, through ``core.position_fence.FencedPositions``: one
statement for the whole pass, the shard rows locked) and (2) into their consumer groups
(``adapters/kafka/positions.py``: one ``alter_consumer_group_offsets`` per group, all in
flight at once), which is what a pass cost before and what it still writes afterwards as
a mirror.  The two alternate, round after round (A B B A ...), so that the machine's load
falls on both alike; prints the median per pass of each, their ratio and the load
average before and after.

    python -m bench.position_save_cost [--cursors 1000] [--streams 3] [--rounds 5]

PostgreSQL: ``WSNMOM_BENCH_POSTGRES_URL`` or a private server; Kafka:
``WSNMOM_BENCH_KAFKA_BOOTSTRAP`` or a private tansu node (the test suite's fixture code).
Nothing here is a timed test: the ratio is read, not asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack

from bench.util import postgres


def _kafka(stack: ExitStack) -> str:
    bootstrap = os.environ.get("WSNMOM_BENCH_KAFKA_BOOTSTRAP")
    if bootstrap:
        return bootstrap
    from tests.fixtures.tansu import TansuNode

    node = TansuNode()
    node.start()
    stack.callback(node.cleanup)
    return node.bootstrap


def _timed(save: Callable[[int], object], value: int) -> float:
    started = time.perf_counter()
    save(value)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cursors", type=int, default=1000)
    parser.add_argument("--streams", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    from confluent_kafka.admin import AdminClient, NewTopic
    from wsnmom.adapters.kafka.clients import Health
    from wsnmom.adapters.kafka.config import parse_settings
    from wsnmom.adapters.kafka.positions import KafkaPositionStore
    from wsnmom.core.position_fence import FencedPositions
    from wsnmom.core.store_url import open_store

    print("load before:", os.getloadavg())
    with ExitStack() as stack:
        bootstrap = _kafka(stack)
        url = stack.enter_context(postgres())
        tag = uuid.uuid4().hex[:8]
        topic = f"bench{tag}.positions"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(topic, num_partitions=args.streams)])[topic].result(30)
        settings = parse_settings(
            f"kafka://{bootstrap}", {"group_prefix": f"bench.{tag}.", "topic_prefix": "bench"}
        )
        health = Health(settings.health_interval, settings.health_timeout)
        groups = KafkaPositionStore(
            lambda: AdminClient({"bootstrap.servers": bootstrap}), settings, health
        )
        store = open_store(url, instance_id="bench")
        stack.callback(store.close)
        coordination = store.coordination("bench")
        coordination.join("http://bench", "1", single_instance=False)
        held = coordination.heartbeat(64, 60.0).held
        table = coordination.positions()
        assert table is not None
        names = [f"s{i:05d}" for i in range(args.cursors)]
        shard_of = {n: sorted(held)[i % len(held)] for i, n in enumerate(names)}
        keeper = FencedPositions(table, lambda n: (shard_of[n], held[shard_of[n]]))

        def changes(r: int) -> dict[str, dict[tuple[str, int], int]]:
            return {n: {(topic, p): r + 1 for p in range(args.streams)} for n in names}

        def in_store(r: int) -> object:
            refused = keeper.save(changes(r))
            assert not refused, refused
            return None

        def in_groups(r: int) -> object:
            groups.save(changes(r))
            return None

        in_store(0)  # first writes (inserts; groups made) outside the figures
        in_groups(0)
        pg: list[float] = []
        kafka: list[float] = []
        for r in range(args.rounds):
            first, second = (in_store, in_groups) if r % 2 == 0 else (in_groups, in_store)
            for run in (first, second):
                (pg if run is in_store else kafka).append(_timed(run, r + 1))
        med_pg, med_kafka = statistics.median(pg), statistics.median(kafka)
        print(f"{args.cursors} cursors x {args.streams} streams, {args.rounds} rounds")
        print(f"store statement: median {med_pg * 1000:.1f} ms  {[round(t * 1000) for t in pg]}")
        print(
            f"consumer groups: median {med_kafka * 1000:.1f} ms  {[round(t * 1000) for t in kafka]}"
        )
        print(f"ratio store / groups: {med_pg / med_kafka:.2f}")
    print("load after:", os.getloadavg())


if __name__ == "__main__":
    main()
