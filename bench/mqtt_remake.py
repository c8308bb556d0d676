"""What the store's answers cost when MQTT cluster mode makes again the sessions a broker
lost (docs/scale-out.md, "MQTT in cluster mode"; adapters/mqtt/store_questions.py).

Two parts, on a PostgreSQL store of N subscriptions (2,000 by default):

* **store**: the per-subscription question as core asked it before
  (``get_subscription`` then ``get_pull_point``, for each of the N names, one after the
  other) against the plural one (``Store.held`` of the N names, one query), alternately
  in the same run, each timed ``--rounds`` times;
* **openings** (``--openings``, a private Mosquitto): a shard of N subscriptions whose
  sessions the broker lost is started on 8 threads, as core's openers do
  (``core.ownership.OPEN_AT_ONCE``): the seconds until every ``start`` returned, until
  every session delivers again, and the seconds the opening threads spent in the store.
  ``--mqtt-code DIR`` runs the MQTT adapter's code from ``DIR/adapters/mqtt`` instead
  (a ``git archive`` of an earlier commit: the "before").

    python -m bench.mqtt_remake [--subscriptions 2000] [--rounds 5] [--openings]
        [--mqtt-code DIR]

PostgreSQL: ``WSNMOM_BENCH_POSTGRES_URL`` or a private server (the test suite's fixture
code).  Prints medians, the ratio and the load average; nothing here is a timed test.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

from bench.store_listing import _load, _postgres, fill

#: core's opening threads (``core.ownership.OPEN_AT_ONCE``)
OPENERS = 8


def _use_mqtt_code(root: Path) -> None:
    """Import ``wsnmom.adapters.mqtt`` from ``root/adapters/mqtt`` (an earlier commit)."""
    package = root / "adapters" / "mqtt"
    spec = importlib.util.spec_from_file_location(
        "wsnmom.adapters.mqtt", package / "__init__.py", submodule_search_locations=[str(package)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["wsnmom.adapters.mqtt"] = module
    spec.loader.exec_module(module)


def store_part(store: Any, names: list[str], rounds: int) -> dict[str, list[float]]:
    """Per name (as before) and plural, alternately; seconds of each round."""
    result: dict[str, list[float]] = {"per name": [], "plural": [], "loads": []}
    for _ in range(rounds):
        result["loads"].append(_load())
        started = time.perf_counter()
        found = sum(
            1
            for n in names
            if store.get_subscription(n) is not None or store.get_pull_point(n) is not None
        )
        result["per name"].append(time.perf_counter() - started)
        started = time.perf_counter()
        held = store.held(names)
        result["plural"].append(time.perf_counter() - started)
        assert found == len(held) == len(names)
    result["loads"].append(_load())
    return result


def openings_part(store: Any, names: list[str]) -> dict[str, float]:
    """Start N lost sessions on ``OPENERS`` threads; seconds until the starts returned,
    until every session delivers, and spent in the store on the opening threads."""
    from wsnmom.adapters.mqtt.adapter import MqttAdapter
    from wsnmom.adapters.mqtt.cluster_handle import ClusterHandle
    from wsnmom.core.adapter import QueueLimits, SubscriptionSpec
    from wsnmom.topic_mapping.model import PathPattern

    from tests.fixtures.mosquitto import MosquittoNode

    in_store = [0.0]
    asked = [0]
    lock = threading.Lock()

    def timed(call: Any) -> Any:
        def wrapped(arg: Any) -> Any:
            started = time.perf_counter()
            try:
                return call(arg)
            finally:
                with lock:
                    asked[0] += 1
                    if threading.current_thread().name.startswith("opener"):
                        in_store[0] += time.perf_counter() - started

        return wrapped

    def stored(name: str) -> bool:  # core.cluster_parts.ClusterParts.stored
        return name in store.held((name,))

    def held(many: Collection[str]) -> set[str]:
        return set(store.held(many))

    node = MosquittoNode()
    node.start()
    with tempfile.TemporaryDirectory() as data:
        adapter = MqttAdapter(
            node.url,
            {
                "data_dir": data,
                "namespaces": {"urn:bench": "b"},
                "topic_prefix": "bench",
                "session_expiry": 600,
            },
        )
        try:
            adapter.shared_by_instances(lambda name: True)
            adapter.kept_in_store(timed(stored))
            if hasattr(adapter, "kept_in_store_many"):
                adapter.kept_in_store_many(timed(held))
            adapter.open()
            sessions = adapter._cnode.sessions  # type: ignore[union-attr]
            pattern = PathPattern("urn:bench", ("t",))
            handles = [
                ClusterHandle(sessions, SubscriptionSpec(n, (pattern,), QueueLimits()))
                for n in names
            ]
            work = list(handles)
            started = time.perf_counter()

            def opener() -> None:
                while True:
                    with lock:
                        if not work:
                            return
                        handle = work.pop()
                    handle.start(lambda received: received.ack(), prefetch=8)

            threads = [threading.Thread(target=opener, name=f"opener-{i}") for i in range(OPENERS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            returned = time.perf_counter() - started
            while not all(h.connected for h in handles):
                if time.perf_counter() - started > 600:
                    raise RuntimeError("not every session delivers after 600 s")
                time.sleep(0.05)
            delivering = time.perf_counter() - started
            for h in handles:
                h.stop()
        finally:
            adapter.close()
            node.cleanup()
    return {
        "returned": returned,
        "delivering": delivering,
        "in store": in_store[0],
        "questions": asked[0],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subscriptions", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--openings", action="store_true")
    parser.add_argument("--mqtt-code", type=Path)
    args = parser.parse_args(argv)
    logging.getLogger("wsnmom.adapters.mqtt").setLevel(logging.ERROR)  # a line per session
    if args.mqtt_code is not None:
        _use_mqtt_code(args.mqtt_code)
    from wsnmom.core.store_postgres import PostgresStore

    with _postgres() as url:
        store = PostgresStore(url, instance_id="bench-remake")
        try:
            fill(store, args.subscriptions)
            names = [f"sub-{n:08d}-5f0c2a9e" for n in range(args.subscriptions)]
            result = store_part(store, names, args.rounds)
            per, plural = statistics.median(result["per name"]), statistics.median(result["plural"])
            loads = result["loads"]
            print(
                f"store, {len(names)} names, {args.rounds} rounds: per name {per * 1000:.0f} ms "
                f"(median), plural {plural * 1000:.1f} ms: ratio {per / plural:.0f}x; "
                f"load {min(loads):.1f}-{max(loads):.1f}"
            )
            if args.openings:
                before = _load()
                got = openings_part(store, names)
                print(
                    f"openings of {len(names)} lost sessions on {OPENERS} threads"
                    f"{' (code of ' + str(args.mqtt_code) + ')' if args.mqtt_code else ''}: "
                    f"starts returned {got['returned']:.2f} s, all delivering "
                    f"{got['delivering']:.2f} s, opening threads in the store "
                    f"{got['in store']:.2f} s, store asked {got['questions']:.0f} times; "
                    f"load {before:.1f}-{_load():.1f}"
                )
        finally:
            store.close()


if __name__ == "__main__":
    main()
