"""Scenario 1, ingress: SOAP Notify requests/s accepted by the broker (1 and 100
NotificationMessages per Notify), keep-alive load from wrk in a separate process.

Baseline: ``bench.baseline_app`` — a bare Flask endpoint on waitress with the same thread
count, parsing the same envelope with lxml and returning a canned answer — loaded the same
way, alternating with the broker (best of three 5 s runs each), so neighbours and drift
hit both alike.  No subscription exists, so this is the Notify path up to the
middleware's publish confirmation.  Target: broker/baseline >= 0.75.
"""

from __future__ import annotations

import time

from bench import load, soap
from bench.baseline_app import BaselineServer
from bench.middleware import Middleware
from bench.model import Metric, ScenarioResult, Target
from bench.scenarios.base import Context, Scenario, check_notify, running_server
from bench.server import SERVER_THREADS

TARGET = Target(">=", 0.75)
BATCHES = (1, 100)
CONNECTIONS = 16


class Ingress(Scenario):
    """Notify requests/s against a bare Flask+lxml baseline."""

    name = "ingress"
    title = "Ingress: SOAP Notify requests/s"

    def run(self, ctx: Context, mw: Middleware | None, result: ScenarioResult) -> None:
        assert mw is not None
        duration = ctx.pickf(5.0, 2.0)
        rounds = ctx.pick(3, 1)
        warmup = ctx.pickf(2.0, 1.0)
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
                base_url = base.base_url + "/wsn/broker"
                for batch in BATCHES:
                    base_body = soap.notify(base_url, "ingress", messages=batch)
                    body = soap.notify(server.broker_url, "ingress", messages=batch)
                    load.run_load(base_url, base_body, warmup, CONNECTIONS)
                    load.run_load(server.broker_url, body, warmup, CONNECTIONS)
                    base_runs: list[load.LoadResult] = []
                    runs: list[load.LoadResult] = []
                    # alternate baseline and broker so drift and neighbours hit both alike
                    for _ in range(rounds):
                        base_runs.append(load.run_load(base_url, base_body, duration, CONNECTIONS))
                        time.sleep(0.3)
                        runs.append(load.run_load(server.broker_url, body, duration, CONNECTIONS))
                        time.sleep(0.3)
                    base_best = max(base_runs, key=lambda r: r.rps)
                    best = max(runs, key=lambda r: r.rps)
                    errors = sum(r.errors for r in runs)
                    ctx.log(
                        f"  {batch}/Notify: baseline {base_best.rps:,.0f} req/s, {mw.name} "
                        f"{best.rps:,.0f} req/s ({errors} errors; best of {rounds})"
                    )
                    result.add(
                        Metric(
                            name=f"notify_{batch}msg_rps",
                            value=best.rps,
                            unit="req/s",
                            baseline=base_best.rps,
                            baseline_name="bare Flask+lxml on waitress",
                            target=TARGET,
                            note=f"{errors} errors" if errors else None,
                        )
                    )
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
