"""One filter evaluation process as its parent sees it (``core.filter_sandbox``): starting
it, sending a request, reading its verdicts and the CPU seconds it reports (the protocol
of :mod:`wsnmom.core.filter_worker`), and the wall-clock backstop.

The backstop: each verdict may take ``wall_limit`` seconds.  A worker past it that has
used less CPU than its payloads may (``/proc/PID/stat``) is not overrunning: the machine
did not run it (load, or its interpreter starting), so it is waited for, up to
:data:`_PATIENCE` backstops.  Otherwise it is killed and the request fails with
:class:`WorkerDied` (the CPU-time timer in the worker ends real overruns earlier).

Priority: a worker made with ``nice`` > 0 runs that much lower in the kernel's scheduling
order than the gateway (``setpriority(2)`` by the parent as soon as the process exists, so
its interpreter's start is already at that priority): the costly filters' workers, which
the kernel should run only when the gateway and the cheap filters' workers leave it a CPU.
It stays in the gateway's session: where the kernel groups tasks by session (autogroups,
``/proc/PID/autogroup``), its CPU time counts against the gateway's group, which made the
gateway's wake-ups on a CPU shared with other sessions' busy processes a little later (p50
6-8 ms against 3-5 ms without a busy worker, a measurement by hand at load 11-18).  A
session of its own with its autogroup at nice 19 removed that, but then the worker ranked
below every other session's processes too, not only below the gateway: at load 16 a
costly filter's 0.3 s of CPU did not run within 10 s (docs/performance.md, F29).
Such a worker still starved past the patience was not run because it is meant to wait:
the request fails with :class:`WorkerStarved` (the caller tries again later), never as an
overrun.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import select
import signal
import struct
import subprocess
import sys
import time

__all__ = ["Verdict", "Worker", "WorkerDied", "WorkerStarved", "priority_of"]

log = logging.getLogger("wsnmom.core.filter_sandbox")

#: a verdict: True / False, or the text of an evaluation error (counts as no match)
Verdict = bool | str


class _Late:
    """``_Worker._next``'s answer when its deadline passed."""


_LATE = _Late()
#: a worker starved of CPU (its usage under its budget) is waited for up to this many
#: wall-clock limits before it is killed anyway
_PATIENCE = 10
#: CPU seconds a worker may spend starting (the interpreter, lxml) besides its payloads
_START_CPU = 1.0
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_seconds(pid: int) -> float | None:
    """CPU seconds process ``pid`` has used (Linux ``/proc``), None where unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
    except OSError:
        return None
    try:  # utime and stime: fields 14 and 15 of stat(5), 12 and 13 after the name
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (IndexError, ValueError):
        return None


def priority_of(pid: int) -> int | None:
    """The nice value of process ``pid`` (field 19 of ``/proc/PID/stat``), None where
    unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
        return int(fields[16])
    except (OSError, IndexError, ValueError):
        return None


def _lower(pid: int, nice: int) -> None:
    """Rank process ``pid`` (a child) ``nice`` below this one."""
    target = min(19, os.getpriority(os.PRIO_PROCESS, 0) + nice)
    try:
        os.setpriority(os.PRIO_PROCESS, pid, target)
    except OSError as exc:  # pragma: no cover - not refused for one's own children
        log.warning("cannot lower filter worker %s's priority: %s", pid, exc)


class WorkerDied(Exception):
    def __init__(self, index: int, reason: str) -> None:
        super().__init__(reason)
        self.index = index
        self.reason = reason


class WorkerStarved(Exception):
    """A low-priority worker was not run for the whole patience (the machine had better
    things to do): killed, its request not done; ``index`` verdicts came before."""

    def __init__(self, index: int) -> None:
        super().__init__("the low-priority filter worker was not run in time")
        self.index = index


class Worker:
    """One evaluation process; used by one thread at a time.  ``nice``: how much lower
    than the gateway the kernel is to rank it (0: the same)."""

    def __init__(self, memory_mb: int, nice: int = 0) -> None:
        self.memory_mb = memory_mb
        self.nice = max(0, nice)
        self.proc: subprocess.Popen[bytes] | None = None
        self._buffer = b""

    @property
    def low_priority(self) -> bool:
        return self.nice > 0

    def running(self) -> bool:
        """Whether its process exists (started and not ended)."""
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> subprocess.Popen[bytes]:
        """Start the process (replacing an ended one); its interpreter starts meanwhile,
        so a worker started ahead of its first request has it ready."""
        proc = subprocess.Popen(
            [sys.executable, "-m", "wsnmom.core.filter_worker", str(self.memory_mb)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
            bufsize=0,
        )
        assert proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)
        self._buffer = b""
        self.proc = proc
        if self.nice:
            _lower(proc.pid, self.nice)
        return proc

    def kill(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            proc.kill()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not wait
            log.warning("filter worker %s did not end", proc.pid)

    def close(self) -> None:
        """Let the worker end (stdin closed), killing it if it does not."""
        proc = self.proc
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=1)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()

    def evaluate(
        self, request: bytes, count: int, cpu_limit: float, wall_limit: float
    ) -> tuple[list[Verdict], float | None]:
        """The verdicts, and the CPU seconds the worker spent (None if it did not say)."""
        proc = self.proc if self.proc is not None and self.proc.poll() is None else self.start()
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(struct.pack("!I", len(request)) + request)
        except OSError as exc:
            self.kill()
            raise WorkerDied(0, f"the filter worker is gone: {exc}") from exc
        out: list[Verdict] = []
        fd = proc.stdout.fileno()
        cpu_before = _cpu_seconds(proc.pid)
        give_up_at = time.monotonic() + _PATIENCE * wall_limit
        while len(out) < count:
            deadline = time.monotonic() + wall_limit
            verdict = self._next(fd, deadline)
            starved = False  # past the patience, still under its CPU budget
            while verdict is _LATE and self._starved(proc.pid, cpu_before, cpu_limit, len(out)):
                if time.monotonic() >= give_up_at:
                    starved = True
                    break
                verdict = self._next(fd, time.monotonic() + wall_limit)
            if starved and self.low_priority:
                self.kill()  # meant to wait behind the gateway: not an overrun
                raise WorkerStarved(len(out))
            if verdict is None or verdict is _LATE:
                reason = self._death_reason(proc, cpu_limit, wall_limit)
                self.kill()
                raise WorkerDied(len(out), reason)
            if verdict == "M":
                self.kill()
                raise WorkerDied(len(out), "memory")
            if isinstance(verdict, float | _Late):
                self.kill()
                raise WorkerDied(len(out), "exit:protocol")
            out.append(verdict)
        spent = self._next(fd, time.monotonic() + wall_limit)
        return out, spent if isinstance(spent, float) else None

    @staticmethod
    def _starved(pid: int, cpu_before: float | None, cpu_limit: float, done: int) -> bool:
        """Whether a worker past its wall-clock deadline has used less CPU than the
        payloads so far may take: the machine is busy, not the filter (a loaded machine,
        or the interpreter starting, must not end a cheap filter's subscription)."""
        now = _cpu_seconds(pid)
        if now is None or cpu_before is None:
            return False
        return now - cpu_before < cpu_limit * (done + 1) + _START_CPU

    def _next(self, fd: int, deadline: float) -> Verdict | float | _Late | None:
        """The next verdict (a float: the request's CPU seconds), ``_LATE`` when the
        deadline passed, or None when the worker ended."""
        while True:
            buf = self._buffer
            tag = buf[:1]
            if tag in (b"1", b"0", b"M"):
                self._buffer = buf[1:]
                return True if tag == b"1" else False if tag == b"0" else "M"
            if tag == b"T":
                if len(buf) >= 9:
                    self._buffer = buf[9:]
                    return float(struct.unpack("!d", buf[1:9])[0])
            elif tag == b"E":
                if len(buf) >= 3:
                    (n,) = struct.unpack("!H", buf[1:3])
                    if len(buf) >= 3 + n:
                        self._buffer = buf[3 + n :]
                        return buf[3 : 3 + n].decode("utf-8", "replace")
            elif tag:
                return None  # not the protocol: treat the worker as dead
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return _LATE
            if not _readable(fd, remaining):
                return _LATE
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                continue
            except OSError:
                return None
            if not chunk:
                return None
            self._buffer += chunk

    @staticmethod
    def _death_reason(proc: subprocess.Popen[bytes], cpu_limit: float, wall_limit: float) -> str:
        try:
            code = proc.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            return f"wall:{wall_limit:g}"
        if code == -signal.SIGPROF:
            return f"cpu:{cpu_limit:g}"
        if code == -signal.SIGKILL:
            return "killed"
        return f"exit:{code}"


def _readable(fd: int, timeout: float) -> bool:
    """Whether ``fd`` can be read (data, or its end) within ``timeout`` seconds.  Through
    ``poll(2)``: ``select()`` refuses descriptors numbered 1024 and above, which a gateway
    holding many connections gives its new pipes."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0, math.ceil(timeout * 1000))))
