"""Run ``wsnmom serve`` as a subprocess for start-up tests: to completion (a start-up
failure) or until ready (``/readyz``), with a private data directory."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import requests

from wsnmom.testing.gateway import PORT_ATTEMPTS, PORT_IN_USE, free_port, listens_on

__all__ = [
    "free_port",
    "run_serve",
    "run_serve_on_a_free_port",
    "run_slowed_serve",
    "running_serve",
    "serve_env",
]


def serve_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment without WSNMOM_* settings of the caller, data under ``home``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WSNMOM_")}
    env.update(XDG_DATA_HOME=str(home / "xdg"), HOME=str(home), **extra)
    return env


def run_serve(
    args: list[str], env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``wsnmom serve ARGS`` expected to stop by itself (a start-up failure).  ``timeout``
    is the wait for that outcome, not a bound of the start-up: at load 34 a start took
    over 27 s before it even tried its middleware."""
    return subprocess.run(
        [sys.executable, "-m", "wsnmom", "serve", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_serve_on_a_free_port(
    args: list[str], env: dict[str, str], host: str = "127.0.0.1", timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``run_serve`` with ``--port`` a port free on ``host``, drawn again when the command
    found it in use (``PORT_IN_USE``, up to ``PORT_ATTEMPTS`` tries, as
    ``Gateway.start``): for a failure expected after the listen.  The port is free when
    drawn, not when the command binds it seconds later (its start-up under load), and
    another test's server may take it meanwhile: the test then saw exit status 6 instead
    of the failure it looks for (once, -n 2 at load 24)."""
    for _ in range(PORT_ATTEMPTS - 1):
        result = run_serve([*args, "--port", str(free_port(host))], env, timeout)
        if result.returncode != PORT_IN_USE:
            return result
    return run_serve([*args, "--port", str(free_port(host))], env, timeout)


@contextmanager
def running_serve(
    args: list[str],
    env: dict[str, str],
    port: int,
    timeout: float = 30,
    cwd: Path | None = None,
) -> Iterator[subprocess.Popen[str]]:
    """``wsnmom serve --port PORT ARGS`` until the block ends (SIGTERM); fails when it does
    not become ready."""
    process = subprocess.Popen(
        [sys.executable, "-m", "wsnmom", "serve", "--port", str(port), *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                out = process.stdout.read() if process.stdout else ""
                raise AssertionError(f"wsnmom serve exited with {process.returncode}:\n{out}")
            try:
                answered = requests.get(f"http://127.0.0.1:{port}/readyz", timeout=5).ok
            except requests.RequestException:
                answered = False
            if answered and listens_on(process.pid, port):  # not another gateway on the port
                break
            if time.monotonic() > deadline:
                raise AssertionError("wsnmom serve did not become ready")
            time.sleep(0.1)
        yield process
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)


#: ``python -c`` that runs ``wsnmom`` with the seams of :func:`run_slowed_serve`
_SLOWED = """
import sys, time
import wsnmom.server, wsnmom.serving
if {no_first_attempt}:
    wsnmom.server.FIRST_ATTEMPT = 0.0
tune = wsnmom.serving.gc_tuning.tune
def slow_tune():
    time.sleep({before_serving})
    tune()
wsnmom.serving.gc_tuning.tune = slow_tune
info = wsnmom.serving.log.info
def slow(message, *args, **kwargs):
    if message.startswith("wsnmom broker at"):
        time.sleep(1.0)
    info(message, *args, **kwargs)
wsnmom.serving.log.info = slow
from wsnmom.cli import main
sys.argv[0] = "wsnmom"
main()
"""


def run_slowed_serve(
    args: list[str],
    env: dict[str, str],
    *,
    no_first_attempt: bool = False,
    before_serving: float = 0.0,
) -> subprocess.CompletedProcess[str]:
    """:func:`run_serve` with the start slowed where a stop can race it, as at load 20-30:
    ``before_serving`` seconds before serve installs its signal handlers, and a second
    while it writes its "broker at" line; ``no_first_attempt``: the first attempt at the
    middleware gets no time (the background connector finds what it finds)."""
    code = _SLOWED.format(no_first_attempt=no_first_attempt, before_serving=before_serving)
    return subprocess.run(
        [sys.executable, "-c", code, "serve", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
