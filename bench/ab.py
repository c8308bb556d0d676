"""A/B comparison of two commits under the same load, for changes smaller than the noise
between benchmark runs.

``python -m bench.ab --base HEAD~1 --adapter rabbitmq --load notify`` exports BASE
(``git archive``) to a temporary folder, starts one gateway from it (through
``bench/ab_launch.py``) and one from the working tree, both on the same middleware and
pinned to the same CPU (``bench/cpus.py``), and then alternates load rounds between them:
A B, B A, A B ...  For each round it reads the server process's CPU time from ``/proc``
and reports the CPU per request and the requests/s, with the median of each side.

``--tree-config TOML`` gives the working tree's gateway settings the base's does not get
(``'[tracing]\\nenabled = true'``: what a setting costs).

``--auth bearer`` (or ``basic``) gives both gateways an admin token and sends it with every
request: a base without authentication ignores both, so the comparison measures what
authentication costs the working tree.

Loads: ``notify`` (1-message Notify, no subscription: the ingress path), ``notify-100``
(100 messages per Notify), ``push`` (1-message Notify with one push subscription to a
consumer server: ingress and delivery on the same CPU) and ``latency`` (the delivery
scenario's latency measurement: one push subscription, 1-message Notifies paced at
``--rate`` per second by the paced sender; each round reports the p50 and p99 of intended
send time to arrival at the consumer, besides the CPU per request), ``get`` and ``get-10``
(``--answers`` GetMessages of 1 or 10 messages on a filled pull point, one after the
other; each round reports their p50 and p99 besides the CPU per GetMessages; on RabbitMQ
both gateways run ``pull = "get"``, see :mod:`bench.ab_pull`).  CPU per request is the
steadier figure on a shared machine (requests/s also moves with the load side).  Only ever
loads 127.0.0.1.
"""

from __future__ import annotations

import argparse
import base64
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench import ab_pull, client, cpus, load, soap
from bench.consumer import ConsumerProcess
from bench.middleware import MIDDLEWARES, Middleware
from bench.server import ServerProcess
from bench.util import percentile, process_cpu_seconds, wait_until

REPO = Path(__file__).resolve().parents[1]
LAUNCHER = Path(__file__).with_name("ab_launch.py")
LOADS = ("notify", "notify-100", "push", "latency", *ab_pull.GET_LOADS)
#: loads that need a push subscription to a consumer server
PUSH_LOADS = ("push", "latency")
TOPIC = "ab"


class TreeServer(ServerProcess):
    """A gateway run from another source tree (an exported commit)."""

    def __init__(self, tree: Path, adapter_url: str, workdir: Path, config_extra: str = "") -> None:
        super().__init__(adapter_url, workdir, config_extra)
        self.tree = tree

    def command(self) -> list[str]:
        """``python bench/ab_launch.py TREE serve ...`` instead of ``python -m wsnmom``."""
        base = super().command()
        return [base[0], str(LAUNCHER), str(self.tree), *base[3:]]


def export_commit(rev: str, dest: Path) -> str:
    """Write the files of ``rev`` to ``dest``; returns its short hash."""
    short = subprocess.run(
        ["git", "rev-parse", "--short", rev], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    dest.mkdir(parents=True)
    archive = subprocess.Popen(["git", "archive", rev], cwd=REPO, stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise RuntimeError(f"git archive {rev} failed")
    return short


@dataclass
class Side:
    """One gateway of the comparison and its rounds."""

    label: str
    server: ServerProcess
    #: (CPU µs per request, requests/s) per round
    rounds: list[tuple[float, float]] = field(default_factory=list)
    #: (p50, p99) latency in ms per round (the ``latency`` and GetMessages loads)
    latencies: list[tuple[float, float]] = field(default_factory=list)
    #: the pull point the GetMessages loads read
    pull_point: str = ""

    def medians(self) -> tuple[float, float]:
        """Median CPU µs per request and median requests/s."""
        return (
            statistics.median(r[0] for r in self.rounds),
            statistics.median(r[1] for r in self.rounds),
        )

    def latency_medians(self) -> tuple[float, float] | None:
        """Median p50 and median p99 over the rounds (ms), None without latency rounds."""
        if not self.latencies:
            return None
        return (
            statistics.median(r[0] for r in self.latencies),
            statistics.median(r[1] for r in self.latencies),
        )


def _body(kind: str, url: str) -> bytes:
    return soap.notify(url, TOPIC, messages=100 if kind == "notify-100" else 1)


#: the admin token of ``--auth`` and the header each mode sends it in
AUTH_TOKEN = "bench-ab-admin-token-0123456789"
AUTH_HEADERS = {
    "none": {},
    "bearer": {"Authorization": f"Bearer {AUTH_TOKEN}"},
    "basic": {
        "Authorization": "Basic " + base64.b64encode(f"admin:{AUTH_TOKEN}".encode()).decode()
    },
}


def latency_round(
    side: Side, consumer: ConsumerProcess, rate: float, seconds: float
) -> tuple[float, float]:
    """One paced round on ``side`` (the ``latency`` load); (CPU µs per request,
    requests/s), with the round's p50 and p99 appended to ``side.latencies``."""
    pid = side.server.pid
    assert pid is not None
    url = side.server.broker_url
    time.sleep(1.0)
    consumer.reset()
    before = process_cpu_seconds(pid)
    paced = load.run_paced(url, soap.notify(url, TOPIC, ts=soap.TS_MARK), rate, seconds)
    sent = int(paced["sent"] - paced["errors"])
    if sent <= 0 or paced["errors"]:
        raise RuntimeError(f"{side.label}: paced sender: {paced}: {side.server.log_tail()}")
    wait_until(lambda: consumer.stats()["messages"] >= sent, 60, 0.05)
    spent = process_cpu_seconds(pid) - before
    lat = consumer.stats(latency=True)["latencies_ms"]
    side.latencies.append((percentile(lat, 50) or 0.0, percentile(lat, 99) or 0.0))
    return spent * 1e6 / sent, sent / paced["elapsed_s"]


def measure_round(
    side: Side, kind: str, seconds: float, settle: float, headers: dict[str, str] | None = None
) -> tuple[float, float]:
    """One load round on ``side``; (CPU µs per request, requests/s)."""
    pid = side.server.pid
    assert pid is not None
    time.sleep(settle)
    before = process_cpu_seconds(pid)
    result = load.run_load(
        side.server.broker_url, _body(kind, side.server.broker_url), seconds, headers=headers
    )
    time.sleep(settle)  # deliveries still under way belong to this round
    spent = process_cpu_seconds(pid) - before
    if result.requests == 0 or result.errors:
        raise RuntimeError(
            f"{side.label}: {result.requests} requests, {result.errors} errors: "
            f"{side.server.log_tail()}"
        )
    return spent * 1e6 / result.requests, result.rps


def compare(
    base: str,
    adapter: str,
    kind: str,
    rounds: int,
    seconds: float,
    log: Callable[[str], None] = print,
    auth: str = "none",
    rate: float = 200.0,
    tree_config: str = "",
    warmup: float = 2.0,
    answers: int = 500,
) -> list[Side]:
    """Run the comparison; returns the two sides (base first) with their rounds.
    ``tree_config``: TOML lines for the working tree's gateway only; ``warmup``: seconds
    of load on each gateway before the first round; ``answers``: GetMessages per round
    of the GetMessages loads."""
    mw: Middleware = next(cls() for cls in MIDDLEWARES if cls.name == adapter)
    reason = mw.unavailable()
    if reason:
        raise RuntimeError(reason)
    affinity = os.sched_getaffinity(0)
    cpus.choose(True)
    cpus.pin_bench_to_clients()
    try:
        with tempfile.TemporaryDirectory(prefix="wsnmom-ab-") as tmp:
            work = Path(tmp)
            short = export_commit(base, work / "base-tree")
            mw.start(work / "mw")
            consumer = ConsumerProcess().start() if kind in PUSH_LOADS else None
            headers = AUTH_HEADERS[auth]
            extra = f'[auth]\nadmin_token = "{AUTH_TOKEN}"\n' if headers else ""
            per_answer = ab_pull.GET_LOADS.get(kind, 0)

            def url_for(where: Path) -> str:
                url = mw.adapter_url(where)
                return ab_pull.adapter_url(adapter, url) if per_answer else url

            sides = [
                Side(
                    f"base {short}",
                    TreeServer(work / "base-tree", url_for(work / "a"), work / "a", extra),
                ),
                Side(
                    "working tree",
                    ServerProcess(
                        url_for(work / "b"), work / "b", extra + tree_config.strip() + "\n"
                    ),
                ),
            ]
            try:
                for pid in mw.pids():
                    cpus.pin_process_tree(pid)
                for side in sides:
                    side.server.start()
                    url = side.server.broker_url
                    if consumer is not None:
                        kc = client.KeepAliveClient()
                        try:
                            status, _ = kc.post(
                                url,
                                soap.subscribe(url, consumer.base_url + "/c/0", TOPIC),
                                headers=headers,
                            )
                        finally:
                            kc.close()
                        if status != 200:
                            raise RuntimeError(f"{side.label}: Subscribe answered {status}")
                    if per_answer:  # warm-up: one round's worth of reads
                        side.pull_point = ab_pull.create(side.server, TOPIC, headers)
                        ab_pull.get_round(
                            side.server, side.pull_point, TOPIC, per_answer, answers // 4, headers
                        )
                    elif kind == "latency":  # warm-up without a backlog left behind
                        load.run_paced(url, soap.notify(url, TOPIC, ts=soap.TS_MARK), rate, warmup)
                    else:
                        load.run_load(url, _body(kind, url), warmup, headers=headers)  # warm-up
                settle = 1.0 if kind in PUSH_LOADS else 0.3
                for i in range(rounds):
                    order = sides if i % 2 == 0 else sides[::-1]
                    for side in order:
                        if per_answer:
                            us, rps, p50, p99 = ab_pull.get_round(
                                side.server, side.pull_point, TOPIC, per_answer, answers, headers
                            )
                            side.latencies.append((p50, p99))
                        elif kind == "latency":
                            assert consumer is not None
                            us, rps = latency_round(side, consumer, rate, seconds)
                        else:
                            us, rps = measure_round(side, kind, seconds, settle, headers)
                        side.rounds.append((us, rps))
                        label = f"  round {i + 1} {side.label:>14}:"
                        extra = ""
                        if side.latencies:
                            p50, p99 = side.latencies[-1]
                            extra = f"  p50 {p50:6.1f} ms  p99 {p99:6.1f} ms"
                        log(f"{label} {us:7.1f} µs/request {rps:8,.0f} req/s{extra}")
            finally:
                for side in sides:
                    side.server.stop()
                if consumer is not None:
                    consumer.stop()
                mw.stop()
    finally:
        # the caller (a test, an interactive session) gets its CPUs and an unpinned plan back
        cpus.choose(False)
        os.sched_setaffinity(0, affinity)
    return sides


def main() -> None:
    """Entry point of ``python -m bench.ab``."""
    parser = argparse.ArgumentParser(description="A/B: a base commit against the working tree")
    parser.add_argument("--base", default="HEAD", help="commit to compare against (HEAD)")
    parser.add_argument("--adapter", default="embedded")
    parser.add_argument("--load", choices=LOADS, default="notify")
    parser.add_argument("--rounds", type=int, default=8, help="rounds per side")
    parser.add_argument("--seconds", type=float, default=4.0, help="length of one round")
    parser.add_argument(
        "--warmup", type=float, default=2.0, help="seconds of load on each side before round 1"
    )
    parser.add_argument(
        "--auth",
        choices=sorted(AUTH_HEADERS),
        default="none",
        help="give both gateways an admin token and send it (bearer or basic) with each request",
    )
    parser.add_argument(
        "--rate", type=float, default=200.0, help="Notifies/s of the latency load (200)"
    )
    parser.add_argument(
        "--answers", type=int, default=500, help="GetMessages per round of the get loads (500)"
    )
    parser.add_argument(
        "--tree-config",
        default="",
        help="TOML lines for the working tree's gateway only, e.g. "
        "'[tracing]\\nenabled = true' (what a setting costs against the base without it)",
    )
    args = parser.parse_args()
    sides = compare(
        args.base,
        args.adapter,
        args.load,
        args.rounds,
        args.seconds,
        auth=args.auth,
        rate=args.rate,
        tree_config=args.tree_config.replace("\\n", "\n"),
        warmup=args.warmup,
        answers=args.answers,
    )
    (base_us, base_rps), (new_us, new_rps) = (s.medians() for s in sides)
    print(
        f"{args.load} on {args.adapter} (auth {args.auth}), {args.rounds} rounds of "
        f"{args.seconds:g} s per side"
    )
    for side in sides:
        us, rps = side.medians()
        lat = side.latency_medians()
        extra = f", median p50 {lat[0]:.1f} ms, median p99 {lat[1]:.1f} ms" if lat else ""
        print(f"  {side.label:>14}: median {us:7.1f} µs/request, {rps:8,.0f} req/s{extra}")
    print(
        f"  working tree vs base: CPU per request {new_us / base_us - 1:+.1%}, "
        f"requests/s {new_rps / base_rps - 1:+.1%}"
    )
    sys.exit(0)


if __name__ == "__main__":
    main()
