"""Scenario 1, ingress: SOAP Notify requests/s accepted by the broker (1 and 100
NotificationMessages per Notify), keep-alive load from wrk in a separate process.

Baseline: ``bench.baseline_app`` — a bare Flask endpoint on waitress with the same thread
count, parsing the same envelope with lxml and returning a canned answer — loaded the same
way, alternating with the broker (best of three 5 s runs each), so neighbours and drift
hit both alike.  With 100 messages per Notify the baseline also serialises each
message's payload once (its ``/wsn/serialising-broker`` endpoint), the least a gateway
must do to store a message; the ratio against the parse-only endpoint, the definition
before, is still measured and reported (``notify_100msg_rps_vs_parse_only``, no target).
No subscription exists, so this is the Notify path up to the middleware's publish
confirmation.  Target: broker/baseline >= 0.75.
"""

from __future__ import annotations

import time

from bench import cpus, load, soap
from bench.baseline_app import NOTIFY_PATH, SERIALISING_NOTIFY_PATH, BaselineServer
from bench.middleware import Middleware
from bench.model import Metric, ScenarioResult, Target
from bench.scenarios.base import Context, Scenario, check_notify, running_server
from bench.server import SERVER_THREADS

TARGET = Target(">=", 0.75)
BATCHES = (1, 100)
#: batches whose target baseline also serialises each payload (the others only parse)
SERIALISING_BATCHES = frozenset({100})
CONNECTIONS = 16


class Ingress(Scenario):
    """Notify requests/s against a bare Flask+lxml baseline."""

    name = "ingress"
    title = "Ingress: SOAP Notify requests/s"

    def run(self, ctx: Context, mw: Middleware | None, result: ScenarioResult) -> None:
        assert mw is not None
        duration = ctx.pickf(5.0, 2.0, smoke=0.3)
        rounds = ctx.pick(3, 1)
        warmup = ctx.pickf(2.0, 1.0, smoke=0.1)
        result.details.update(
            duration_s=duration,
            rounds=rounds,
            connections=CONNECTIONS,
            server_threads=SERVER_THREADS,
            tool="wrk" if load.wrk_available() else "python",
            batches=list(BATCHES),
        )
        base = BaselineServer(SERVER_THREADS).start()
        try:
            with running_server(ctx, mw, "ingress") as server:
                check_notify(server, "ingress")
                base_url = base.base_url + NOTIFY_PATH
                serialising_url = base.base_url + SERIALISING_NOTIFY_PATH
                for batch in BATCHES:
                    # the load targets, baselines first: (label, url, body)
                    targets = [("base", base_url, soap.notify(base_url, "ingress", messages=batch))]
                    if batch in SERIALISING_BATCHES:
                        body = soap.notify(serialising_url, "ingress", messages=batch)
                        targets.append(("serialising", serialising_url, body))
                    body = soap.notify(server.broker_url, "ingress", messages=batch)
                    targets.append(("broker", server.broker_url, body))
                    for _, url, body in targets:
                        load.run_load(url, body, warmup, CONNECTIONS)
                    by_label: dict[str, list[load.LoadResult]] = {t[0]: [] for t in targets}
                    # alternate baselines and broker so drift and neighbours hit all alike
                    for _ in range(rounds):
                        for label, url, body in targets:
                            by_label[label].append(load.run_load(url, body, duration, CONNECTIONS))
                            time.sleep(0.3)
                    base_runs, runs = by_label["base"], by_label["broker"]
                    base_best = max(base_runs, key=lambda r: r.rps)
                    best = max(runs, key=lambda r: r.rps)
                    errors = sum(r.errors for r in runs)
                    serialising = by_label.get("serialising")
                    ser_best = max(serialising, key=lambda r: r.rps) if serialising else None
                    ctx.log(
                        f"  {batch}/Notify: baseline {base_best.rps:,.0f} req/s"
                        + (f", serialising {ser_best.rps:,.0f} req/s" if ser_best else "")
                        + f", {mw.name} {best.rps:,.0f} req/s ({errors} errors; best of {rounds})"
                    )
                    target_base = ser_best or base_best
                    result.add(
                        Metric(
                            name=f"notify_{batch}msg_rps",
                            value=best.rps,
                            unit="req/s",
                            baseline=target_base.rps,
                            baseline_name="bare Flask+lxml on waitress"
                            + (", serialising each payload once" if ser_best else ""),
                            target=TARGET,
                            note=f"{errors} errors" if errors else None,
                        )
                    )
                    if ser_best is not None:
                        result.add(
                            Metric(
                                name=f"notify_{batch}msg_rps_vs_parse_only",
                                value=best.rps,
                                unit="req/s",
                                baseline=base_best.rps,
                                baseline_name="bare Flask+lxml on waitress, parse only",
                                note="old definition: the baseline only parses; no target",
                            )
                        )
                        result.details[f"baseline_serialising_{batch}"] = [
                            r.to_dict() for r in serialising or []
                        ]
                    self._raw_reference(ctx, mw, batch, duration, rounds, best.rps, result)
                    result.add(
                        Metric(
                            name=f"notify_{batch}msg_msgs_per_s",
                            value=best.rps * batch,
                            unit="msg/s",
                        )
                    )
                    result.details[f"load_{batch}"] = [r.to_dict() for r in runs]
                    result.details[f"baseline_{batch}"] = [r.to_dict() for r in base_runs]
        finally:
            base.stop()

    def _raw_reference(
        self,
        ctx: Context,
        mw: Middleware,
        batch: int,
        duration: float,
        rounds: int,
        broker_rps: float,
        result: ScenarioResult,
    ) -> None:
        """The raw client's ceiling for this batch (``Middleware.raw_ingress``: as many
        threads as the gateway has request threads, each publishing one Notify's messages
        and waiting for the confirmation), best of ``rounds``, on the server's CPUs like
        the other raw baselines; informative, no target."""
        bodies = [soap.payload(i, "0", 64).encode() for i in range(batch)]
        raws: list[float] = []
        for _ in range(rounds):
            with cpus.on_server_cpus():
                raw = mw.raw_ingress(bodies, duration, SERVER_THREADS)
            if raw is None:
                return
            raws.append(raw)
        best = max(raws)
        ctx.log(f"  {batch}/Notify: raw {mw.name} client {best:,.0f} Notifies/s (best of {rounds})")
        result.details[f"raw_client_{batch}"] = raws
        result.add(
            Metric(
                name=f"notify_{batch}msg_rps_vs_raw_client",
                value=broker_rps,
                unit="req/s",
                baseline=best,
                baseline_name=f"raw {mw.name} client, {SERVER_THREADS} threads each publishing "
                f"{batch} message(s) and waiting for the confirmation",
                note="informative: what the middleware and its client allow; no target",
            )
        )
