"""Which threads of a gateway spend cluster mode's extra CPU per Notify (docs/performance.md,
"What cluster mode costs, per thread").

``python -m bench.ha_threads --adapter mqtt --notifies 1000`` starts the middleware, a
private PostgreSQL and the two instances of scenario ``ha``'s cost part (one on SQLite,
one in cluster mode, side by side), then gives each, in the order single, cluster,
cluster, single, ``--notifies`` Notifies nobody subscribed to from 8 threads and prints
the CPU per Notify of each of its threads (``/proc/PID/task/TID/schedstat``, in
nanoseconds), named by ``py-spy dump`` (Python does not name the threads of the
operating system; without py-spy they are shown by id).  Also the CPU per second of each
instance idle.  A sampling profile cannot part the two instances' costs this finely on a
loaded machine: the threads' own clocks can.  Loopback only.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from bench import cpus
from bench.ha_rig import Recorder
from bench.ha_rig import postgres as _postgres
from bench.middleware import MIDDLEWARES, Middleware
from bench.scenarios import ha_cost
from bench.scenarios.base import Context
from bench.util import process_cpu_seconds

_THREAD = re.compile(r'Thread (\S+) \([a-z]+\): "([^"]*)"')


def thread_names(pid: int, pyspy: str | None) -> dict[int, str]:
    """Operating-system thread id -> Python thread name (empty without py-spy)."""
    if pyspy is None:
        return {}
    dump = subprocess.run(
        [pyspy, "dump", "--pid", str(pid)], capture_output=True, text=True, check=False
    ).stdout
    return {int(tid, 0): name for tid, name in _THREAD.findall(dump)}


def thread_cpu(pid: int, names: dict[int, str]) -> collections.Counter[str]:
    """CPU nanoseconds per thread name (threads of one name summed) of process ``pid``."""
    out: collections.Counter[str] = collections.Counter()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            ns = int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # ended meanwhile
        name = names.get(int(task.name), f"tid {task.name}")
        out[re.sub(r"-\d+$", "-N", name)] += ns  # the pool's threads as one
    return out


def measure(instance: ha_cost.Instance, mode: str, notifies: int, pyspy: str | None) -> None:
    """One batch of Notifies nobody subscribed to; prints CPU per Notify per thread."""
    pid = instance.pid
    names = thread_names(pid, pyspy)
    before, cpu0, t0 = thread_cpu(pid, names), process_cpu_seconds(pid), time.monotonic()
    ha_cost.notify_all(instance.server, ha_cost.NOBODY_TOPIC, notifies)
    used, wall = process_cpu_seconds(pid) - cpu0, time.monotonic() - t0
    after = thread_cpu(pid, names)
    print(
        f"{mode}: {used * 1e6 / notifies:.0f} µs CPU per Notify, {notifies / wall:.0f} "
        f"Notifies/s, load {os.getloadavg()[0]:.1f}"
    )
    spent = {name: after[name] - before.get(name, 0) for name in after}
    for name, ns in sorted(spent.items(), key=lambda item: -item[1]):
        if ns > 0:
            print(f"  {ns / 1e3 / notifies:8.1f} µs  {name}")


def main() -> None:
    """Entry point of ``python -m bench.ha_threads``."""
    parser = argparse.ArgumentParser(description="cluster mode's CPU per Notify, per thread")
    parser.add_argument("--adapter", default="mqtt", choices=("mqtt", "rabbitmq", "kafka"))
    parser.add_argument("--notifies", type=int, default=1000)
    args = parser.parse_args()
    found = shutil.which("py-spy") or str(Path(__file__).parents[1] / ".venv/bin/py-spy")
    pyspy = found if Path(found).exists() else None
    mw: Middleware = next(cls() for cls in MIDDLEWARES if cls.name == args.adapter)
    reason = mw.unavailable()
    if reason:
        parser.error(reason)
    cpus.choose(True)
    cpus.pin_bench_to_clients()
    with tempfile.TemporaryDirectory(prefix="wsnmom-ha-threads-") as tmp:
        work = Path(tmp)
        mw.start(work / "mw")
        try:
            ctx = Context(quick=True, workdir=work, log=print)
            with _postgres(ctx) as store:
                instances: dict[str, ha_cost.Instance] = {}
                try:
                    for mode in ha_cost.MODES:
                        instances[mode] = ha_cost.start(ctx, mw, store, mode, Recorder)
                        instances[mode].warm_up(50)
                    for mode in ha_cost.MODES:
                        cpu0 = process_cpu_seconds(instances[mode].pid)
                        time.sleep(5)
                        idle = process_cpu_seconds(instances[mode].pid) - cpu0
                        print(f"{mode}, idle: {idle * 200:.1f} ms CPU per second")
                    for mode in ("single", "cluster", "cluster", "single"):
                        measure(instances[mode], mode, args.notifies, pyspy)
                finally:
                    for instance in instances.values():
                        ha_cost.close(mw, instance)
        finally:
            mw.stop()


if __name__ == "__main__":
    main()
