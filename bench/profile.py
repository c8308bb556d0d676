"""Profile the gateway under one benchmark load with py-spy, for the Findings of
docs/performance.md.

``python -m bench.profile --load ingress-100 --adapter embedded --seconds 10`` starts a
gateway, drives the load (``ingress-1``/``ingress-100``: wrk Notify; ``delivery``: Notify to
one push subscription; ``subscribe``: Subscribe requests to pull points;
``subscribe-push``: Subscribes to a push consumer from one client, one after the other, as
the ``ha`` scenario times them), records the server with ``py-spy record --gil`` (samples
of the thread holding the GIL: where CPU time goes in Python) and prints the functions with
the most inclusive and self samples.  ``--cluster`` runs the gateway in cluster mode on a
private PostgreSQL store (the ``ha`` scenario's cost setup); ``--wall`` samples every
thread, idle or not (``py-spy --idle``), and keeps the request threads' samples only: where
a request's wall time goes (store and middleware round trips, waits for locks).  Needs
py-spy (``pip install py-spy``); only ever loads 127.0.0.1.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from bench import client, load, soap
from bench.consumer import ConsumerProcess
from bench.middleware import MIDDLEWARES, Middleware
from bench.server import ServerProcess

LOADS = ("ingress-1", "ingress-100", "delivery", "subscribe", "subscribe-push")


def _frame_name(frame: str) -> str:
    # py-spy raw frames look like "function (path/to/file.py:123)"
    name, _, where = frame.partition(" (")
    path = where.rsplit(":", 1)[0]
    for marker in ("/site-packages/", "/work/main/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{path}:{name}"


#: a frame of a request thread's stack (waitress's worker)
REQUEST_FRAME = "handler_thread"


def summarize(raw: Path, top: int, *, requests_only: bool = False) -> str:
    """Inclusive and self sample shares per function from py-spy's raw (collapsed) output
    (with ``requests_only``, of the request threads' stacks only)."""
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        if requests_only and REQUEST_FRAME not in stack:
            continue
        count = int(count_text)
        frames = [_frame_name(f) for f in stack.split(";")]
        total += count
        for name in set(frames):
            inclusive[name] += count
        own[frames[-1]] += count
    if not total:
        return "no samples"
    what = "of request threads, idle or not" if requests_only else "holding the GIL"
    lines = [f"{total} samples {what}", "", "inclusive:"]
    lines += [f"  {n / total:6.1%}  {name}" for name, n in inclusive.most_common(top)]
    lines += ["", "self:"]
    lines += [f"  {n / total:6.1%}  {name}" for name, n in own.most_common(top)]
    return "\n".join(lines)


def _drive(kind: str, server: ServerProcess, seconds: float, stop: threading.Event) -> None:
    url = server.broker_url
    if kind.startswith("ingress"):
        batch = int(kind.split("-")[1])
        load.run_load(url, soap.notify(url, "profile", messages=batch), seconds)
    elif kind == "delivery":
        load.run_load(url, soap.notify(url, "profile"), seconds)
    elif kind == "subscribe-push":
        kc = client.KeepAliveClient()
        consumer = "http://127.0.0.1:9/never-called"  # nothing is published to its topic
        while not stop.is_set():
            status, _ = kc.post(url, soap.subscribe(url, consumer, "profile-idle"))
            if status != 200:
                raise RuntimeError(f"Subscribe answered {status}")
        kc.close()
    else:
        points, _ = client.run_requests(
            [client.Request(url, soap.create_pull_point(url)) for _ in range(100)], "address"
        )
        addrs = [str(a) for _, a in points]
        n = 0
        while not stop.is_set():
            reqs = [
                client.Request(url, soap.subscribe(url, addrs[i % 100], f"t{i % 1000}"))
                for i in range(n, n + 500)
            ]
            client.run_requests(reqs, "address")
            n += 500


@contextmanager
def _cluster_store(work: Path) -> Iterator[str]:
    """A private PostgreSQL server (the test suite's fixture code) with a fresh database."""
    from tests.fixtures.postgres import PostgresNode, fresh_database

    with ExitStack() as stack:
        node = PostgresNode()
        node.start()
        stack.callback(node.cleanup)
        yield stack.enter_context(fresh_database(node.url))


def main() -> None:
    """Entry point of ``python -m bench.profile``."""
    parser = argparse.ArgumentParser(description="py-spy profile of the gateway under load")
    parser.add_argument("--load", choices=LOADS, default="ingress-100")
    parser.add_argument("--adapter", default="embedded")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--raw", type=Path, help="keep py-spy's collapsed stacks here")
    parser.add_argument(
        "--cluster", action="store_true", help="cluster mode on a private PostgreSQL store"
    )
    parser.add_argument(
        "--wall", action="store_true", help="wall-clock samples of the request threads"
    )
    args = parser.parse_args()
    pyspy = shutil.which("py-spy") or str(Path(__file__).parents[1] / ".venv/bin/py-spy")
    mw: Middleware = next(cls() for cls in MIDDLEWARES if cls.name == args.adapter)
    reason = mw.unavailable()
    if reason:
        parser.error(reason)
    with tempfile.TemporaryDirectory(prefix="wsnmom-profile-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        mw.start(work / "mw")
        consumer = ConsumerProcess().start()
        extra = '[cluster]\ninstance_id = "p0"\n' if args.cluster else ""
        server = ServerProcess(mw.adapter_url(work), work / "server", extra)
        if args.cluster:
            server.store_url = stack.enter_context(_cluster_store(work))
        try:
            server.start()
            if args.load == "delivery":
                url = server.broker_url
                kc = client.KeepAliveClient()
                kc.post(url, soap.subscribe(url, consumer.base_url + "/c/0", "profile"))
                kc.close()
            stop = threading.Event()
            driver = threading.Thread(
                target=_drive, args=(args.load, server, args.seconds + 3, stop)
            )
            driver.start()
            time.sleep(1.5)
            raw = args.raw or work / "profile.txt"
            subprocess.run(
                [
                    pyspy,
                    "record",
                    "--idle" if args.wall else "--gil",
                    "--format",
                    "raw",
                    "--rate",
                    "200",
                    "--duration",
                    str(int(args.seconds)),
                    "--pid",
                    str(server.pid),
                    "--output",
                    str(raw),
                    "--nonblocking",
                ],
                capture_output=True,
                check=True,
            )
            stop.set()
            driver.join()
            print(summarize(raw, args.top, requests_only=args.wall))
        finally:
            server.stop()
            consumer.stop()
            mw.stop()


if __name__ == "__main__":
    main()
