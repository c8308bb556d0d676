"""Bounded evaluation of MessageContent filters: in separate processes, off the request
threads, with a CPU-time and a memory budget per message.

Why processes: a filter is evaluated by libxml2 (and, when an operator enables them, by
Python's ``re`` for the EXSLT regular-expression functions).  A thread evaluating a
costly expression cannot be interrupted, and ``re`` holds the GIL: two subscriptions with
``re:test(string(.), '^(a+)+$')`` and one 30-byte message froze every thread of the
gateway, ``/healthz`` included.  A worker process (:mod:`wsnmom.core.filter_worker`) can
be bounded and ended:

* each message's parse and evaluation may take ``filters.cpu_limit`` seconds of CPU; the
  worker arms a CPU-time timer whose signal the kernel acts on (the process ends even in
  the middle of a regular expression), and the parent gives up waiting after a wall-clock
  backstop (``4 x cpu_limit``, at least ``cpu_limit + 2 s``) and kills it;
* the worker's address space is limited to ``filters.memory`` MiB.

A message that exceeds a budget raises :class:`FilterBudgetExceeded`: the delivery channel
ends the subscription with a SubscriptionEnd notice and a logged reason
(``core.delivery.EndSubscription``).  The worker is replaced on the next request.

``filters.processes`` workers serve all subscriptions of the process (workers are shared
by every broker in one Python process with the same memory limit, so a test suite starts
them once); a delivery thread borrows one for a batch.  Over time each subscription may
use ``filters.cpu_share`` of one worker (``core.filter_share``): one that used more is
pushed back (``FilterBusy``), one that stays over it for ``filters.over_share_end`` seconds
is ended, a costly one (or one not yet known to be cheap) takes a worker only while
another stays free for cheap filters, and all costly ones together may use
``filters.costly_share`` of one worker.  A pushed-back subscription's verdicts on the head
of its batch are kept, so that no evaluation is done twice.  ``filters.isolation = "inline"``
evaluates in the delivery thread instead (no budget; only for trusted subscribers).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Protocol

from lxml import etree
from wsnmom.core.codec import safe_parse
from wsnmom.core.filter_share import FilterBusy, FilterShareExceeded, FilterShares
from wsnmom.core.filter_worker import xpath_boolean

__all__ = [
    "ContentEvaluator",
    "FilterBudgetExceeded",
    "FilterBusy",
    "FilterExpression",
    "InlineEvaluator",
    "SandboxEvaluator",
    "Verdict",
]

log = logging.getLogger(__name__)

#: a verdict: True / False, or the text of an evaluation error (counts as no match)
Verdict = bool | str


class FilterBudgetExceeded(Exception):
    """Evaluating a filter on one message exceeded its CPU-time or memory budget."""

    def __init__(self, reason: str, index: int = 0, *, cause: str = "filter") -> None:
        super().__init__(reason)
        self.reason = reason
        #: the payload (of the batch evaluated) that exceeded the budget
        self.index = index
        #: "filter": one message's budget; "filter_share": the share over time
        self.cause = cause


class FilterExpression(Protocol):
    """What an evaluator needs of a compiled filter (``core.filters.MessageContentFilter``)."""

    @property
    def text(self) -> str: ...

    @property
    def namespace_items(self) -> tuple[tuple[str, str], ...]: ...

    @property
    def exslt_regex(self) -> bool: ...

    def compiled(self) -> etree.XPath:
        """This thread's compiled copy (inline evaluation)."""


class ContentEvaluator(Protocol):
    """Evaluates MessageContent filters on payloads."""

    def evaluate(
        self, expression: FilterExpression, payloads: Sequence[bytes], key: str | None = None
    ) -> list[Verdict]:
        """One verdict per payload; raises :class:`FilterBudgetExceeded`.  ``key`` (a
        subscription) is charged the time; it may raise :class:`FilterBusy` then."""

    def ready(self, key: str) -> None:
        """Raise :class:`FilterBusy` when ``key`` would be refused now (checked before its
        messages are decoded)."""

    def close(self) -> None:
        """Release what the evaluator holds."""


class InlineEvaluator:
    """Evaluates in the calling thread (``filters.isolation = "inline"``): no budget."""

    def evaluate(
        self, expression: FilterExpression, payloads: Sequence[bytes], key: str | None = None
    ) -> list[Verdict]:
        """One verdict per payload (``key`` is not charged: no budget)."""
        xpath = expression.compiled()
        out: list[Verdict] = []
        for payload in payloads:
            try:
                out.append(xpath_boolean(xpath(safe_parse(payload))))
            except (etree.XPathError, etree.XMLSyntaxError) as exc:
                out.append(str(exc) or type(exc).__name__)
        return out

    def ready(self, key: str) -> None:
        """Never refused (no budget)."""

    def close(self) -> None:
        """Nothing to release."""


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


class _WorkerDied(Exception):
    def __init__(self, index: int, reason: str) -> None:
        super().__init__(reason)
        self.index = index
        self.reason = reason


class _Worker:
    """One evaluation process; used by one thread at a time."""

    def __init__(self, memory_mb: int) -> None:
        self.memory_mb = memory_mb
        self.proc: subprocess.Popen[bytes] | None = None
        self._buffer = b""

    def _start(self) -> subprocess.Popen[bytes]:
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
        proc = self.proc if self.proc is not None and self.proc.poll() is None else self._start()
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(struct.pack("!I", len(request)) + request)
        except OSError as exc:
            self.kill()
            raise _WorkerDied(0, f"the filter worker is gone: {exc}") from exc
        out: list[Verdict] = []
        fd = proc.stdout.fileno()
        cpu_before = _cpu_seconds(proc.pid)
        give_up_at = time.monotonic() + _PATIENCE * wall_limit
        while len(out) < count:
            deadline = time.monotonic() + wall_limit
            verdict = self._next(fd, deadline)
            while verdict is _LATE and self._starved(proc.pid, cpu_before, cpu_limit, len(out)):
                if time.monotonic() >= give_up_at:
                    break
                verdict = self._next(fd, time.monotonic() + wall_limit)
            if verdict is None or verdict is _LATE:
                reason = self._death_reason(proc, cpu_limit, wall_limit)
                self.kill()
                raise _WorkerDied(len(out), reason)
            if verdict == "M":
                self.kill()
                raise _WorkerDied(len(out), "memory")
            if isinstance(verdict, float | _Late):
                self.kill()
                raise _WorkerDied(len(out), "exit:protocol")
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
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
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


def _describe(reason: str, cpu_limit: float, memory_mb: int) -> str:
    kind, _, value = reason.partition(":")
    if kind == "cpu":
        return (
            f"evaluating the MessageContent filter on one message took more than {value} s "
            "of CPU (filters.cpu_limit)"
        )
    if kind == "wall":
        return (
            f"evaluating the MessageContent filter on one message did not finish within "
            f"{value} s (filters.cpu_limit {cpu_limit:g} s of CPU)"
        )
    if kind == "memory":
        return (
            f"evaluating the MessageContent filter on one message needed more than "
            f"{memory_mb} MiB of memory (filters.memory)"
        )
    return f"the filter evaluation process ended unexpectedly ({reason})"


class _Pool:
    """Worker processes with one memory limit, shared by every evaluator using it."""

    def __init__(self, memory_mb: int) -> None:
        self.memory_mb = memory_mb
        self.idle: list[_Worker] = []
        self.size = 0
        self._lock = threading.Lock()
        self._free = threading.Condition(self._lock)
        #: threads waiting for a worker that are not heavy (heavy ones yield to them)
        self._light_waiting = 0
        self._all: list[_Worker] = []

    def grow(self, processes: int) -> None:
        with self._lock:
            while self.size < processes:
                worker = _Worker(self.memory_mb)
                self._all.append(worker)
                self.idle.append(worker)
                self.size += 1
                self._free.notify()

    def take(self) -> _Worker:
        """A worker, waiting for one to be free."""
        with self._free:
            self._light_waiting += 1
            try:
                while not self.idle:
                    self._free.wait()
                return self.idle.pop()
            finally:
                self._light_waiting -= 1

    def take_heavy(self) -> _Worker | None:
        """A worker for a heavy key, or None: only while another stays free (with one
        worker: only while nobody else waits)."""
        with self._free:
            if not self._heavy_may_take():
                return None
            return self.idle.pop()

    def heavy_may_take(self) -> bool:
        """Whether :meth:`take_heavy` would find a worker now."""
        with self._free:
            return self._heavy_may_take()

    def _heavy_may_take(self) -> bool:
        reserve = 1 if self.size > 1 else 0
        return len(self.idle) > reserve and not self._light_waiting

    def give_back(self, worker: _Worker) -> None:
        with self._free:
            self.idle.append(worker)
            self._free.notify_all()

    def close(self) -> None:
        with self._lock:
            workers, self._all = self._all, []
        for worker in workers:
            worker.close()


_POOLS: dict[int, _Pool] = {}
_POOLS_LOCK = threading.Lock()


def _pool(memory_mb: int, processes: int) -> _Pool:
    with _POOLS_LOCK:
        pool = _POOLS.get(memory_mb)
        if pool is None:
            pool = _POOLS[memory_mb] = _Pool(memory_mb)
    pool.grow(processes)
    return pool


def _digest(payload: bytes) -> bytes:
    return hashlib.blake2b(payload, digest_size=16).digest()


@atexit.register
def _close_pools() -> None:
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for pool in pools:
        pool.close()


class SandboxEvaluator:
    """Evaluates in worker processes with a CPU-time and memory budget per message."""

    #: keys whose partly evaluated batch is kept at most (then they are all dropped)
    MAX_KEPT = 10_000

    def __init__(
        self,
        *,
        cpu_limit: float,
        memory_mb: int,
        processes: int,
        cpu_share: float = 0.1,
        costly_share: float | None = None,
        over_share_end: float = 0.0,
    ) -> None:
        self.cpu_limit = cpu_limit
        self.memory_mb = memory_mb
        self.wall_limit = max(4 * cpu_limit, cpu_limit + 2.0)
        self._pool = _pool(memory_mb, processes)
        #: each subscription's recent use of the workers (``filters.cpu_share``) and the
        #: costly ones' together (``filters.costly_share``)
        self.shares = FilterShares(
            cpu_share,
            heavy_cost=cpu_limit / 10,
            group_share=costly_share,
            burst=cpu_limit,
            end_after=over_share_end,
        )
        #: a pushed-back key's verdicts on the head of its batch: (payload digest,
        #: verdict), reused when the same payloads come again (no evaluation is wasted)
        self._kept: dict[str, list[tuple[bytes, Verdict]]] = {}
        self._kept_lock = threading.Lock()

    def ready(self, key: str) -> None:
        """Raise :class:`FilterBusy` when ``key`` would be refused a process now (before
        its messages are decoded for nothing), :class:`FilterBudgetExceeded` when it is to
        be ended."""
        if self._check(key) and not self._pool.heavy_may_take():
            raise FilterBusy(max(0.1, 4 * self.shares.cost(key)))

    def _check(self, key: str) -> bool:
        try:
            return self.shares.check(key)
        except FilterShareExceeded as exc:
            raise FilterBudgetExceeded(exc.reason, cause="filter_share") from None

    def evaluate(
        self, expression: FilterExpression, payloads: Sequence[bytes], key: str | None = None
    ) -> list[Verdict]:
        """One verdict per payload; raises :class:`FilterBudgetExceeded` for the first
        payload that exceeds a budget (the verdicts before it are lost with it), and
        :class:`FilterBusy` when ``key`` used its share or is heavy and no worker is free
        for it (see the module docstring); the verdicts reached by then are kept and
        reused when the same payloads are evaluated again."""
        if not payloads:
            return []
        if key is None:
            return self._evaluate(expression, payloads, self._pool.take())[0]
        out = self._resume(key, payloads)
        while len(out) < len(payloads):
            try:
                heavy = self._check(key)
                worker = self._pool.take_heavy() if heavy else self._pool.take()
                if worker is None:
                    # each try decodes the channel's batch again: not more often than a
                    # few of its messages would take to evaluate
                    raise FilterBusy(max(0.1, 4 * self.shares.cost(key)))
            except FilterBusy:
                self._keep(key, payloads, out)
                raise
            n = 1 if heavy else len(payloads) - len(out)
            started = time.monotonic()
            spent: float | None = None
            try:
                verdicts, spent = self._evaluate(
                    expression, payloads[len(out) : len(out) + n], worker
                )
                out += verdicts
            except FilterBudgetExceeded as exc:
                exc.index += len(out)
                raise
            finally:
                # the worker's CPU time: on a loaded machine the wall time of a cheap
                # filter's round trip can exceed a costly filter's threshold
                if spent is None:  # the worker died: it cannot have used more than this
                    spent = min(time.monotonic() - started, self.cpu_limit * n)
                self.shares.charge(key, spent, n, heavy=heavy)
        return out

    def _resume(self, key: str, payloads: Sequence[bytes]) -> list[Verdict]:
        """The kept verdicts of ``key`` that match the head of ``payloads``."""
        with self._kept_lock:
            kept = self._kept.pop(key, None)
        out: list[Verdict] = []
        for (digest, verdict), payload in zip(kept or (), payloads, strict=False):
            if digest != _digest(payload):
                break
            out.append(verdict)
        return out

    def _keep(self, key: str, payloads: Sequence[bytes], out: list[Verdict]) -> None:
        if not out:
            return
        with self._kept_lock:
            if len(self._kept) >= self.MAX_KEPT:
                self._kept.clear()
            self._kept[key] = [(_digest(p), v) for p, v in zip(payloads, out, strict=False)]

    def _evaluate(
        self, expression: FilterExpression, payloads: Sequence[bytes], worker: _Worker
    ) -> tuple[list[Verdict], float | None]:
        """Evaluate on ``worker`` (taken from the pool; given back here): the verdicts and
        the worker's CPU seconds."""
        try:
            request = pickle.dumps(
                (
                    expression.text,
                    expression.namespace_items,
                    expression.exslt_regex,
                    self.cpu_limit,
                    list(payloads),
                ),
                protocol=pickle.HIGHEST_PROTOCOL,
            )
            return worker.evaluate(request, len(payloads), self.cpu_limit, self.wall_limit)
        except _WorkerDied as exc:
            raise FilterBudgetExceeded(
                _describe(exc.reason, self.cpu_limit, self.memory_mb), exc.index
            ) from None
        finally:
            self._pool.give_back(worker)

    def close(self) -> None:
        """The workers are shared and live as long as the process (see the module
        docstring); nothing to release per evaluator."""
