"""Scenario 2, delivery: notifications/s pushed end to end (Notify in -> middleware -> SOAP
Notify out to a consumer server in another process) for one subscription, then p50/p99
latency at a fixed offered load of 50 % of that maximum.  Last, a drain-only figure
(informative, no target): the subscription is paused, the same count accumulates, and the
time from ResumeSubscription until the consumer has everything measures outbound delivery
alone, without the concurrent ingress.

Baseline: the same count published and consumed with the middleware's raw client in the
same run (``Middleware.raw_roundtrip``: pika for RabbitMQ, the embedded adapter's own
publish/consume API for embedded), once before and once after; the better one counts.
Targets: throughput/raw >= 0.25; p99 <= 50 ms.
"""

from __future__ import annotations

import time

from bench import client, cpus, soap
from bench.consumer import ConsumerProcess
from bench.load import run_paced
from bench.middleware import Middleware
from bench.model import Metric, ScenarioResult, Target
from bench.scenarios.base import Context, Scenario, check_notify, running_server, subscribe_all
from bench.util import percentile, wait_until

TOPIC = "delivery"


class Delivery(Scenario):
    """End-to-end push throughput and latency at half load."""

    name = "delivery"
    title = "Delivery: end-to-end push notifications/s and latency"

    def run(self, ctx: Context, mw: Middleware | None, result: ScenarioResult) -> None:
        assert mw is not None
        count = ctx.pick(5000, 300)
        paced_s = ctx.pickf(10.0, 3.0)
        body = soap.payload(0, "0", 64).encode()
        raw_dir = ctx.workdir / f"raw-{mw.name}"
        with cpus.on_server_cpus():
            raws = [mw.raw_roundtrip(count, body, raw_dir)]
        ctx.log(f"  raw {mw.name}: {raws[0]['msgs_per_s']:,.0f} msg/s")
        result.details.update(count=count, paced_duration_s=paced_s)
        consumer = ConsumerProcess().start()
        try:
            with running_server(ctx, mw, "delivery") as server:
                check_notify(server, TOPIC)
                refs, secs = subscribe_all(server, [consumer.base_url + "/c/0"], [TOPIC])
                result.setup["subscribe_s"] = secs
                # warm-up: the first deliveries open connections, fill caches
                warm = [
                    client.Request(server.broker_url, soap.notify(server.broker_url, TOPIC))
                    for _ in range(50)
                ]
                client.run_requests(warm, processes=1)
                wait_until(lambda: consumer.stats()["messages"] >= 50, 30)
                time.sleep(0.5)
                consumer.reset()
                reqs = [
                    client.Request(server.broker_url, soap.notify(server.broker_url, TOPIC, seq0=i))
                    for i in range(count)
                ]
                started = time.time()
                answers, send_s = client.run_requests(reqs, processes=2, threads=8)
                accepted = sum(1 for status, _ in answers if 200 <= status < 300)
                complete = wait_until(lambda: consumer.stats()["messages"] >= accepted, 300, 0.05)
                stats = consumer.stats()
                last = stats["last"] or time.time()
                elapsed = last - started
                rate = stats["messages"] / elapsed if elapsed > 0 else 0.0
                # the raw baseline again, after: the better of the two counts
                with cpus.on_server_cpus():
                    raws.append(mw.raw_roundtrip(count, body, raw_dir))
                raw = max(raws, key=lambda r: r["msgs_per_s"])
                result.details["raw"] = raws
                ctx.log(
                    f"  {mw.name}: {stats['messages']}/{accepted} delivered in {elapsed:.2f}s "
                    f"= {rate:,.0f} msg/s in {stats['requests']} outbound Notifies "
                    f"(ingress took {send_s:.2f}s)"
                )
                result.add(
                    Metric(
                        name="push_throughput",
                        value=rate,
                        unit="msg/s",
                        baseline=raw["msgs_per_s"],
                        baseline_name=f"raw {mw.name} client publish+consume",
                        target=Target(">=", 0.25),
                        note=None if complete else f"only {stats['messages']}/{accepted} delivered",
                    )
                )
                result.details.update(
                    accepted=accepted,
                    delivered=stats["messages"],
                    outbound_notifies=stats["requests"],
                    ingress_s=send_s,
                )
                # fixed offered load at 50 % of the measured maximum
                offered = max(1.0, rate * 0.5)
                time.sleep(1.0)
                consumer.reset()
                template = soap.notify(server.broker_url, TOPIC, ts=soap.TS_MARK)
                paced = run_paced(server.broker_url, template, offered, paced_s)
                sent = int(paced["sent"] - paced["errors"])
                wait_until(lambda: consumer.stats()["messages"] >= sent, 60, 0.1)
                lat = consumer.stats(latency=True)["latencies_ms"]
                p50, p99 = percentile(lat, 50), percentile(lat, 99)
                ctx.log(
                    f"  {mw.name} at {offered:,.0f} msg/s offered: p50 {p50 or 0:.1f} ms, "
                    f"p99 {p99 or 0:.1f} ms ({len(lat)}/{sent} delivered, {paced['late']} late)"
                )
                result.add(
                    Metric(
                        name="latency_p50_half_load",
                        value=p50,
                        unit="ms",
                        note=f"offered {offered:,.0f} msg/s",
                    )
                )
                result.add(
                    Metric(
                        name="latency_p99_half_load",
                        value=p99,
                        unit="ms",
                        target=Target("<=", 50.0, on="value"),
                        note=f"offered {offered:,.0f} msg/s",
                    )
                )
                result.details.update(
                    offered_rate=offered,
                    paced=paced,
                    latency_delivered=len(lat),
                    latencies_ms=sorted(lat)[:: max(1, len(lat) // 2000)],
                )
                self._drain_only(ctx, mw, server.broker_url, refs[0], consumer, count, raw, result)
        finally:
            consumer.stop()

    def _drain_only(
        self,
        ctx: Context,
        mw: Middleware,
        broker_url: str,
        subscription: str,
        consumer: ConsumerProcess,
        count: int,
        raw: dict[str, float],
        result: ScenarioResult,
    ) -> None:
        """Backlog first (paused), then time the delivery of all of it after resume."""
        time.sleep(1.0)
        consumer.reset()
        pause = client.run_requests([client.Request(subscription, soap.pause(subscription))])
        if pause[0][0][0] != 200:
            raise RuntimeError(f"PauseSubscription failed: {pause[0][0]}")
        reqs = [
            client.Request(broker_url, soap.notify(broker_url, TOPIC, seq0=i)) for i in range(count)
        ]
        answers, _ = client.run_requests(reqs, processes=2, threads=8)
        accepted = sum(1 for status, _ in answers if 200 <= status < 300)
        time.sleep(0.5)
        held = consumer.stats()["messages"]
        started = time.time()
        client.run_requests([client.Request(subscription, soap.resume(subscription))])
        complete = wait_until(lambda: consumer.stats()["messages"] >= accepted, 300, 0.05)
        stats = consumer.stats()
        elapsed = (stats["last"] or time.time()) - started
        rate = stats["messages"] / elapsed if elapsed > 0 else 0.0
        ctx.log(
            f"  {mw.name} drain-only: {stats['messages']}/{accepted} delivered in "
            f"{elapsed:.2f}s after resume = {rate:,.0f} msg/s ({held} arrived while paused)"
        )
        result.add(
            Metric(
                name="push_drain_throughput",
                value=rate,
                unit="msg/s",
                baseline=raw["msgs_per_s"],
                baseline_name=f"raw {mw.name} client publish+consume",
                note="backlog delivered after resume; informative, no target"
                + ("" if complete else f"; only {stats['messages']}/{accepted} delivered"),
            )
        )
