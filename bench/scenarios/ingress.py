"""Scenario 1, ingress: SOAP Notify requests/s accepted by the broker (1 and 100
NotificationMessages per Notify), keep-alive load from wrk in a separate process.

Baseline: ``bench.baseline_app`` — a bare Flask endpoint on waitress with the same thread
count, parsing the same envelope with lxml and returning a canned answer — loaded the same
way right before the broker.  No subscription exists, so this is the Notify path up to the
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
        duration = ctx.pickf(10.0, 2.0)
        warmup = ctx.pickf(2.0, 1.0)
        result.details.update(
            duration_s=duration,
            connections=CONNECTIONS,
            server_threads=SERVER_THREADS,
            tool="wrk" if load.wrk_available() else "python",
            batches=list(BATCHES),
        )
        baseline: dict[int, load.LoadResult] = {}
        base = BaselineServer(SERVER_THREADS).start()
        try:
            for batch in BATCHES:
                url = base.base_url + "/wsn/broker"
                body = soap.notify(url, "ingress", messages=batch)
                load.run_load(url, body, warmup, CONNECTIONS)
                baseline[batch] = load.run_load(url, body, duration, CONNECTIONS)
                ctx.log(f"  baseline {batch}/Notify: {baseline[batch].rps:,.0f} req/s")
        finally:
            base.stop()
        with running_server(ctx, mw, "ingress") as server:
            check_notify(server, "ingress")
            for batch in BATCHES:
                body = soap.notify(server.broker_url, "ingress", messages=batch)
                load.run_load(server.broker_url, body, warmup, CONNECTIONS)
                time.sleep(0.5)
                got = load.run_load(server.broker_url, body, duration, CONNECTIONS)
                ctx.log(f"  {mw.name} {batch}/Notify: {got.rps:,.0f} req/s ({got.errors} errors)")
                base_rps = baseline[batch].rps
                result.add(
                    Metric(
                        name=f"notify_{batch}msg_rps",
                        value=got.rps,
                        unit="req/s",
                        baseline=base_rps,
                        baseline_name="bare Flask+lxml on waitress",
                        target=TARGET,
                        note=f"{got.errors} errors" if got.errors else None,
                    )
                )
                result.add(
                    Metric(
                        name=f"notify_{batch}msg_msgs_per_s",
                        value=got.rps * batch,
                        unit="msg/s",
                    )
                )
                result.details[f"load_{batch}"] = got.to_dict()
                result.details[f"baseline_{batch}"] = baseline[batch].to_dict()
