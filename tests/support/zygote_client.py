"""Gateway starts forked from a pre-imported parent (:mod:`tests.support.zygote`).

:func:`spawn` starts a ``python -m wsnmom ...`` command as a child of the pytest worker's
zygote when it may (:meth:`Zygote.accepts`) and returns a :class:`ForkedProcess`, the part
of :class:`subprocess.Popen` that :class:`wsnmom.testing.gateway.Gateway` and the tests use
(``pid``, ``poll``, ``wait``, ``send_signal``, ``terminate``, ``kill``, ``returncode``); it
returns ``None`` when the start must be a process of its own.  A start may come from the
zygote when the interpreter would start the same way: the same executable, ``-m wsnmom``,
and the same values of the variables the interpreter and the C libraries read when a
process starts (``PYTHON*``, ``LD_*``, the locale, ``TZ``...).  A test that puts a
``sitecustomize`` on the gateway's ``PYTHONPATH`` (the kill points, the import check) gets a
real process that way.  ``WSNMOM_TEST_FORK_GATEWAYS=0`` turns the zygote off.

The zygote starts on the first forked start of a worker and ends with the worker (the end
of its stdin: it then sends SIGTERM to any child still running).  The tests of starting
itself (``tests/ops/test_serve_startup.py``, ``tests/testing/test_gateway.py``) run real
processes: they do not use the suite's ``PatientGateway``.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["ForkedProcess", "Zygote", "spawn", "started"]

PROGRAM = Path(__file__).with_name("zygote.py")

#: environment variables read when an interpreter (or a C library in it) starts: a start
#: whose values differ from the zygote's cannot be forked from it
INTERPRETER_PREFIXES = ("PYTHON", "LD_", "LC_", "MALLOC", "COV_", "COVERAGE")
INTERPRETER_VARIABLES = frozenset({"LANG", "LANGUAGE", "TZ", "OPENSSL_CONF", "SSL_CERT_FILE"})

#: how long the zygote may take to publish the status of a child that has exited
REAP_GRACE = 10.0

#: the starts of this process so far: "forked" and "process" (for the run's summary)
started = {"forked": 0, "process": 0}


def _interpreter_variables(env: Mapping[str, str]) -> dict[str, str]:
    return {
        k: v
        for k, v in env.items()
        if k.startswith(INTERPRETER_PREFIXES) or k in INTERPRETER_VARIABLES
    }


class ForkedProcess:
    """A gateway forked by the zygote, seen as :class:`subprocess.Popen` sees its child.
    Its exit is seen through a process file descriptor (Linux 5.3+) and its status read
    from the file the zygote writes once it has reaped it."""

    def __init__(self, args: Sequence[str], pid: int, status: Path) -> None:
        self.args = list(args)
        self.pid = pid
        self.returncode: int | None = None
        self._status = status
        self._pidfd: int | None = None
        with contextlib.suppress(OSError):  # already exited and reaped: the status tells
            self._pidfd = os.pidfd_open(pid)

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                self.returncode = int(self._status.read_text())
            except FileNotFoundError:
                return None
            self._status.unlink(missing_ok=True)
            self._close_pidfd()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.poll() is not None:
            return self.returncode  # type: ignore[return-value]
        if self._pidfd is not None:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            readable, _, _ = select.select([self._pidfd], [], [], left)
            if not readable:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            # it has exited: the zygote publishes the status once it has reaped it
            deadline = time.monotonic() + REAP_GRACE
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(0.01)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        if self.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            if self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, sig)
            else:
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _close_pidfd(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def __del__(self) -> None:
        self._close_pidfd()


class Zygote:
    """The zygote process of this pytest worker and the requests to it."""

    def __init__(self) -> None:
        self.status_dir = Path(tempfile.mkdtemp(prefix="wsnmom-zygote-"))
        # what a gateway started by this worker inherits (Gateway.environment)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("WSNMOM_TEST_")}
        self._lock = threading.Lock()
        self.process = subprocess.Popen(
            [sys.executable, str(PROGRAM), str(self.status_dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=self.env,
        )

    def accepts(self, command: Sequence[str], env: Mapping[str, str]) -> bool:
        """Whether ``command`` with ``env`` starts the way a child of the zygote would."""
        return list(command[:3]) == [sys.executable, "-m", "wsnmom"] and (
            _interpreter_variables(env) == _interpreter_variables(self.env)
        )

    def spawn(
        self, command: Sequence[str], env: Mapping[str, str], log: Path
    ) -> ForkedProcess | None:
        """Fork ``command`` (``python -m wsnmom ARGS``), its output appended to ``log``;
        ``None`` when the zygote is gone."""
        request = {"argv": list(command[3:]), "env": dict(env), "cwd": os.getcwd()}
        line = json.dumps({**request, "log": str(log)}).encode() + b"\n"
        assert self.process.stdin is not None and self.process.stdout is not None
        with self._lock:
            try:
                self.process.stdin.write(line)
                self.process.stdin.flush()
                answer = self.process.stdout.readline().decode()
            except (BrokenPipeError, ValueError):
                return None
        pid, _, seq = answer.partition(" ")
        if not seq.strip().isdigit():
            return None
        return ForkedProcess(command, int(pid), self.status_dir / seq.strip())

    def close(self) -> None:
        """End the zygote (children still running get SIGTERM from it)."""
        with contextlib.suppress(OSError):
            if self.process.stdin is not None:
                self.process.stdin.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
        shutil.rmtree(self.status_dir, ignore_errors=True)


_zygote: Zygote | None = None
_zygote_lock = threading.Lock()


def _worker_zygote() -> Zygote:
    global _zygote
    with _zygote_lock:
        if _zygote is None or _zygote.process.poll() is not None:
            _zygote = Zygote()
            atexit.register(_zygote.close)
        return _zygote


def spawn(command: Sequence[str], env: Mapping[str, str], log: Path) -> ForkedProcess | None:
    """Fork ``command`` from this worker's zygote when it may be (see the module
    docstring); ``None``: start it as a process of its own."""
    if os.environ.get("WSNMOM_TEST_FORK_GATEWAYS", "1") == "0" or not hasattr(os, "pidfd_open"):
        started["process"] += 1
        return None
    zygote = _worker_zygote()
    forked = zygote.spawn(command, env, log) if zygote.accepts(command, env) else None
    started["forked" if forked is not None else "process"] += 1
    return forked
