"""Scenario 8, isolation: a healthy consumer's push latency while other subscriptions
attack the gateway's shared delivery resources.

One gateway, one healthy consumer server (``bench.consumer``) subscribed to its topic with
a cheap MessageContent filter (so that it, too, needs the filter processes).  First the
healthy consumer's latency alone: paced 1-message Notifies to its topic at a fixed rate,
latency = arrival - intended send time (as in the delivery scenario).  Then the same paced
load again in each of three cases (issue 22):

* **tarpits**: 100 tarpit consumers (``bench.tarpit``: loopback ports that complete TCP
  connections and never answer), each on a loopback host of its own (127.0.1.x), each
  subscribed to another topic; one Notify there leaves a delivery hanging in each of them
  for the gateway's whole ``retry.timeout`` (10 s);
* **many ports**: 100 more tarpits, all on one host (127.0.0.2), each its own port: each
  is a destination of its own, so only the host's lane (``delivery.per_host``) holds them;
* **filter pool**: 20 subscriptions whose MessageContent filter takes about 0.3 s per
  message (n**2 node visits on 4,000 nodes, under the 0.5 s ``filters.cpu_limit``), fed 20
  messages each; measured after 3 s, once their shares (``filters.cpu_share``) have
  pushed them back.

Once a case is measured its attackers are paused (PauseSubscription), so that the retries
of their failing deliveries (the closed tarpits refuse connections) are not part of the
next case's load: until then the many-ports case also measured 100 tarpit-host retries
every few seconds.

Target for each: the healthy consumer's p99 <= 2 x its p99 alone (same gateway, same
rate, same run).
"""

from __future__ import annotations

import time
import urllib.request

from bench import client, soap
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
PORTS_TOPIC = "ports"
COSTLY_TOPIC = "costly"
TARPITS = 100
COSTLY_SUBSCRIPTIONS = 20
#: the healthy subscription's filter: true for every payload, microseconds to evaluate
CHEAP_FILTER = "boolean(/*)"
#: about 0.3 s per message on :data:`COSTLY_PAYLOAD`, and false (nothing is delivered)
COSTLY_FILTER = "count(//a[count(//a) > 0]) < 0"
COSTLY_PAYLOAD = "<r>" + "<a/>" * 4000 + "</r>"
#: seconds the costly subscriptions run before the healthy consumer is measured
COSTLY_LEAD = 3.0


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


def _pause(subscriptions: list[str]) -> None:
    """PauseSubscription for each of ``subscriptions`` (a case's attackers, once measured:
    closed tarpits refuse connections, and their retries would load the next case)."""
    answers, _ = client.run_requests([client.Request(s, soap.pause(s)) for s in subscriptions])
    failed = [status for status, _ in answers if status != 200]
    if failed:
        raise RuntimeError(f"PauseSubscription failed {len(failed)} times; first: {failed[0]}")


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


def _hanging(pits: Tarpits, count: int) -> tuple[bool, int]:
    """Wait until ``count`` deliveries hang in ``pits``: (all of them did, how many)."""
    hanging = wait_until(lambda: pits.connections() >= count, 10, 0.05)
    return hanging, pits.connections()


class Isolation(Scenario):
    """A healthy consumer's p99 latency alone, with 100 tarpit hosts, with 100 tarpit
    ports of one host and with 20 costly filters."""

    name = "isolation"
    title = "Isolation: a healthy consumer's latency while others never answer or filter slowly"
    middlewares = ("embedded",)

    def run(self, ctx: Context, mw: Middleware | None, result: ScenarioResult) -> None:
        assert mw is not None
        rate = float(ctx.pick(200, 100))
        seconds = ctx.pickf(8.0, 3.0, smoke=0.5)
        lead = ctx.pickf(COSTLY_LEAD, COSTLY_LEAD, smoke=0.5)
        result.details.update(rate=rate, seconds=seconds, tarpits=TARPITS)
        consumer = ConsumerProcess().start()
        # the one-host tarpits need a host the others do not use (127.0.0.1: the consumer)
        pits = Tarpits(TARPITS, hosts=[f"127.0.1.{i + 1}" for i in range(TARPITS)])
        ports = Tarpits(TARPITS, hosts=["127.0.0.2"])
        runs: dict[str, tuple[list[float], int, int]] = {}
        notes: dict[str, list[str]] = {"tarpits": [], "ports": [], "filters": []}
        try:
            with running_server(ctx, mw, "isolation") as server:
                check_notify(server, TOPIC)
                _, secs = subscribe_all(
                    server, [consumer.base_url + "/c/0"], [TOPIC], content=CHEAP_FILTER
                )
                attackers, more = subscribe_all(
                    server,
                    [*pits.addresses(), *ports.addresses()],
                    [PIT_TOPIC] * TARPITS + [PORTS_TOPIC] * TARPITS,
                )
                _, costly = subscribe_all(
                    server,
                    # never called (the filter is false); not the healthy consumer's
                    # destination, whose lane the costly ones would share
                    ["http://127.0.0.3:9/never"] * COSTLY_SUBSCRIPTIONS,
                    [COSTLY_TOPIC] * COSTLY_SUBSCRIPTIONS,
                    content=COSTLY_FILTER,
                )
                result.setup["subscribe_s"] = secs + more + costly
                warm_up(server.broker_url, consumer)
                runs["alone"] = _latencies(server.broker_url, consumer, rate, seconds)

                check_notify(server, PIT_TOPIC)
                hanging, stuck = _hanging(pits, TARPITS)
                started = time.monotonic()
                runs["tarpits"] = _latencies(server.broker_url, consumer, rate, seconds)
                if not hanging:
                    notes["tarpits"].append(f"only {stuck} of {TARPITS} tarpits had a delivery")
                if not runs["tarpits"][2] and time.monotonic() - started >= 10.0:
                    notes["tarpits"].append("the measurement outlasted the 10 s timeout")
                threads = _threads(server.base_url)
                pits.close()  # the hanging deliveries fail now
                _pause(attackers[:TARPITS])  # their retries are not the next case's load

                check_notify(server, PORTS_TOPIC)
                _, port_conns = _hanging(ports, 1)
                runs["ports"] = _latencies(server.broker_url, consumer, rate, seconds)
                port_conns = ports.connections()
                ports.close()
                _pause(attackers[TARPITS:])
                notes["ports"].append(
                    f"{port_conns} connections made to the {TARPITS} ports of one host in all"
                )

                kc = client.KeepAliveClient()
                try:
                    for _ in range(COSTLY_SUBSCRIPTIONS):
                        kc.post(
                            server.broker_url,
                            soap.notify_xml(server.broker_url, COSTLY_TOPIC, COSTLY_PAYLOAD),
                        )
                finally:
                    kc.close()
                time.sleep(lead)
                runs["filters"] = _latencies(server.broker_url, consumer, rate, seconds)
        finally:
            pits.close()
            ports.close()
            consumer.stop()
        alone, sent_alone, lost_alone = runs["alone"]
        p99_alone, p50_alone = percentile(alone, 99), percentile(alone, 50)
        figures = []
        for case, metric, what in (
            ("tarpits", "healthy_p99_with_tarpits", f"{TARPITS} tarpit hosts"),
            ("ports", "healthy_p99_with_many_ports", f"{TARPITS} tarpit ports of one host"),
            ("filters", "healthy_p99_with_filter_pool", f"{COSTLY_SUBSCRIPTIONS} costly filters"),
        ):
            latencies, sent, lost = runs[case]
            if lost or lost_alone:
                notes[case].append(
                    f"{lost_alone}/{sent_alone} alone and {lost}/{sent} here not delivered "
                    f"within {PATIENCE:g} s (counted with the time waited)"
                )
            p99 = percentile(latencies, 99)
            figures.append(f"{p99 or 0:.1f} ms with {what}")
            result.add(
                Metric(
                    name=metric,
                    value=p99,
                    unit="ms",
                    baseline=p99_alone,
                    baseline_name="the healthy consumer's p99 alone (same gateway, same rate)",
                    target=Target("<=", 2.0),
                    note="; ".join(notes[case]) or None,
                )
            )
            result.details[f"latencies_{case}_ms"] = sorted(latencies)[
                :: max(1, len(latencies) // 1000)
            ]
        with_pits = runs["tarpits"][0]
        result.add(
            Metric(
                name="healthy_p50_with_tarpits",
                value=percentile(with_pits, 50),
                unit="ms",
                baseline=p50_alone,
                baseline_name="the healthy consumer's p50 without tarpits",
                note="informative, no target",
            )
        )
        ctx.log(
            f"  healthy consumer at {rate:,.0f} msg/s: p99 {p99_alone or 0:.1f} ms alone, "
            + ", ".join(figures)
            + f" ({stuck} deliveries hung in the tarpit hosts; {threads or 0:.0f} threads)"
        )
        result.details.update(
            tarpit_connections=stuck,
            ports_connections=port_conns,
            delivery_threads=threads,
            sent_alone=sent_alone,
            latencies_alone_ms=sorted(alone)[:: max(1, len(alone) // 1000)],
        )
