"""Scenario ha: gateway instances sharing one PostgreSQL store, on RabbitMQ, MQTT and
Kafka (docs/scale-out.md).

Two parts:

* **Failover.** Two instances, one shard, one push subscription receiving a
  sequence-numbered stream (20 notifications/s, published through the instance that does
  not deliver).  The deliverer is killed (-9) and started again, several times; each kill
  gives the gap from the kill to the first delivery by the other instance (reported as
  p50/p95/max, target p95 <= lease + 2 s) and the duplicates it caused (at-least-once).
  Every number published must arrive: a loss fails the scenario.
* **Cost of cluster mode** (``bench/scenarios/ha_cost.py``). One instance on a SQLite
  store and one instance on the PostgreSQL store in cluster mode, on the same broker,
  side by side, taking turns round after round (A B B A ...) at the same work: Notifies
  nobody subscribed to (CPU per Notify), Notifies to ten push subscriptions (CPU per
  delivery) and a run of Subscribes (throughput).  CPU is the gateway process's CPU clock
  (nanoseconds, every thread), so the background work of cluster mode (heartbeats, the
  change log) is included.  Target: cluster mode costs at most 15 % more CPU per Notify
  and per delivery.  On MQTT the single instance keeps its subscriptions' queues in
  SQLite, the cluster-mode one in the broker (a persistent session per subscription).
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from bench import client, soap
from bench.middleware import Middleware
from bench.model import Metric, ScenarioResult, Target
from bench.scenarios import ha_cost
from bench.scenarios.base import Context, Scenario
from bench.server import ServerProcess
from bench.util import percentile, wait_until

TOPIC = "ha"
_SEQ = re.compile(rb'seq="(\d+)"')
#: notifications per second of the failover stream
STREAM_RATE = 20.0


class Recorder:
    """A consumer on a free loopback port that records each message's sequence number,
    arrival time and the instance that sent it (``WSNMOM-Instance``)."""

    def __init__(self) -> None:
        self.arrivals: list[tuple[float, str, int]] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return None

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                now = time.monotonic()
                sender = self.headers.get("WSNMOM-Instance", "")
                with outer._lock:
                    outer.arrivals.extend((now, sender, int(s)) for s in _SEQ.findall(body))
                self.send_response(202)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    @property
    def address(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}/consumer"

    def snapshot(self) -> list[tuple[float, str, int]]:
        with self._lock:
            return list(self.arrivals)

    def count(self) -> int:
        with self._lock:
            return len(self.arrivals)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _post(server: ServerProcess, body: bytes, kc: client.KeepAliveClient) -> None:
    status, answer = kc.post(server.broker_url, body)
    if not 200 <= status < 300:
        raise RuntimeError(f"{status} from {server.base_url}: {soap.fault_summary(answer)}")


def _cluster_of(server: ServerProcess) -> dict[str, Any]:
    with urllib.request.urlopen(server.base_url + "/wsn/admin/api/cluster", timeout=5) as answer:
        data: dict[str, Any] = json.load(answer)
    return data


def _store_round_trips(server: ServerProcess) -> float:
    """The mean of ``wsnmom_store_round_trip_seconds`` (0 without cluster mode)."""
    with urllib.request.urlopen(server.base_url + "/metrics", timeout=5) as answer:
        text = answer.read().decode()
    found = dict(
        re.findall(r"^wsnmom_store_round_trip_seconds_(sum|count) (\S+)$", text, re.MULTILINE)
    )
    count = float(found.get("count", 0))
    return float(found.get("sum", 0)) / count if count else 0.0


def _shared_url(mw: Middleware, url: str) -> str:
    """``url`` as every instance of the failover shares it: without a data directory of
    one process (each instance keeps its own: the MQTT adapter's client id is kept there),
    and on RabbitMQ with pull points read by basic.get."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "data_dir"]
    if mw.name == "rabbitmq":
        query.append(("pull", "get"))
    return urlunsplit(parts._replace(query=urlencode(query)))


def _config(instance: str, lease: float) -> str:
    """The ``[cluster]`` table of a failover instance (one shard: one deliverer at a
    time; a heartbeat of 0.5 s, as the tests use)."""
    return (
        f'[cluster]\ninstance_id = "{instance}"\nshards = 1\nlease = {lease:g}\nheartbeat = 0.5\n'
    )


@contextmanager
def _postgres(ctx: Context) -> Iterator[str]:
    """A private PostgreSQL server (the test suite's fixture code) and a fresh database,
    or ``WSNMOM_BENCH_POSTGRES_URL``."""
    from tests.fixtures.postgres import PostgresNode, fresh_database

    with ExitStack() as stack:
        url = os.environ.get("WSNMOM_BENCH_POSTGRES_URL")
        if not url:
            node = PostgresNode()  # its own temporary directory: the postgres user owns it
            node.start()
            stack.callback(node.cleanup)
            url = node.url
        yield stack.enter_context(fresh_database(url))


class HighAvailability(Scenario):
    """Failover gap and duplicates per kill; cluster mode's CPU cost."""

    name = "ha"
    title = "HA: failover after kill -9, and what cluster mode costs against one instance"
    middlewares = ("rabbitmq", "mqtt", "kafka")

    def run(self, ctx: Context, mw: Middleware | None, result: ScenarioResult) -> None:
        assert mw is not None
        with _postgres(ctx) as store:
            self._failover(ctx, mw, store, result)
        with _postgres(ctx) as store:
            self._cost(ctx, mw, store, result)

    # -- failover ------------------------------------------------------------------------
    def _failover(self, ctx: Context, mw: Middleware, store: str, result: ScenarioResult) -> None:
        lease = ctx.pickf(10.0, 3.0)
        kills = ctx.pick(4, 2)
        isolated = mw.adapter_url(ctx.workdir / "ha-failover")
        adapter = _shared_url(mw, isolated)
        servers: dict[str, ServerProcess] = {}
        for name in ("h0", "h1"):
            server = ServerProcess(adapter, ctx.workdir / f"ha-{name}", _config(name, lease))
            server.store_url = store
            servers[name] = server
        recorder = Recorder()
        stop = threading.Event()
        sent: list[int] = []
        gaps: list[float] = []
        try:
            for server in servers.values():
                server.start()
            kc = client.KeepAliveClient()
            _post(
                servers["h0"], soap.subscribe(servers["h0"].broker_url, recorder.address, TOPIC), kc
            )
            owner = self._owner(recorder, servers, kc)
            publishing_via = {"server": servers["h1" if owner == "h0" else "h0"]}

            def publish() -> None:
                pkc = client.KeepAliveClient()
                seq = 0
                while not stop.is_set():
                    seq += 1
                    via = publishing_via["server"]
                    try:
                        _post(via, soap.notify(via.broker_url, TOPIC, seq0=seq), pkc)
                    except Exception:  # the instance asked was killed under the request
                        pkc.close()
                        pkc = client.KeepAliveClient()
                        seq -= 1
                        continue
                    sent.append(seq)
                    stop.wait(1 / STREAM_RATE)

            thread = threading.Thread(target=publish, daemon=True)
            thread.start()
            for _ in range(kills):
                if not wait_until(lambda: recorder.count() > len(sent) // 2 + 5, 20):
                    raise RuntimeError("the stream is not delivered")
                last = recorder.snapshot()[-1]
                owner = last[1]
                other = "h1" if owner == "h0" else "h0"
                publishing_via["server"] = servers[other]
                time.sleep(0.5)  # let the publisher move to the other instance
                killed = time.monotonic()
                servers[owner].kill()

                def taken(survivor: str = other, at: float = killed) -> bool:
                    return any(t > at and who == survivor for t, who, _ in recorder.snapshot())

                if not wait_until(taken, lease + 30, poll=0.01):
                    raise RuntimeError(f"{other} did not take over within {lease + 30:.0f} s")
                first = min(t for t, who, _ in recorder.snapshot() if t > killed and who == other)
                gaps.append(first - killed)
                ctx.log(f"  kill -9 of {owner}: {other} delivered after {gaps[-1]:.2f} s")
                servers[owner].start()

                def rejoined(name: str = owner, asked: str = other) -> bool:
                    seen = _cluster_of(servers[asked])["instances"]
                    return any(i["id"] == name and i["heartbeat_age"] < 1.5 for i in seen)

                wait_until(rejoined, 20)
            stop.set()
            thread.join(10)
            final = sent[-1]
            if not wait_until(lambda: final in {s for _, _, s in recorder.snapshot()}, 60):
                raise RuntimeError(f"message {final}, the last one published, did not arrive")
        finally:
            stop.set()
            recorder.close()
            for server in servers.values():
                server.stop()
            mw.release(isolated)
        counts = Counter(s for _, _, s in recorder.snapshot())
        lost = sorted(set(sent) - set(counts))
        if lost:
            raise RuntimeError(f"{len(lost)} notifications lost across the kills: {lost[:10]}")
        duplicates = sum(n - 1 for n in counts.values() if n > 1)
        result.details.update(
            lease_s=lease, kills=kills, gaps_s=gaps, sent=len(sent), duplicates=duplicates
        )
        note = f"{kills} kills, lease {lease:g} s, heartbeat 0.5 s, 1 shard"
        p95 = percentile(gaps, 95)
        result.add(
            Metric(name="failover_gap_p50_s", value=percentile(gaps, 50), unit="s", note=note)
        )
        result.add(
            Metric(
                name="failover_gap_p95_s",
                value=p95,
                unit="s",
                target=Target("<=", lease + 2, on="value"),
                note=f"lease + 2 s = {lease + 2:g} s",
            )
        )
        result.add(Metric(name="failover_gap_max_s", value=max(gaps), unit="s"))
        result.add(
            Metric(
                name="duplicates_per_kill",
                value=duplicates / kills,
                unit="messages",
                note=f"{duplicates} duplicates of {len(sent)} sent at {STREAM_RATE:g}/s; 0 lost",
            )
        )

    def _owner(
        self, recorder: Recorder, servers: dict[str, ServerProcess], kc: client.KeepAliveClient
    ) -> str:
        _post(servers["h0"], soap.notify(servers["h0"].broker_url, TOPIC, seq0=0), kc)
        if not wait_until(lambda: recorder.count() > 0, 20):
            raise RuntimeError("the first notification was not delivered")
        return recorder.snapshot()[0][1]

    # -- cost ---------------------------------------------------------------------------
    def _cost(self, ctx: Context, mw: Middleware, store: str, result: ScenarioResult) -> None:
        rounds = ctx.pick(8, 6, 2)
        notifies = ctx.pick(500, 200, 20)
        subscribes = ctx.pick(60, 20, 5)
        instances: dict[str, ha_cost.Instance] = {}
        try:
            for mode in ha_cost.MODES:
                instances[mode] = ha_cost.start(ctx, mw, store, mode, Recorder)
            ratios = ha_cost.compare(ctx, instances, notifies, subscribes, rounds)
            trips = _store_round_trips(instances["cluster"].server)
        finally:
            for instance in instances.values():
                ha_cost.close(mw, instance)
        measured = {mode: instances[mode].tally.figures() for mode in ha_cost.MODES}
        for mode, figures in measured.items():
            ctx.log(
                f"  {mode}: {figures['notify_ms']:.3f} ms CPU per Notify, "
                f"{figures['delivery_ms']:.4f} ms per delivery, "
                f"{figures['subscribe_per_s']:.0f} Subscribe/s; "
                f"{figures['retried']:.0f} Notifies sent again after a 503"
            )
        single, cluster = measured["single"], measured["cluster"]
        result.add(
            Metric(
                name="store_heartbeat_ms",
                value=trips * 1000,
                unit="ms",
                note="mean of the cluster heartbeat's transaction in PostgreSQL (informative)",
            )
        )
        result.details.update(
            cost=measured,
            cost_rounds=ratios,
            notifies_per_round=notifies,
            rounds=rounds,
            fanout=ha_cost.FANOUT,
        )
        base = f"one instance on a SQLite store, same {mw.name}, same rounds"
        work = f"{rounds} interleaved rounds of {notifies} Notifies"
        for key, name, unit, target in (
            ("notify_ms", "cpu_per_notify_ms", "ms", True),
            ("delivery_ms", "cpu_per_delivery_ms", "ms", True),
            ("subscribe_per_s", "subscribe_per_s", "req/s", False),
        ):
            result.add(
                Metric(
                    name=name,
                    value=cluster[key],
                    unit=unit,
                    baseline=single[key],
                    baseline_name=base,
                    target=Target("<=", 1.15) if target else None,
                    note=f"cluster mode, PostgreSQL store; {work}; {ha_cost.spread(ratios, key)}"
                    + ("" if target else " (informative)"),
                )
            )
