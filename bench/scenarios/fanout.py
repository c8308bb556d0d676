"""Scenario 3, fan-out: one Notify to 100, 1,000 and 10,000 subscriptions on one topic;
time until every subscription has its message, as cost per delivery.

Push: subscriptions spread over four consumer servers (separate processes), each with its
own path, so "all delivered" is "every path seen".  Pull: one pull point per subscription,
drained with concurrent GetMessages until every pull point returned the message.
Subscriptions are created incrementally (100, then 900 more, ...) with concurrent keep-alive
clients; their creation time is recorded as set-up, not as a figure, and the gateway's RSS
at each size is reported (no target).  A creation the gateway refuses as overloaded (503,
Retry-After) is sent again after the Retry-After, up to three times, as a client honouring
the fault would; the refusals are counted (``*_setup_refusals_N``).

Baseline: the cost per delivery at the smallest size in the same run.  Target: cost at
10,000 <= 1.5 x cost at 100.  Where the middleware has a raw fan-out reference
(``Middleware.raw_fanout``: the raw client publishes one message to N durable queues and
takes it from each), its cost per delivery at each size and its own 10,000-vs-100 ratio
are reported next to the gateway's, without a target: what the broker alone pays.  For the
pull half, ``Middleware.raw_pull_fanout`` does the same takes with as many clients at once
as the drain (``raw_pull_*`` figures).
"""

from __future__ import annotations

import os
import time

from bench import client, cpus, soap
from bench.consumer import ConsumerPool
from bench.middleware import Middleware
from bench.model import Metric, ScenarioResult, Target
from bench.scenarios.base import (
    Context,
    Scenario,
    check_notify,
    create_pull_points,
    drain_once,
    running_server,
    subscribe_all,
)
from bench.server import ServerProcess
from bench.util import median

CONSUMERS = 4
#: subscriptions created per batch of concurrent requests
CHUNK = 2000
TARGET = Target("<=", 1.5)
MB = 1024 * 1024


def _repeats(size: int) -> int:
    return 5 if size <= 100 else 3 if size <= 1000 else 1


def _modes() -> tuple[str, ...]:
    """The halves to run: ``WSNMOM_BENCH_FANOUT=pull`` (or ``push``) runs one of them
    (a shorter run when only that figure is being worked on); default both."""
    wanted = os.environ.get("WSNMOM_BENCH_FANOUT", "push,pull")
    modes = tuple(m for m in ("push", "pull") if m in wanted.split(","))
    if not modes:
        raise RuntimeError(f"WSNMOM_BENCH_FANOUT={wanted!r}: expected push, pull or both")
    return modes


def _notify(server: ServerProcess, topic: str) -> None:
    kc = client.KeepAliveClient()
    try:
        status, body = kc.post(server.broker_url, soap.notify(server.broker_url, topic))
    finally:
        kc.close()
    if status >= 300:
        raise RuntimeError(f"Notify answered {status}: {soap.fault_summary(body)}")


def _note_refusals(ctx: Context, result: ScenarioResult, key: str, refusals: list[str]) -> None:
    """Record the set-up requests the gateway refused as overloaded (and that were sent
    again after their Retry-After): how many, and the first fault."""
    result.details[key] = len(refusals)
    if refusals:
        result.details[f"{key}_first"] = refusals[0][:300]
        ctx.log(f"  {len(refusals)} set-up request(s) refused, sent again: {refusals[0][:200]}")


class FanOut(Scenario):
    """Cost per delivery of one Notify to many subscriptions."""

    name = "fanout"
    title = "Fan-out: one Notify to N subscriptions"

    def run(self, ctx: Context, mw: Middleware | None, result: ScenarioResult) -> None:
        assert mw is not None
        sizes = (10, 100) if ctx.quick else (100, 1000, 10000)
        timeout = 300.0
        result.details["sizes"] = list(sizes)
        push: dict[int, float] = {}
        pull: dict[int, float] = {}
        modes = _modes()
        result.details["modes"] = list(modes)
        # before the gateway steps: afterwards the node may be busy for minutes
        mw.prepare_raw(ctx.workdir / f"fanout-raw-{mw.name}")
        if "push" in modes:
            with running_server(ctx, mw, "fanout") as server:
                check_notify(server, "fanpush")
                pool = ConsumerPool(CONSUMERS).start()
                try:
                    self._push(ctx, server, pool, sizes, timeout, result, push)
                except RuntimeError as exc:
                    result.details["push_failed"] = str(exc)
                    ctx.log(f"  push failed: {str(exc)[:300]}")
                finally:
                    pool.stop()
        # a fresh gateway for pull, so a push failure cannot leak into it
        if "pull" in modes:
            with running_server(ctx, mw, "fanout-pull") as server:
                try:
                    self._pull(ctx, server, sizes, timeout, result, pull)
                except RuntimeError as exc:
                    result.details["pull_failed"] = str(exc)
                    ctx.log(f"  pull failed: {str(exc)[:300]}")
        try:
            self._raw(ctx, mw, sizes, result)
        except Exception as exc:  # the reference only: the gateway's figures stand
            result.details["raw_failed"] = str(exc)
            ctx.log(f"  raw failed: {str(exc)[:300]}")
        if not push and not pull:
            raise RuntimeError(
                f"push: {result.details.get('push_failed')}; "
                f"pull: {result.details.get('pull_failed')}"
            )
        for mode, costs in (("push", push), ("pull", pull)):
            if mode not in modes:
                continue
            result.details[f"{mode}_cost_us"] = {str(k): v for k, v in costs.items()}
            failure = result.details.get(f"{mode}_failed")
            for size in sizes:
                result.add(
                    Metric(
                        name=f"{mode}_cost_per_delivery_{size}",
                        value=costs.get(size),
                        unit="us",
                        note=None if size in costs else "failed",
                    )
                )
            small, large = sizes[0], sizes[-1]
            metric = result.add(
                Metric(
                    name=f"{mode}_cost_{large}_vs_{small}",
                    value=costs.get(large),
                    unit="us",
                    baseline=costs.get(small),
                    baseline_name=f"{mode} cost per delivery at {small}",
                    target=TARGET,
                    note=failure[:160] if failure else None,
                )
            )
            if failure and large not in costs:
                metric.passed = False  # could not be done at all: a miss, not "unmeasured"

    def _raw(
        self, ctx: Context, mw: Middleware, sizes: tuple[int, ...], result: ScenarioResult
    ) -> None:
        """The raw client's fan-out at each size (informative; median of the repeats):
        ``raw`` (one client in turn) and ``raw_pull`` (as many clients at once as the
        pull half's drain)."""
        for kind, measure in (("raw", mw.raw_fanout), ("raw_pull", mw.raw_pull_fanout)):
            raw: dict[int, float] = {}
            for size in sizes:
                times: list[float] = []
                for _ in range(min(_repeats(size), 3)):
                    with cpus.on_server_cpus():
                        secs = measure(size, ctx.workdir / f"fanout-{kind}-{mw.name}")
                    if secs is None:
                        break
                    times.append(secs)
                if not times:
                    break
                raw[size] = (median(times) or 0.0) / size * 1e6
                ctx.log(
                    f"  {kind:<8} {size:>6}: {raw[size]:8.1f} us/delivery (raw client, no gateway)"
                )
                result.add(
                    Metric(name=f"{kind}_cost_per_delivery_{size}", value=raw[size], unit="us")
                )
            if not raw:
                continue
            result.details[f"{kind}_cost_us"] = {str(k): v for k, v in raw.items()}
            small, large = sizes[0], sizes[-1]
            result.add(
                Metric(
                    name=f"{kind}_cost_{large}_vs_{small}",
                    value=raw.get(large),
                    unit="us",
                    baseline=raw.get(small),
                    baseline_name=f"{kind} client cost per delivery at {small}",
                    note="the middleware alone: informative, no target",
                )
            )

    def _push(
        self,
        ctx: Context,
        server: ServerProcess,
        pool: ConsumerPool,
        sizes: tuple[int, ...],
        timeout: float,
        result: ScenarioResult,
        costs: dict[int, float],
    ) -> None:
        have = 0
        for size in sizes:
            secs = 0.0
            refusals: list[str] = []
            for lo in range(have, size, CHUNK):  # chunks: stop early when the gateway refuses
                new = range(lo, min(size, lo + CHUNK))
                _, chunk_s = subscribe_all(
                    server, [pool.address(i) for i in new], ["fanpush"] * len(new), None, refusals
                )
                secs += chunk_s
            result.setup[f"push_subscribe_{size}_s"] = secs
            _note_refusals(ctx, result, f"push_setup_refusals_{size}", refusals)
            have = size
            rss = server.rss()
            if rss is not None:  # informative: the gateway holding ``size`` subscriptions
                result.add(
                    Metric(name=f"rss_mb_{size}_subscriptions", value=rss / 2**20, unit="MB")
                )
            times: list[float] = []
            for _ in range(_repeats(size)):
                time.sleep(0.3)
                pool.reset()
                started = time.time()
                _notify(server, "fanpush")
                got = pool.wait_paths(size, timeout)
                if got is None:
                    seen = pool.totals()["distinct_paths"]
                    raise RuntimeError(
                        f"push fan-out {size}: {seen}/{size} delivered in {timeout}s"
                    )
                times.append(got["last"] - started)
            best = median(times) or 0.0
            costs[size] = best / size * 1e6
            result.details[f"push_times_{size}_s"] = times
            rss = (server.rss() or 0) / MB
            result.add(Metric(name=f"push_rss_{size}", value=rss, unit="MB"))
            ctx.log(
                f"  push {size:>6}: {best * 1000:8.1f} ms, {costs[size]:8.1f} us/delivery "
                f"(subscribe {secs:.1f}s, RSS {rss:.0f} MB)"
            )

    def _pull(
        self,
        ctx: Context,
        server: ServerProcess,
        sizes: tuple[int, ...],
        timeout: float,
        result: ScenarioResult,
        costs: dict[int, float],
    ) -> None:
        points: list[str] = []
        for size in sizes:
            secs_pp = secs_sub = 0.0
            # set-up requests refused as overloaded, sent again after their Retry-After
            refusals: list[str] = []
            while len(points) < size:
                more, chunk_pp = create_pull_points(
                    server, min(CHUNK, size - len(points)), refusals
                )
                _, chunk_sub = subscribe_all(server, more, ["fanpull"] * len(more), None, refusals)
                points += more
                secs_pp += chunk_pp
                secs_sub += chunk_sub
            result.setup[f"pull_create_{size}_s"] = secs_pp + secs_sub
            _note_refusals(ctx, result, f"pull_setup_refusals_{size}", refusals)
            times: list[float] = []
            # where each repeat's time went: the Notify (the broker routing and
            # confirming), then each drain round (pull points asked, seconds)
            phases: list[dict[str, object]] = []
            for _ in range(_repeats(size)):
                time.sleep(0.3)
                started = time.time()
                _notify(server, "fanpull")
                notified = time.time()
                rounds: list[tuple[int, float]] = []
                pending = list(points)
                while pending:
                    round_started = time.time()
                    counts = drain_once(pending, maximum=10)
                    rounds.append((len(pending), round(time.time() - round_started, 3)))
                    pending = [a for a, n in zip(pending, counts, strict=True) if n == 0]
                    if pending and time.time() - started > timeout:
                        raise RuntimeError(f"pull fan-out {size}: {len(pending)} pull points empty")
                times.append(time.time() - started)
                phases.append({"notify_s": round(notified - started, 3), "rounds": rounds})
            best = median(times) or 0.0
            costs[size] = best / size * 1e6
            result.details[f"pull_times_{size}_s"] = times
            result.details[f"pull_phases_{size}"] = phases
            rss = (server.rss() or 0) / MB
            result.add(Metric(name=f"pull_rss_{size}", value=rss, unit="MB"))
            ctx.log(
                f"  pull {size:>6}: {best * 1000:8.1f} ms, {costs[size]:8.1f} us/delivery "
                f"(set-up {secs_pp + secs_sub:.1f}s, RSS {rss:.0f} MB; last: Notify "
                f"{phases[-1]['notify_s']}s, rounds {phases[-1]['rounds']})"
            )
