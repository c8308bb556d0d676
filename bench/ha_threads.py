"""Which threads of a gateway spend cluster mode's extra CPU per Notify (docs/performance.md,
"What cluster mode costs, per thread").

``python -m bench.ha_threads --adapter mqtt --notifies 1000`` starts the middleware, a
private PostgreSQL and the two instances of scenario ``ha``'s cost part (one on SQLite,
one in cluster mode, side by side), then gives each, in the order single, cluster,
cluster, single, ``--notifies`` Notifies nobody subscribed to from 8 threads and prints
the CPU per Notify of each of its threads (``/proc/PID/task/TID/schedstat``, in
nanoseconds), named by ``py-spy dump`` (Python does not name the threads of the
operating system; without py-spy they are shown by id).  Also, per thread, the CPU and the
wake-ups per second of each instance idle (``--idle SECONDS``, 5; ``--idle-only`` stops
there): a background thread that wakes up often asks for the GIL each time
(docs/performance.md, "What wakes an idle cluster instance").  A sampling profile cannot
part the two instances' costs this finely on a loaded machine: the threads' own clocks
can.  Loopback only.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from bench import cpus, profile
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
        out[pool_name(names.get(int(task.name), f"tid {task.name}"))] += ns
    return out


def thread_wakeups(pid: int, names: dict[int, str]) -> collections.Counter[str]:
    """Wake-ups per thread name of process ``pid``: its ``voluntary_ctxt_switches``
    (/proc/PID/task/TID/status), the times it gave the processor up to wait (a wait for
    the GIL included), each ended by a wake-up; the machine's preemptions (the
    nonvoluntary ones) are left out, they count the load, not the thread."""
    out: collections.Counter[str] = collections.Counter()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except OSError:
            continue  # ended meanwhile
        switches = int(status.split("\nvoluntary_ctxt_switches:")[1].split()[0])
        out[pool_name(names.get(int(task.name), f"tid {task.name}"))] += switches
    return out


def idle(instance: ha_cost.Instance, mode: str, seconds: float, pyspy: str | None) -> None:
    """Print the CPU and wake-ups per second of each thread of ``instance`` left idle
    for ``seconds`` (a background thread that wakes up often asks for the GIL each time)."""
    pid = instance.pid
    names = thread_names(pid, pyspy)
    cpu0, woke0 = thread_cpu(pid, names), thread_wakeups(pid, names)
    time.sleep(seconds)
    cpu, woke = thread_cpu(pid, names), thread_wakeups(pid, names)
    total_cpu = sum(cpu.values()) - sum(cpu0.values())
    total_woke = sum(woke.values()) - sum(woke0.values())
    print(
        f"{mode}, idle: {total_cpu / 1e6 / seconds:.2f} ms CPU and {total_woke / seconds:.1f} "
        f"wake-ups per second, load {os.getloadavg()[0]:.1f}"
    )
    rows = {name: (woke[name] - woke0.get(name, 0), cpu[name] - cpu0.get(name, 0)) for name in woke}
    for name, (count, ns) in sorted(rows.items(), key=lambda item: -item[1][0]):
        if count or ns:
            print(f"  {count / seconds:8.1f} /s  {ns / 1e6 / seconds:7.3f} ms/s  {name}")


def pool_name(name: str) -> str:
    """A thread's name with a pool's threads as one (``wsnmom-delivery-3``: ``-N``)."""
    return re.sub(r"-\d+$", "-N", name)


def measure(
    instance: ha_cost.Instance,
    mode: str,
    notifies: int,
    pyspy: str | None,
    *,
    deliveries: bool = False,
    record: Path | None = None,
) -> None:
    """One batch of Notifies, nobody's (or with ``deliveries`` to the ten subscriptions of
    the cost topic, waited for until delivered); prints the CPU per Notify (per delivery)
    of each thread.  With ``record``, py-spy samples the thread holding the GIL meanwhile
    and the functions with the most samples are printed (its own cost is in the figures:
    compare only recorded batches with each other)."""
    pid = instance.pid
    names = thread_names(pid, pyspy)
    recorder = instance.recorder
    posts0 = getattr(recorder, "posts", 0)
    sampler = None
    if record is not None and pyspy is not None:
        sampler = subprocess.Popen(
            [
                pyspy,
                "record",
                "--gil",
                "--format",
                "raw",
                "--rate",
                "250",
                "--nonblocking",
                "--pid",
                str(pid),
                "--output",
                str(record),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # py-spy attached
    before, cpu0, t0 = thread_cpu(pid, names), process_cpu_seconds(pid), time.monotonic()
    if deliveries:
        ha_cost.notify_all(instance.server, ha_cost.COST_TOPIC, notifies, first=instance.sent)
        instance.sent += notifies
        instance.delivered(instance.sent * ha_cost.FANOUT)
        count = notifies * ha_cost.FANOUT
    else:
        ha_cost.notify_all(instance.server, ha_cost.NOBODY_TOPIC, notifies)
        count = notifies
    used, wall = process_cpu_seconds(pid) - cpu0, time.monotonic() - t0
    after = thread_cpu(pid, names)
    if sampler is not None:
        sampler.send_signal(signal.SIGINT)  # py-spy writes what it sampled
        sampler.wait(timeout=60)
    unit = "delivery" if deliveries else "Notify"
    posts = getattr(recorder, "posts", 0) - posts0
    print(
        f"{mode}: {used * 1e6 / count:.1f} µs CPU per {unit}, {notifies / wall:.0f} "
        f"Notifies/s, {count / posts if posts else 0:.2f} messages per POST, "
        f"load {os.getloadavg()[0]:.1f}"
    )
    spent = {name: after[name] - before.get(name, 0) for name in after}
    for name, ns in sorted(spent.items(), key=lambda item: -item[1]):
        if ns > 0:
            print(f"  {ns / 1e3 / count:8.1f} µs  {name}")
    if record is not None and record.exists():
        print(profile.summarize(record, 30))


def main() -> None:
    """Entry point of ``python -m bench.ha_threads``."""
    parser = argparse.ArgumentParser(description="cluster mode's CPU per Notify, per thread")
    parser.add_argument("--adapter", default="mqtt", choices=("mqtt", "rabbitmq", "kafka"))
    parser.add_argument("--notifies", type=int, default=1000)
    parser.add_argument(
        "--deliveries", action="store_true", help="Notifies to ten push subscriptions"
    )
    parser.add_argument("--record", type=Path, help="py-spy profiles into this directory")
    parser.add_argument(
        "--idle",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="seconds each instance is watched idle (CPU and wake-ups per thread)",
    )
    parser.add_argument(
        "--idle-only", action="store_true", help="only the idle figures, no Notifies"
    )
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
                        idle(instances[mode], mode, args.idle, pyspy)
                    if args.idle_only:
                        return
                    for n, mode in enumerate(("single", "cluster", "cluster", "single")):
                        raw = args.record / f"{n}-{mode}.txt" if args.record else None
                        measure(
                            instances[mode],
                            mode,
                            args.notifies,
                            pyspy,
                            deliveries=args.deliveries,
                            record=raw,
                        )
                finally:
                    for instance in instances.values():
                        ha_cost.close(mw, instance)
        finally:
            mw.stop()


if __name__ == "__main__":
    main()
