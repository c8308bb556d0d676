"""The cost part of scenario ``ha``: one instance on a SQLite store against one instance in
cluster mode on PostgreSQL, same broker, the same work for each (docs/performance.md,
scenario 9).

Both instances run side by side and take turns, round after round, in the order A B B A
A B ...: a change of the machine's load during the run (other engineers' work on the
shared machine) falls on both alike instead of on whichever ran second.  Each round
gives each instance Notifies nobody subscribed to (CPU per Notify), Notifies to ten push
subscriptions (CPU per delivery, its Notify's share taken off) and sequential Subscribes
(throughput).  CPU is read from the gateway process's CPU clock (nanoseconds, every
thread, the background work of cluster mode included: heartbeats, the change log).  The
figures are the totals over all rounds; the ratio of each round gives the spread.
"""

from __future__ import annotations

import collections
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from bench import client, soap
from bench.middleware import Middleware
from bench.scenarios.base import Context
from bench.server import ServerProcess
from bench.util import process_cpu_seconds, wait_until

COST_TOPIC = "ha-cost"
NOBODY_TOPIC = "ha-nobody"
IDLE_TOPIC = "ha-idle"
FANOUT = 10
MODES = ("single", "cluster")
#: times a Notify refused with 503 is sent again
RETRIES = 10
#: py-spy, which names the threads of ``WSNMOM_BENCH_HA_THREADS=1`` (ids without it)
PYSPY = shutil.which("py-spy") or str(Path(__file__).parents[2] / ".venv/bin/py-spy")


@dataclass(slots=True)
class Tally:
    """What one instance used, summed over the rounds, and per round."""

    notify_cpu: float = 0.0
    notifies: int = 0
    delivery_cpu: float = 0.0
    deliveries: int = 0
    subscribe_s: float = 0.0
    subscribes: int = 0
    #: POSTs the consumer received in the delivery rounds (a delivery batch is one)
    posts: int = 0
    #: Notifies refused with 503 and sent again
    retried: int = 0
    rounds: list[dict[str, float]] = field(default_factory=list)

    def figures(self) -> dict[str, float]:
        """CPU ms per Notify and per delivery, Subscribes per second."""
        return {
            "retried": self.retried,
            "notify_ms": self.notify_cpu * 1000 / self.notifies,
            "delivery_ms": self.delivery_cpu * 1000 / self.deliveries,
            "subscribe_per_s": self.subscribes / self.subscribe_s,
            "messages_per_post": self.deliveries / self.posts if self.posts else 0.0,
        }


def notify_all(server: ServerProcess, topic: str, count: int, first: int = 0) -> int:
    """``count`` Notifies from 8 concurrent clients (a busy gateway: the background work
    of cluster mode is spread over many Notifies, as it is in production).  Those refused
    with 503 ("retry later": a middleware briefly unreachable on the loaded machine;
    on Kafka every run had some until a client's lost connection stopped counting as an
    outage, docs/adapters/kafka.md) are sent again, up to :data:`RETRIES` times, 1 s
    later; returns how many were sent again (their refusals cost CPU too, so the caller
    reports them)."""
    requests = [
        client.Request(server.broker_url, soap.notify(server.broker_url, topic, seq0=first + i))
        for i in range(count)
    ]
    retried = 0
    for attempt in range(RETRIES + 1):
        # "address" answers a refusal with its fault's texts
        answers, _ = client.run_requests(requests, "address", processes=1, threads=8)
        bad = [(s, why) for s, why in answers if not 200 <= s < 300]
        if not bad:
            return retried
        if attempt == RETRIES or any(s != 503 for s, _ in bad):
            raise RuntimeError(
                f"{len(bad)} of {len(requests)} Notifies refused by {server.base_url}, "
                f"the first with {bad[0][0]}: {bad[0][1]}"
            )
        requests = [r for r, (s, _) in zip(requests, answers, strict=True) if s == 503]
        retried += len(requests)
        time.sleep(1.0)
    raise AssertionError("unreachable")


def subscribe(server: ServerProcess, consumer: str, topic: str, kc: client.KeepAliveClient) -> None:
    """One Subscribe; anything but a 2xx ends the scenario."""
    status, answer = kc.post(server.broker_url, soap.subscribe(server.broker_url, consumer, topic))
    if not 200 <= status < 300:
        raise RuntimeError(f"{status} from {server.base_url}: {soap.fault_summary(answer)}")


class Consumer(Protocol):
    """A push consumer on a loopback port that counts what arrives (``ha.Recorder``)."""

    @property
    def address(self) -> str: ...

    def count(self) -> int: ...

    @property
    def posts(self) -> int:
        """POSTs received so far."""
        ...

    def close(self) -> None: ...


@dataclass(slots=True)
class Instance:
    """One gateway of the comparison, its consumer and what it has used."""

    server: ServerProcess
    recorder: Consumer
    adapter: str
    tally: Tally = field(default_factory=Tally)
    sent: int = 0
    #: with ``WSNMOM_BENCH_HA_THREADS=1``: CPU nanoseconds per thread name of the delivery
    #: rounds less those of the Notify rounds (the per-delivery figure, thread by thread)
    threads: collections.Counter[str] | None = None
    #: thread id -> Python thread name (py-spy), of the threads seen in the rounds
    names: dict[int, str] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        assert self.server.pid is not None
        return self.server.pid

    def delivered(self, expected: int, timeout: float = 120) -> None:
        """Wait until the consumer has ``expected`` messages in all."""
        got = self.recorder.count
        if not wait_until(lambda: got() >= expected, timeout, poll=0.01):
            raise RuntimeError(f"{got()} of {expected} deliveries arrived")

    def warm_up(self, count: int) -> None:
        """Ten subscriptions to the cost topic and ``count`` Notifies to them, delivered
        (connections, caches and lazily made objects exist before the first round)."""
        kc = client.KeepAliveClient()
        for _ in range(FANOUT):
            subscribe(self.server, self.recorder.address, COST_TOPIC, kc)
        kc.close()
        notify_all(self.server, NOBODY_TOPIC, count)
        notify_all(self.server, COST_TOPIC, count)
        self.sent += count
        self.delivered(self.sent * FANOUT)

    def _threads(self) -> collections.Counter[str]:
        """CPU nanoseconds per thread so far, by operating-system thread id (empty unless
        :attr:`threads` is kept); the ids are named once the rounds are over."""
        if self.threads is None:
            return collections.Counter()
        from bench import ha_threads  # it imports this module

        self.names.update(ha_threads.thread_names(self.pid, PYSPY))
        return ha_threads.thread_cpu(self.pid, {})

    def thread_figures(self) -> list[tuple[str, float]]:
        """µs of CPU per delivery by thread name (pool threads as one), most first."""
        from bench import ha_threads  # it imports this module

        assert self.threads is not None
        named: collections.Counter[str] = collections.Counter()
        for tid, ns in self.threads.items():
            number = int(tid.split()[-1])
            named[ha_threads.pool_name(self.names.get(number, tid))] += ns
        deliveries = self.tally.deliveries
        return [(name, ns / 1e3 / deliveries) for name, ns in named.most_common()]

    def round(self, notifies: int, subscribes: int) -> dict[str, float]:
        """One round of the work; returns its figures (ms of CPU, Subscribes/s)."""
        marks = [self._threads()]
        started = process_cpu_seconds(self.pid)
        retried = notify_all(self.server, NOBODY_TOPIC, notifies)
        notify_cpu = process_cpu_seconds(self.pid) - started
        marks.append(self._threads())
        started, posts = process_cpu_seconds(self.pid), self.recorder.posts
        retried += notify_all(self.server, COST_TOPIC, notifies, first=self.sent)
        self.sent += notifies
        self.delivered(self.sent * FANOUT)
        used = process_cpu_seconds(self.pid) - started
        marks.append(self._threads())
        posts = self.recorder.posts - posts
        if self.threads is not None:
            for name in marks[2]:
                nobody = marks[1].get(name, 0) - marks[0].get(name, 0)
                self.threads[name] += marks[2][name] - marks[1].get(name, 0) - nobody
        delivery_cpu = max(0.0, used - notify_cpu)
        kc = client.KeepAliveClient()
        t0 = time.perf_counter()
        for _ in range(subscribes):
            subscribe(self.server, self.recorder.address, IDLE_TOPIC, kc)
        subscribe_s = time.perf_counter() - t0
        kc.close()
        tally = self.tally
        tally.retried += retried
        tally.notify_cpu += notify_cpu
        tally.notifies += notifies
        tally.delivery_cpu += delivery_cpu
        tally.deliveries += notifies * FANOUT
        tally.posts += posts
        tally.subscribe_s += subscribe_s
        tally.subscribes += subscribes
        figures = {
            "notify_ms": notify_cpu * 1000 / notifies,
            "delivery_ms": delivery_cpu * 1000 / (notifies * FANOUT),
            "subscribe_per_s": subscribes / subscribe_s,
            "messages_per_post": notifies * FANOUT / posts if posts else 0.0,
            "load": os.getloadavg()[0],
        }
        tally.rounds.append(figures)
        return figures


def order(round_no: int) -> tuple[str, str]:
    """A B, B A, A B, ...: which instance works first in round ``round_no``."""
    return MODES if round_no % 2 == 0 else (MODES[1], MODES[0])


def compare(
    ctx: Context, instances: dict[str, Instance], notifies: int, subscribes: int, rounds: int
) -> list[dict[str, float]]:
    """Run ``rounds`` interleaved rounds of ``notifies`` Notifies (nobody's, then to the
    ten subscriptions) and ``subscribes`` Subscribes per instance; returns per round the
    ratios cluster / single and the load."""
    for instance in instances.values():
        instance.warm_up(ctx.pick(100, 50, 10))
    if os.environ.get("WSNMOM_BENCH_HA_THREADS") == "1":
        for instance in instances.values():
            instance.threads = collections.Counter()
    ratios: list[dict[str, float]] = []
    for number in range(rounds):
        figures = {mode: instances[mode].round(notifies, subscribes) for mode in order(number)}
        single, cluster = figures["single"], figures["cluster"]
        ratios.append(
            {key: cluster[key] / single[key] if single[key] else float("nan") for key in single}
            | {"load": cluster["load"]}
        )
        ctx.log(
            f"  round {number + 1}: per Notify {cluster['notify_ms']:.3f} / "
            f"{single['notify_ms']:.3f} ms, per delivery {cluster['delivery_ms']:.4f} / "
            f"{single['delivery_ms']:.4f} ms, Subscribe/s {cluster['subscribe_per_s']:.0f} / "
            f"{single['subscribe_per_s']:.0f}, messages per POST "
            f"{cluster['messages_per_post']:.2f} / {single['messages_per_post']:.2f} "
            f"(cluster / single; load {cluster['load']:.1f})"
        )
    for mode, instance in instances.items():
        if instance.threads is not None:
            ctx.log(f"  {mode}, µs of CPU per delivery by thread (delivery rounds less Notify):")
            for name, us in instance.thread_figures():
                if abs(us) >= 0.05:
                    ctx.log(f"    {us:8.2f}  {name}")
    return ratios


def spread(ratios: list[dict[str, float]], key: str) -> str:
    """``min to max over N rounds`` of one per-round ratio."""
    values = [r[key] for r in ratios]
    return f"rounds {min(values):.2f} to {max(values):.2f} over {len(values)}"


def start(
    ctx: Context, mw: Middleware, store: str, mode: str, consumer: Callable[[], Consumer]
) -> Instance:
    """The instance of ``mode``, started: "single" on a SQLite store, "cluster" on
    ``store`` with the default ``[cluster]`` settings (64 shards, 10 s lease, 1 s
    heartbeat)."""
    # a directory per middleware: the single instance's SQLite store of one middleware
    # is refused by the next one's gateway (its records' messages are in the first)
    workdir = ctx.workdir / f"ha-cost-{mode}-{mw.name}"
    adapter = mw.adapter_url(workdir)
    extra = '[cluster]\ninstance_id = "c0"\n' if mode == "cluster" else ""
    server = ServerProcess(adapter, workdir, extra)
    if mode == "cluster":
        server.store_url = store
    instance = Instance(server, consumer(), adapter)
    try:
        server.start()
    except BaseException:
        close(mw, instance)
        raise
    return instance


def close(mw: Middleware, instance: Instance) -> None:
    """Stop the instance and its consumer and release its adapter URL."""
    instance.recorder.close()
    instance.server.stop()
    mw.release(instance.adapter)
