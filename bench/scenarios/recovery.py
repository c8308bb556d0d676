"""Scenario 6, recovery: restart the gateway (embedded adapter) holding 10k subscriptions
and 100k accumulated notifications; time until delivery resumes for all of them.

Set-up: 10k pull points, each subscribed to one topic; ten Notifies then put 100k
notifications in their durable subscriptions.  The gateway is stopped gracefully and
started again on the same store and middleware directory.  Measured from the new process'
start: ``/readyz`` answering, every pull point having returned a message again (concurrent
GetMessages), and all 100k drained.  Target: resumed for all <= 10 s.
"""

from __future__ import annotations

import time

from bench import client, soap
from bench.baseline_app import BaselineServer
from bench.middleware import Middleware
from bench.model import Metric, ScenarioResult, Target
from bench.scenarios.base import Context, Scenario, create_pull_points, drain_once, subscribe_all
from bench.server import ServerProcess

TOPIC = "recovery"
#: the drain after "resumed" is informative only: it stops after this many seconds
DRAIN_CAP_S = 60.0


class Recovery(Scenario):
    """Restart time with accumulated state."""

    name = "recovery"
    title = "Recovery: restart with 10k subscriptions, 100k notifications"
    middlewares = ("embedded",)

    def run(self, ctx: Context, mw: Middleware | None, result: ScenarioResult) -> None:
        assert mw is not None
        subs = ctx.pick(10_000, 200)
        per_sub = 10
        workdir = ctx.workdir / f"recovery-{mw.name}"
        url = mw.adapter_url(workdir)
        server = ServerProcess(url, workdir)
        server.start()
        try:
            t0 = time.perf_counter()
            points, _ = create_pull_points(server, subs)
            subscribe_all(server, points, [TOPIC] * subs)
            result.setup["create_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            reqs = [
                client.Request(server.broker_url, soap.notify(server.broker_url, TOPIC, seq0=i))
                for i in range(per_sub)
            ]
            answers, _ = client.run_requests(reqs, processes=1, threads=1)
            bad = [s for s, _ in answers if not 200 <= s < 300]
            if bad:
                raise RuntimeError(f"Notify failed during set-up: {bad[:3]}")
            result.setup["accumulate_s"] = time.perf_counter() - t0
            ctx.log(
                f"  {subs} pull points, {subs * per_sub} notifications accumulated "
                f"({result.setup['create_s']:.1f}s + {result.setup['accumulate_s']:.1f}s)"
            )
            t0 = time.perf_counter()
            server.stop()
            stop_s = time.perf_counter() - t0
            restarted = time.perf_counter()
            ready_s = server.start(timeout=120)
            pending = list(points)
            rounds = 0
            round_s: list[float] = []
            while pending and time.perf_counter() - restarted < 300:
                round_started = time.perf_counter()
                counts = drain_once(pending, maximum=1)
                round_s.append(time.perf_counter() - round_started)
                pending = [a for a, n in zip(pending, counts, strict=True) if n == 0]
                rounds += 1
            resumed_s = time.perf_counter() - restarted
            if pending:
                raise RuntimeError(f"{len(pending)} pull points returned nothing after restart")
            drained = subs
            drain_cap = time.perf_counter() + DRAIN_CAP_S
            while time.perf_counter() < drain_cap:
                counts = drain_once(points, maximum=100)
                drained += sum(counts)
                if sum(counts) == 0:
                    break
            drained_s = time.perf_counter() - restarted
            rss = server.rss()
        finally:
            server.stop()
        # the same round of GetMessages against a bare Flask endpoint (same server, same
        # client): what one request per pull point costs without any broker work
        baseline = BaselineServer(threads=16).start()
        try:
            prefix = server.base_url + "/wsn/pullpoints/"
            fake = [baseline.base_url + "/wsn/pullpoints/" + a[len(prefix) :] for a in points]
            started = time.perf_counter()
            counts = drain_once(fake, maximum=1)
            baseline_round_s = time.perf_counter() - started
            if sum(counts) != len(fake):
                raise RuntimeError("the GetMessages baseline answered without a message")
        finally:
            baseline.stop()
        ctx.log(
            f"  ready {ready_s:.2f}s, resumed for all {resumed_s:.2f}s, "
            f"{drained} drained at {drained_s:.2f}s (stop took {stop_s:.2f}s)"
        )
        result.details.update(
            subscriptions=subs,
            accumulated=subs * per_sub,
            drained=drained,
            get_rounds=rounds,
            get_round_s=round_s,
            stop_s=stop_s,
            rss_after_mb=(rss or 0) / 1024 / 1024,
        )
        result.add(Metric(name="ready_s", value=ready_s, unit="s"))
        result.add(
            Metric(
                name="resumed_all_s",
                value=resumed_s,
                unit="s",
                target=Target("<=", 10.0, on="value"),
                note=f"{subs} subscriptions, {subs * per_sub} accumulated",
            )
        )
        result.add(
            Metric(name="drained_all_s", value=drained_s, unit="s", note=f"{drained} messages")
        )
        if round_s:
            # the first round asks every pull point once: its rate bounds "resumed"
            result.add(
                Metric(
                    name="first_round_get_messages_per_s",
                    value=subs / round_s[0],
                    unit="req/s",
                    baseline=subs / baseline_round_s,
                    baseline_name="bare Flask+lxml GetMessages on waitress",
                    note=f"{subs} GetMessages in {round_s[0]:.1f} s, {rounds} round(s); "
                    f"baseline {baseline_round_s:.1f} s",
                )
            )
