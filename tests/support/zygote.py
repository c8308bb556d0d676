"""A pre-imported forking parent for the suite's gateway starts (a "zygote"; test-only).

A ``wsnmom serve`` start costs about 1 s of CPU on the shared 2-core machine, nearly all of
it imports (Flask, werkzeug, jinja2, waitress, prometheus_client, lxml, core, the frontend),
and the suite starts hundreds.  This program imports them once, then forks a child per
start; the child takes the start's environment, working directory and output file and runs
``python -m wsnmom ARGS`` in the same interpreter (``runpy``), so from the command line on it
is the real start: option parsing, settings from the environment, the store, the adapter,
the listeners, the signal handlers, the exit status.  The client
(:mod:`tests.support.zygote_client`) decides which starts may come from here (the
interpreter's own environment must be this process's) and relays exit statuses.

Run as ``python tests/support/zygote.py STATUS_DIR``; it reads one JSON request a line on
stdin (``argv`` after ``-m wsnmom``, ``env``, ``cwd``, ``log``) and answers each with
``PID SEQ``; when it has reaped a child it writes the child's exit status (``Popen``'s
``returncode``: negative for a signal) to ``STATUS_DIR/SEQ``.  At the end of stdin (the
pytest worker exited, or was killed) it sends SIGTERM (and SIGCONT, for one a test stopped)
to the children still running and exits (removing STATUS_DIR).  It never starts a thread: a
fork copies only the forking thread.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import runpy
import select
import shutil
import signal
import sys
import threading
from typing import Any

#: what a gateway imports before it answers: the command line, the serving path (most of it
#: imported inside functions), the frontend, core and the embedded adapter; a child imports
#: anything else it needs itself, as a real process does
PRELOAD = (
    "wsnmom.cli",
    "wsnmom.serve_command",
    "wsnmom.serving",
    "wsnmom.server",
    "wsnmom.parking",
    "wsnmom.https",
    "wsnmom.soap_frontend.auth",
    "wsnmom.adapters.embedded.adapter",
    "waitress",
)

#: the middleware and store client libraries: imported by the gateways on their middleware
#: only, but harmless to have loaded (no threads, no state until used) and ~0.1-0.2 s each
LIBRARIES = ("pika", "confluent_kafka", "paho.mqtt.client", "psycopg", "psycopg_pool")


def preload() -> None:
    """Import what the children will need.  A module that fails to import is left out: the
    child that needs it imports it again and fails the way a real process would."""
    for name in (*PRELOAD, *LIBRARIES):
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    # the children collect and freeze their start-up heap (wsnmom.gc_tuning); frozen here,
    # the inherited part is neither walked again nor copied by the collector's writes
    gc.collect()
    gc.freeze()


def write_status(status_dir: str, seq: int, code: int) -> None:
    """Publish a child's exit status atomically (the client reads the file once it exists)."""
    partial = os.path.join(status_dir, f".{seq}")
    with open(partial, "w") as f:
        f.write(str(code))
    os.replace(partial, os.path.join(status_dir, str(seq)))


def reap(children: dict[int, int], status_dir: str) -> None:
    """Collect every child that has exited and publish its status."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        seq = children.pop(pid, None)
        if seq is not None:
            write_status(status_dir, seq, os.waitstatus_to_exitcode(status))


def serve(status_dir: str) -> dict[str, Any] | None:
    """Answer requests until the end of stdin (then ``None``); in each forked child it
    returns that child's request instead."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    children: dict[int, int] = {}
    pending = b""
    seq = 0
    while True:
        ready, _, _ = select.select([0, wake_r], [], [])
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(wake_r, 512):
                    pass
            reap(children, status_dir)
        if 0 not in ready:
            continue
        data = os.read(0, 65536)
        if not data:
            break
        pending += data
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            seq += 1
            if threading.active_count() != 1:  # pragma: no cover - a preloaded module's bug
                os.write(1, b"error: the zygote has threads\n")
                continue
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                os.close(wake_r)
                os.close(wake_w)
                return dict(request)
            children[pid] = seq
            os.write(1, f"{pid} {seq}\n".encode())
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
            # a gateway a test stopped (SIGSTOP) acts on the SIGTERM only once continued
            os.kill(pid, signal.SIGCONT)
    return None


def become(request: dict[str, Any]) -> None:
    """In a child: take the start's output file, directory and environment, and run
    ``python -m wsnmom`` with its arguments (raises the command's ``SystemExit``)."""
    out = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    os.close(null)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # what ``python -m`` puts first on the path: the working directory
    sys.path[0] = request["cwd"]
    sys.argv = ["-m", *request["argv"]]
    runpy.run_module("wsnmom", run_name="__main__", alter_sys=True)


def main() -> None:
    status_dir = sys.argv[1]
    preload()
    request = serve(status_dir)
    if request is None:  # the worker is gone: nobody reads the statuses any more
        shutil.rmtree(status_dir, ignore_errors=True)
    else:
        become(request)


if __name__ == "__main__":
    main()
