"""Scenario 8, isolation: a healthy consumer's push latency while 100 other consumers never
answer.

One gateway, one healthy consumer server (``bench.consumer``) subscribed to its topic, and
100 tarpit consumers (``bench.tarpit``: loopback ports that complete TCP connections and
never answer) each subscribed to another topic.  First the healthy consumer's latency alone:
paced 1-message Notifies to its topic at a fixed rate, latency = arrival - intended send
time (as in the delivery scenario).  Then one Notify to the tarpits' topic, which leaves a
delivery hanging in each of them (they hold the gateway's threads for its whole
``retry.timeout``, 10 s), and the same paced load again while they hang.

Target: the healthy consumer's p99 with the tarpits <= 2 x its p99 without them (same
gateway, same rate, same run).
"""

from __future__ import annotations

import time
import urllib.request

from bench import soap
from bench.consumer import ConsumerProcess
from bench.load import run_paced
from bench.middleware import Middleware
from bench.model import Metric, ScenarioResult, Target
from bench.scenarios.base import Context, Scenario, check_notify, running_server, subscribe_all
from bench.scenarios.delivery import warm_up
from bench.tarpit import Tarpits
from bench.util import percentile, wait_until

TOPIC = "delivery"  # warm_up() sends to the delivery scenario's topic
PIT_TOPIC = "tarpit"
TARPITS = 100


#: seconds to wait for the healthy consumer's last notifications after a paced run
PATIENCE = 30.0


def _latencies(
    broker_url: str, consumer: ConsumerProcess, rate: float, seconds: float
) -> tuple[list[float], int, int]:
    """Paced Notifies to the healthy topic; (latencies in ms, notifications sent, how many
    of them never arrived).  A notification still missing after ``PATIENCE`` seconds counts
    with the time waited since the load ended, a lower bound of its latency."""
    consumer.reset()
    template = soap.notify(broker_url, TOPIC, ts=soap.TS_MARK)
    paced = run_paced(broker_url, template, rate, seconds)
    ended = time.monotonic()
    sent = int(paced["sent"] - paced["errors"])
    wait_until(lambda: consumer.stats()["messages"] >= sent, PATIENCE, 0.1)
    latencies = list(consumer.stats(latency=True)["latencies_ms"])
    missing = max(0, sent - len(latencies))
    latencies += [(time.monotonic() - ended) * 1000.0] * missing
    return latencies, sent, missing


def _threads(base_url: str) -> float | None:
    """The gateway's push delivery threads, from ``/metrics``."""
    try:
        with urllib.request.urlopen(base_url + "/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("wsnmom_delivery_threads "):
            return float(line.split()[1])
    return None


class Isolation(Scenario):
    """A healthy consumer's p99 latency with and without 100 tarpit consumers."""

    name = "isolation"
    title = "Isolation: a healthy consumer's latency while 100 consumers never answer"
    middlewares = ("embedded",)

    def run(self, ctx: Context, mw: Middleware | None, result: ScenarioResult) -> None:
        assert mw is not None
        rate = float(ctx.pick(200, 100))
        seconds = ctx.pickf(8.0, 3.0)
        result.details.update(rate=rate, seconds=seconds, tarpits=TARPITS)
        consumer = ConsumerProcess().start()
        pits = Tarpits(TARPITS)
        try:
            with running_server(ctx, mw, "isolation") as server:
                check_notify(server, TOPIC)
                _, secs = subscribe_all(
                    server,
                    [consumer.base_url + "/c/0", *pits.addresses()],
                    [TOPIC] + [PIT_TOPIC] * TARPITS,
                )
                result.setup["subscribe_s"] = secs
                warm_up(server.broker_url, consumer)
                alone, sent_alone, lost_alone = _latencies(
                    server.broker_url, consumer, rate, seconds
                )
                check_notify(server, PIT_TOPIC)
                hanging = wait_until(lambda: pits.connections() >= TARPITS, 10, 0.05)
                stuck = pits.connections()
                started = time.monotonic()
                with_pits, sent_with, lost_with = _latencies(
                    server.broker_url, consumer, rate, seconds
                )
                # the tarpits' deliveries hang for the gateway's 10 s retry.timeout
                within_timeout = bool(lost_with) or time.monotonic() - started < 10.0
                threads = _threads(server.base_url)
                pits.close()  # the hanging deliveries fail now: the gateway stops at once
        finally:
            pits.close()
            consumer.stop()
        p99_alone, p99_with = percentile(alone, 99), percentile(with_pits, 99)
        p50_alone, p50_with = percentile(alone, 50), percentile(with_pits, 50)
        ctx.log(
            f"  healthy consumer at {rate:,.0f} msg/s: p50/p99 {p50_alone or 0:.1f}/"
            f"{p99_alone or 0:.1f} ms alone, {p50_with or 0:.1f}/{p99_with or 0:.1f} ms with "
            f"{stuck} deliveries hanging in {TARPITS} tarpits ({threads or 0:.0f} threads)"
        )
        notes = []
        if not hanging:
            notes.append(f"only {stuck} of {TARPITS} tarpits had a delivery hanging")
        if not within_timeout:
            notes.append("the measurement outlasted the tarpits' 10 s timeout")
        if lost_alone or lost_with:
            notes.append(
                f"{lost_alone}/{sent_alone} alone and {lost_with}/{sent_with} with the tarpits "
                f"not delivered within {PATIENCE:g} s (counted with the time waited)"
            )
        result.add(
            Metric(
                name="healthy_p99_with_tarpits",
                value=p99_with,
                unit="ms",
                baseline=p99_alone,
                baseline_name="the healthy consumer's p99 without tarpits (same gateway, "
                "same rate)",
                target=Target("<=", 2.0),
                note="; ".join(notes) or None,
            )
        )
        result.add(
            Metric(
                name="healthy_p50_with_tarpits",
                value=p50_with,
                unit="ms",
                baseline=p50_alone,
                baseline_name="the healthy consumer's p50 without tarpits",
                note="informative, no target",
            )
        )
        result.details.update(
            tarpit_connections=stuck,
            delivery_threads=threads,
            sent_alone=sent_alone,
            sent_with_tarpits=sent_with,
            latencies_alone_ms=sorted(alone)[:: max(1, len(alone) // 1000)],
            latencies_with_tarpits_ms=sorted(with_pits)[:: max(1, len(with_pits) // 1000)],
        )
