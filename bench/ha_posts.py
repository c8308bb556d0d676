"""Where cluster mode's CPU per delivery goes (docs/performance.md, "MQTT cluster mode: CPU
per delivery"): the cost part of scenario ``ha`` with the consumer's posts counted, and
optionally a py-spy profile per mode grouped by stage.

``python -m bench.ha_posts --adapter mqtt --notifies 1500 --profile`` starts the middleware
and a private PostgreSQL (as scenario ``ha`` does), then for one instance on SQLite and one
in cluster mode: ten push subscriptions, ``--notifies`` Notifies from 8 threads, and prints
the process CPU, the posts the consumer received and the messages per post; with
``--profile`` (needs ``py-spy``) the samples holding the GIL per stage (PUBLISH decoding,
the hand-off to core, the posts, ...).  Loopback only.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from bench import client, soap
from bench.ha_rig import Post, Posts
from bench.ha_rig import post as _post
from bench.ha_rig import postgres as _postgres
from bench.middleware import MIDDLEWARES, Middleware
from bench.scenarios.base import Context
from bench.server import ServerProcess
from bench.util import process_cpu_seconds, wait_until

TOPIC = "ha-posts"
FANOUT = 10

#: stage -> frames that mark it (the first stage whose frame a stack holds counts it)
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("PUBLISH decoding (paho's Properties)", ("decode_publish",)),
    ("hand-off to core (on_message, channel queue, wake-up)", ("_handle_on_message", "published")),
    ("PUBLISH decoding (wsnmom's subscriber)", ("sub_codec", "sub_fields")),
    ("HTTP posts to the consumer", ("_Pusher.send",)),
    ("prepare (decode, filters)", ("Channel._prepare",)),
    ("settling, PUBACK", ("Delivery.ack", "_settle", "Channel._after_send")),
    ("network reads (recv, select)", ("Hub._run", "loop_read", "SessionClient._read")),
    ("Notify requests", ("waitress",)),
    ("single instance: ingest, queues", ("ingest", "embedded")),
    ("delivery workers, other", ("DeliveryEngine._work",)),
)


class Counting:
    """A consumer on a free loopback port counting posts and the messages they carry."""

    def __init__(self) -> None:
        self.messages = 0
        self.posts = 0
        self._lock = threading.Lock()
        self._posts = Posts(self._record)

    def _record(self, post: Post) -> None:
        with self._lock:
            self.messages += len(post.seqs)
            self.posts += 1

    @property
    def address(self) -> str:
        return self._posts.address()

    def close(self) -> None:
        self._posts.close()


def stages(raw: Path) -> list[tuple[str, int, float]]:
    """(stage, samples, share) from py-spy's raw output, largest first."""
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        total += int(n)
        name = next((s for s, marks in STAGES if any(m in stack for m in marks)), "other")
        counts[name] += int(n)
    return [(name, n, n / total) for name, n in counts.most_common()] if total else []


def _notify_all(server: ServerProcess, count: int) -> None:
    url = server.broker_url
    requests = [client.Request(url, soap.notify(url, TOPIC, seq0=i)) for i in range(count)]
    answers, _ = client.run_requests(requests, processes=1, threads=8)
    if any(not 200 <= status < 300 for status, _ in answers):
        raise RuntimeError("a Notify was refused")


def measure(
    mw: Middleware, mode: str, store: str, work: Path, notifies: int, pyspy: str | None
) -> None:
    adapter = mw.adapter_url(work / f"a-{mode}")
    extra = '[cluster]\ninstance_id = "c0"\n' if mode == "cluster" else ""
    server = ServerProcess(adapter, work / f"s-{mode}", extra)
    if mode == "cluster":
        server.store_url = store
    consumer = Counting()
    try:
        server.start()
        assert server.pid is not None
        kc = client.KeepAliveClient()
        for _ in range(FANOUT):
            _post(server, soap.subscribe(server.broker_url, consumer.address, TOPIC), kc)
        kc.close()
        _notify_all(server, 50)  # warm up
        wait_until(lambda: consumer.messages >= 50 * FANOUT, 60, poll=0.01)
        messages, posts = consumer.messages, consumer.posts
        spy = None
        raw = work / f"profile-{mode}.txt"
        if pyspy is not None:
            command = [pyspy, "record", "--gil", "--format", "raw", "--rate", "250"]
            command += ["--pid", str(server.pid), "--output", str(raw), "--nonblocking"]
            spy = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)
        started = process_cpu_seconds(server.pid)
        _notify_all(server, notifies)
        if not wait_until(lambda: consumer.messages - messages >= notifies * FANOUT, 120, 0.01):
            raise RuntimeError("not every message was delivered")
        used = process_cpu_seconds(server.pid) - started
        if spy is not None:
            spy.send_signal(2)
            spy.wait(30)
        got, sent = consumer.messages - messages, consumer.posts - posts
        print(
            f"{mode}: {used:.2f} s CPU for {notifies} Notifies to {FANOUT} subscriptions "
            f"({used * 1000 / got:.3f} ms per delivery, Notify included); {sent} posts, "
            f"{got / sent:.1f} messages each; load {os.getloadavg()[0]:.1f}"
        )
        if spy is not None and raw.exists():
            for name, n, share in stages(raw):
                print(f"  {n:5d} {share:6.1%}  {name}")
    finally:
        consumer.close()
        server.stop()
        mw.release(adapter)


def main() -> None:
    """Entry point of ``python -m bench.ha_posts``."""
    parser = argparse.ArgumentParser(description="posts and CPU of cluster mode per delivery")
    parser.add_argument("--adapter", default="mqtt", choices=("mqtt", "rabbitmq"))
    parser.add_argument("--notifies", type=int, default=1500)
    parser.add_argument("--profile", action="store_true", help="py-spy, grouped by stage")
    args = parser.parse_args()
    pyspy = None
    if args.profile:
        pyspy = shutil.which("py-spy") or str(Path(__file__).parents[1] / ".venv/bin/py-spy")
    mw: Middleware = next(cls() for cls in MIDDLEWARES if cls.name == args.adapter)
    reason = mw.unavailable()
    if reason:
        parser.error(reason)
    with tempfile.TemporaryDirectory(prefix="wsnmom-ha-posts-") as tmp:
        work = Path(tmp)
        mw.start(work / "mw")
        try:
            with _postgres(Context(quick=True, workdir=work, log=print)) as store:
                for mode in ("single", "cluster"):
                    measure(mw, mode, store, work, args.notifies, pyspy)
        finally:
            mw.stop()


if __name__ == "__main__":
    main()
