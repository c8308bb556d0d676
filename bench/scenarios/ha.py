"""Scenario ha: gateway instances sharing one PostgreSQL store, on RabbitMQ, MQTT and
Kafka (docs/scale-out.md).

Two parts:

* **Failover** (``bench/ha_failover.py``). Two instances, one shard, one push
  subscription receiving a sequence-numbered stream (20 notifications/s, published through
  the instance that does not deliver), at the default lease (10 s) and heartbeat (1 s);
  ``--quick`` at 3 s and 0.5 s.  The deliverer is hit, one event after the other: kill -9
  (then started again; 4 times), SIGTERM (then started again; twice) and SIGSTOP for 20 s
  then SIGCONT (twice).  Each event gives the gap from the signal to the first delivery by
  the other instance (p50/p95/max per kind; targets: p95 <= lease + 2 s for kill -9 and
  SIGSTOP, <= 2 s for SIGTERM) and the duplicates until the next event.  A loss, a
  delivery by the stopped instance of a number published after its stop (while it did not
  hold the shard) or a SIGTERM exit status other than 0 fails the scenario.
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

import os
import re
import signal
import urllib.request
from collections import Counter

from bench import ha_failover
from bench.ha_rig import Recorder, cluster_config, shared_url
from bench.ha_rig import postgres as _postgres
from bench.middleware import Middleware
from bench.model import Metric, ScenarioResult, Target
from bench.scenarios import ha_cost
from bench.scenarios.base import Context, Scenario
from bench.server import ServerProcess
from bench.util import percentile

#: the ``[cluster]`` defaults (core/config_model.py) the full run keeps
DEFAULT_LEASE = 10.0
DEFAULT_HEARTBEAT = 1.0
PARTS = ("failover", "cost")


def _parts() -> tuple[str, ...]:
    """The parts to run: ``WSNMOM_BENCH_HA=failover`` (or ``cost``) runs one of them (a
    shorter run when only that figure is being worked on); default both."""
    wanted = os.environ.get("WSNMOM_BENCH_HA", ",".join(PARTS)).split(",")
    parts = tuple(p for p in PARTS if p in wanted)
    if not parts:
        raise RuntimeError(f"WSNMOM_BENCH_HA={wanted!r}: expected failover, cost or both")
    return parts


def _store_round_trips(server: ServerProcess) -> float:
    """The mean of ``wsnmom_store_round_trip_seconds`` (0 without cluster mode)."""
    with urllib.request.urlopen(server.base_url + "/metrics", timeout=5) as answer:
        text = answer.read().decode()
    found = dict(
        re.findall(r"^wsnmom_store_round_trip_seconds_(sum|count) (\S+)$", text, re.MULTILINE)
    )
    count = float(found.get("count", 0))
    return float(found.get("sum", 0)) / count if count else 0.0


class HighAvailability(Scenario):
    """Failover gap and duplicates per kill -9, SIGTERM and SIGSTOP; cluster mode's CPU cost."""

    name = "ha"
    title = (
        "HA: failover after kill -9, SIGTERM and SIGSTOP, "
        "and what cluster mode costs against one instance"
    )
    middlewares = ("rabbitmq", "mqtt", "kafka")

    def run(self, ctx: Context, mw: Middleware | None, result: ScenarioResult) -> None:
        assert mw is not None
        parts = _parts()
        if "failover" in parts:
            with _postgres(ctx) as store:
                self._failover(ctx, mw, store, result)
        if "cost" in parts:
            with _postgres(ctx) as store:
                self._cost(ctx, mw, store, result)

    # -- failover ------------------------------------------------------------------------
    def _failover(self, ctx: Context, mw: Middleware, store: str, result: ScenarioResult) -> None:
        # the defaults (lease 10 s, heartbeat 1 s) in full runs; 3 s and 0.5 s with --quick
        lease, heartbeat = (None, None) if not ctx.quick else (3.0, 0.5)
        plan = (
            ["kill"] * ctx.pick(4, 2, 1)
            + ["term"] * ctx.pick(2, 1, 1)
            + ["stop"] * ctx.pick(2, 1, 1)
        )
        isolated = mw.adapter_url(ctx.workdir / f"ha-failover-{mw.name}")
        adapter = shared_url(mw, isolated)
        if heartbeat is not None and mw.name == "rabbitmq":
            # a lease of 3 s needs an AMQP heartbeat of at most a third of it, or a
            # stopped instance's consumer stays the active one for 6 to 9 s
            # (docs/scale-out.md, RabbitMQ's settings); the tests run it so too
            adapter += "&heartbeat=1" if "?" in adapter else "?heartbeat=1"
        servers: dict[str, ServerProcess] = {}
        for name in ("h0", "h1"):
            server = ServerProcess(
                adapter,
                ctx.workdir / f"ha-{name}-{mw.name}",
                cluster_config(name, lease, heartbeat),
            )
            server.store_url = store
            # INFO: a stopped instance's "took shards" lines tell a stray delivery from
            # one it may make (ha_failover._resume)
            text = server.config.read_text().replace('log_level = "WARNING"', 'log_level = "INFO"')
            server.config.write_text(text)
            servers[name] = server
        recorder = Recorder()
        load = [os.getloadavg()[0]]
        try:
            for server in servers.values():
                server.start()
            events, sent = ha_failover.run(
                servers,
                recorder,
                plan,
                lease or DEFAULT_LEASE,
                heartbeat or DEFAULT_HEARTBEAT,
                ctx.log,
            )
        finally:
            recorder.close()
            for server in servers.values():
                server.signal(signal.SIGCONT)  # a failure may have left one stopped
                server.stop()
            mw.release(isolated)
        load.append(os.getloadavg()[0])
        counts = Counter(s for _, _, s in recorder.snapshot())
        lost = sorted(set(sent) - set(counts))
        if lost:
            raise RuntimeError(f"{len(lost)} notifications lost across the events: {lost[:10]}")
        self._report(ctx, events, sent, lease or DEFAULT_LEASE, heartbeat, load, result)

    def _report(
        self,
        ctx: Context,
        events: list[ha_failover.Event],
        sent: list[int],
        lease: float,
        heartbeat: float | None,
        load: list[float],
        result: ScenarioResult,
    ) -> None:
        """Gap p50/p95/max and duplicates per event of each kind (kill -9 keeps the
        metric names of the scenario's first version)."""
        result.details.update(
            lease_s=lease,
            heartbeat_s=heartbeat or DEFAULT_HEARTBEAT,
            sent=len(sent),
            load_average=load,
            events=[
                {
                    "kind": e.kind,
                    "victim": e.victim,
                    "gap_s": round(e.gap, 3),
                    "duplicates": e.duplicates,
                    "stray": e.stray,
                    "rejoined_after_s": e.rejoined_after,
                }
                for e in events
            ],
        )
        beat = heartbeat or DEFAULT_HEARTBEAT
        which = "the defaults" if heartbeat is None else "--quick"
        base = f"lease {lease:g} s, heartbeat {beat:g} s ({which}), 1 shard"
        for kind, prefix, bound, what in (
            ("kill", "failover_gap", lease + 2, "lease + 2 s"),
            ("term", "term_gap", 2.0, "hand-over within 2 s"),
            ("stop", "stop_gap", lease + 2, "lease + 2 s"),
        ):
            mine = [e for e in events if e.kind == kind]
            if not mine:
                continue
            gaps = [e.gap for e in mine]
            dups = sum(e.duplicates for e in mine)
            extra = f"; stopped {ha_failover.STOPPED:g} s, 0 stray" if kind == "stop" else ""
            result.add(
                Metric(
                    name=f"{prefix}_p50_s",
                    value=percentile(gaps, 50),
                    unit="s",
                    note=f"{len(mine)} x {kind}; {base}{extra}",
                )
            )
            result.add(
                Metric(
                    name=f"{prefix}_p95_s",
                    value=percentile(gaps, 95),
                    unit="s",
                    target=Target("<=", bound, on="value"),
                    note=f"{what} = {bound:g} s",
                )
            )
            result.add(Metric(name=f"{prefix}_max_s", value=max(gaps), unit="s"))
            name = "duplicates_per_kill" if kind == "kill" else f"duplicates_per_{kind}"
            result.add(
                Metric(
                    name=name,
                    value=dups / len(mine),
                    unit="messages",
                    note=f"{dups} duplicates; {len(sent)} sent at {ha_failover.STREAM_RATE:g}/s "
                    "over every event; 0 lost",
                )
            )
            ctx.log(f"  {kind}: gaps {', '.join(f'{g:.2f}' for g in gaps)} s; {dups} duplicates")

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
                f"{figures['delivery_ms']:.4f} ms per delivery "
                f"({figures['messages_per_post']:.2f} messages per POST), "
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
