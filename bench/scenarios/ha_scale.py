"""Scenario ha-scale: failover with many push subscriptions (docs/scale-out.md, "Failover").

Three instances on one PostgreSQL store and one RabbitMQ or Kafka (64 shards, 3 s lease,
0.5 s heartbeat), ``N`` push subscriptions on one topic (2,000; 300 with ``--quick``;
``WSNMOM_BENCH_HA_SUBSCRIPTIONS`` sets it), spread over eight consumer ports of the
bench process.  Subscribes are sent 8 at a time, 200 at a time, each 200 followed by
every instance before the next; one refused with 503 (retry later) is sent again.  A
first Notify tells which instance delivers each subscription; then the instance
delivering most is killed (-9) and a Notify is published every :data:`PROBE_EVERY`
seconds through the other two.  For each subscription of the
dead instance, the gap is the time from the kill to its first delivery by another
instance; the scenario reports p50/p95/max of those gaps, when the survivors took the
dead instance's shards (their logs: the lease's part of the gap), the duplicates (a
message delivered twice to one subscription) and the losses (every probe must reach every
subscription: a loss fails the scenario).
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
from collections import Counter

from bench import client, soap, takeover_stages
from bench.ha_rig import Post, Posts, takes
from bench.ha_rig import postgres as _postgres
from bench.middleware import Middleware
from bench.model import Metric, ScenarioResult, Target
from bench.scenarios.base import Context, Scenario
from bench.server import ServerProcess
from bench.util import percentile, wait_until

TOPIC = "ha-scale"
LEASE = 3.0
#: seconds between two probes after the kill.  The first is published right after the
#: kill: it waits in every queue, so a subscription's first delivery elsewhere comes as
#: soon as its delivery is opened.  (Every 0.5 s, 2,000 subscriptions made 4,000
#: deliveries/s for the two survivors, whose backlog then made the gap: 34 s p50.)
PROBE_EVERY = 5.0
#: Subscribes sent before waiting for every instance to follow them
BATCH = 200
#: times a Subscribe refused with 503 is sent again, and seconds before each time
RETRIES = 10
RETRY_AFTER = 2.0
#: consumer ports (each a destination of its own: the gateways' per-destination limit)
PORTS = 8


class PathRecorder:
    """Consumers on :data:`PORTS` free loopback ports recording, per delivery, when it
    arrived, the path (the subscription), the instance that sent it and the sequence
    numbers it carried."""

    def __init__(self) -> None:
        self.arrivals: list[tuple[float, str, str, tuple[int, ...]]] = []
        self._lock = threading.Lock()
        self._posts = Posts(self._record, PORTS)

    def _record(self, post: Post) -> None:
        with self._lock:
            self.arrivals.append((post.at, post.path, post.sender, post.seqs))

    def address(self, i: int) -> str:
        return self._posts.address(i, f"/s{i}")

    def snapshot(self) -> list[tuple[float, str, str, tuple[int, ...]]]:
        with self._lock:
            return list(self.arrivals)

    def close(self) -> None:
        self._posts.close()


def _config(instance: str) -> str:
    return (
        f'[cluster]\ninstance_id = "{instance}"\nshards = 64\nlease = {LEASE:g}\nheartbeat = 0.5\n'
    )


def _subscribe(requests: list[client.Request]) -> int:
    """Send the Subscribes 8 at a time; those refused with 503 ("retry later": RabbitMQ
    closes a connection with INTERNAL_ERROR when a quorum queue does not answer in time,
    as on a loaded broker) are sent again, up to :data:`RETRIES` times.  Returns how
    many were sent again."""
    retried = 0
    for attempt in range(RETRIES + 1):
        answers, _ = client.run_requests(requests, processes=1, threads=8)
        bad = [status for status, _ in answers if not 200 <= status < 300 and status != 503]
        if bad:
            raise RuntimeError(f"{len(bad)} Subscribes refused: {bad[:3]}")
        requests = [r for r, (status, _) in zip(requests, answers, strict=True) if status == 503]
        if not requests:
            return retried
        if attempt < RETRIES:
            retried += len(requests)
            time.sleep(RETRY_AFTER)  # the instances reconnect meanwhile (/readyz says 503)
    raise RuntimeError(f"{len(requests)} Subscribes still refused (503) after {RETRIES} retries")


def _known(server: ServerProcess) -> int:
    """How many subscriptions the instance knows (admin API)."""
    url = server.base_url + "/wsn/admin/api/subscriptions?limit=1"
    with urllib.request.urlopen(url, timeout=30) as answer:
        return int(json.load(answer)["count"])


def _dump(servers: dict[str, ServerProcess], ctx: Context) -> None:
    """Each live instance's view of the subscriptions (admin API), into the work
    directory, for a failure's story."""
    for name, server in servers.items():
        if server.pid is None:
            continue
        url = server.base_url + "/wsn/admin/api/subscriptions?limit=100000"
        try:
            with urllib.request.urlopen(url, timeout=30) as answer:
                (ctx.workdir / f"ha-scale-{name}.json").write_bytes(answer.read())
        except Exception as exc:
            ctx.log(f"  {name}: no subscription list ({exc})")


class HighAvailabilityAtScale(Scenario):
    """Failover gap (p50/p95/max) with thousands of push subscriptions."""

    name = "ha-scale"
    title = "HA at scale: failover after kill -9 with thousands of push subscriptions"
    middlewares = ("rabbitmq", "kafka")

    def run(self, ctx: Context, mw: Middleware | None, result: ScenarioResult) -> None:
        assert mw is not None
        count = int(os.environ.get("WSNMOM_BENCH_HA_SUBSCRIPTIONS") or ctx.pick(2000, 300))
        with _postgres(ctx) as store:
            self._failover(ctx, mw, store, count, result)

    def _failover(
        self, ctx: Context, mw: Middleware, store: str, count: int, result: ScenarioResult
    ) -> None:
        isolated = mw.adapter_url(ctx.workdir / "ha-scale")
        adapter = isolated
        if mw.name == "rabbitmq":
            adapter += ("&" if "?" in isolated else "?") + "pull=get"
        servers: dict[str, ServerProcess] = {}
        for name in ("s0", "s1", "s2"):
            server = ServerProcess(adapter, ctx.workdir / f"ha-scale-{name}", _config(name))
            server.store_url = store
            # INFO: the survivors' "took shards" lines time the takeover (``ha_rig.takes``)
            text = server.config.read_text().replace('log_level = "WARNING"', 'log_level = "INFO"')
            server.config.write_text(text)
            servers[name] = server
        recorder = PathRecorder()
        try:
            for server in servers.values():
                server.start()
            names = list(servers)
            retried = 0
            t0 = time.perf_counter()
            for start in range(0, count, BATCH):
                requests = [
                    client.Request(
                        servers[names[i % 3]].broker_url,
                        soap.subscribe(
                            servers[names[i % 3]].broker_url, recorder.address(i), TOPIC
                        ),
                    )
                    for i in range(start, min(count, start + BATCH))
                ]
                retried += _subscribe(requests)
                made = min(count, start + BATCH)
                # every instance followed them (each loads what the others made, one
                # middleware declaration each, on the thread that also renews its leases)
                if not wait_until(
                    lambda made=made: all(_known(s) >= made for s in servers.values()), 300
                ):
                    raise RuntimeError(f"the instances did not follow {made} subscriptions")
            ctx.log(
                f"  {count} subscriptions in {time.perf_counter() - t0:.1f} s "
                f"({retried} Subscribes sent again after a 503)"
            )
            kc = client.KeepAliveClient()
            seq = 0

            def probe(via: ServerProcess) -> None:
                nonlocal seq
                seq += 1
                status, answer = kc.post(
                    via.broker_url, soap.notify(via.broker_url, TOPIC, seq0=seq)
                )
                if not 200 <= status < 300:
                    raise RuntimeError(f"Notify: {status} {soap.fault_summary(answer)}")

            probe(servers["s0"])
            paths = {f"/s{i}" for i in range(count)}

            def first_round() -> dict[str, str] | None:
                seen = {p: who for _, p, who, seqs in recorder.snapshot() if 1 in seqs}
                return seen if set(seen) >= paths else None

            if not wait_until(lambda: first_round() is not None, 300):
                _dump(servers, ctx)
                raise RuntimeError("the first Notify did not reach every subscription")
            deliverer = first_round()
            assert deliverer is not None
            per = Counter(deliverer.values())
            victim = per.most_common(1)[0][0]
            theirs = {p for p, who in deliverer.items() if who == victim}
            survivors = [servers[n] for n in names if n != victim]
            ctx.log(f"  deliverers: {dict(per)}; killing {victim}")
            # the survivors' take-over histograms before: the difference after is this kill's
            stages_before = [takeover_stages.scrape(s.base_url) for s in survivors]
            killed_wall, killed = time.time(), time.monotonic()
            load_at_kill = os.getloadavg()
            servers[victim].kill()
            gaps: dict[str, float] = {}
            deadline = killed + LEASE + 120
            turn = 0
            while time.monotonic() < deadline:
                probe(survivors[turn % 2])
                turn += 1
                for at, path, who, _ in recorder.snapshot():
                    if path in theirs and at > killed and who != victim and path not in gaps:
                        gaps[path] = at - killed
                if len(gaps) == len(theirs):
                    break
                time.sleep(PROBE_EVERY)
            if len(gaps) < len(theirs):
                _dump(servers, ctx)
                raise RuntimeError(f"{len(theirs) - len(gaps)} subscriptions never taken over")
            probe(survivors[0])
            final = seq
            live = paths

            def everything() -> bool:
                got: dict[str, set[int]] = {}
                for _, path, _, seqs in recorder.snapshot():
                    got.setdefault(path, set()).update(seqs)
                return all(got.get(p, set()) >= set(range(1, final + 1)) for p in live)

            if not wait_until(everything, 120):
                raise RuntimeError("probes lost across the kill")
            stages = takeover_stages.since(
                [takeover_stages.scrape(s.base_url) for s in survivors], stages_before
            )
            taken = [at for s in survivors for at, _ in takes(s) if at > killed_wall]
            shards_after = (max(taken) - killed_wall) if taken else float("nan")
            kc.close()
        finally:
            recorder.close()
            for server in servers.values():
                server.stop()
            mw.release(isolated)
        counts = Counter((path, s) for _, path, _, seqs in recorder.snapshot() for s in seqs)
        duplicates = sum(n - 1 for n in counts.values() if n > 1)
        values = sorted(gaps.values())
        note = (
            f"{count} subscriptions over 3 instances, {len(theirs)} on the killed one; "
            f"lease {LEASE:g} s, heartbeat 0.5 s, 64 shards"
        )
        result.details.update(
            subscriptions=count,
            killed_subscriptions=len(theirs),
            gaps_s=values,
            shards_taken_after_s=shards_after,
            probes=final,
            duplicates=duplicates,
            load_average_at_kill=[round(x, 2) for x in load_at_kill],
            load_average_after=[round(x, 2) for x in os.getloadavg()],
        )
        ctx.log(
            f"  gap p50 {percentile(values, 50):.2f} p95 {percentile(values, 95):.2f} "
            f"max {values[-1]:.2f} s; shards taken after {shards_after:.2f} s; "
            f"{duplicates} duplicates; load average {load_at_kill[0]:.1f} at the kill, "
            f"{os.getloadavg()[0]:.1f} after"
        )
        result.add(
            Metric(name="failover_gap_p50_s", value=percentile(values, 50), unit="s", note=note)
        )
        result.add(
            Metric(
                name="failover_gap_p95_s",
                value=percentile(values, 95),
                unit="s",
                target=Target("<=", LEASE + 2, on="value"),
                note=f"lease + 2 s = {LEASE + 2:g} s",
            )
        )
        result.add(Metric(name="failover_gap_max_s", value=values[-1], unit="s"))
        self._stages(ctx, stages, result)
        result.add(
            Metric(
                name="shards_taken_after_s",
                value=shards_after,
                unit="s",
                note="kill to the survivors' last 'took shards' log line (informative)",
            )
        )
        result.add(
            Metric(
                name="duplicates_per_kill",
                value=float(duplicates),
                unit="messages",
                note=f"{final} probes to every subscription; 0 lost",
            )
        )

    def _stages(
        self, ctx: Context, stages: takeover_stages.Buckets, result: ScenarioResult
    ) -> None:
        """Report where the survivors' time went, stage by stage (seconds from the take
        of a subscription's shard; ``core.takeover_timing``)."""
        breakdown: dict[str, dict[str, float | int | None]] = {}
        parts = []
        for stage in takeover_stages.STAGES:
            p50 = takeover_stages.quantile(stages, stage, 50)
            p95 = takeover_stages.quantile(stages, stage, 95)
            n = takeover_stages.count(stages, stage)
            breakdown[stage] = {"count": n, "p50_s": p50, "p95_s": p95}
            if p95 is None:
                continue
            parts.append(f"{stage} {p50:.1f}/{p95:.1f}")
            result.add(
                Metric(
                    name=f"takeover_{stage}_p95_s",
                    value=p95,
                    unit="s",
                    note=f"take of the shard to '{stage}' of the first delivery, p95 over "
                    f"{n} subscriptions (bucket bound, 0.1 s)",
                )
            )
        result.details.update(takeover_stages_s=breakdown)
        ctx.log("  after the take, p50/p95 s: " + ", ".join(parts))
