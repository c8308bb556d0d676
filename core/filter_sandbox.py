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
(``core.delivery.EndSubscription``).  The worker is replaced at once.

Workers are shared by every broker in one Python process with the same memory limit and
costly priority (a test suite starts them once); a delivery thread borrows one for a
batch.  Over time each subscription may use ``filters.cpu_share`` of one worker
(``core.filter_share``): one that used more is pushed back (``FilterBusy``), one that
stays over it for ``filters.over_share_end`` seconds is ended, and all costly ones (and
those not yet known to be cheap) together may use ``filters.costly_share`` of one worker.
A pushed-back subscription's verdicts on the head of its batch are kept, so that no
evaluation is done twice.

Cheap and costly filters never share a worker, and the kernel prefers the cheap ones:

* ``filters.processes`` workers evaluate the cheap filters, at the gateway's priority;
* ``ceil(filters.costly_share)`` (at least one) other workers evaluate the costly ones
  and those not known yet, one message per turn, ``filters.costly_nice`` (19) lower in
  the kernel's scheduling order (``core.filter_process``).  A costly filter never holds
  a worker a cheap one waits for, and on a CPU shared with the gateway it runs when the
  gateway's threads and the cheap filters' workers leave the CPU free.  Before, one pool
  served both: a costly filter took the worker a cheap one had kept warm, the cheap
  one's next batch waited for an interpreter to start (781 ms at load 8), and the costly
  one competed for the CPU as an equal of the gateway (issue 22; docs/performance.md,
  F29).  A costly filter whose low-priority worker was starved past the patience is
  pushed back (``FilterBusy``), not ended;
* every worker's process is started on the pool's first use, and a worker ended by an
  overrun is restarted at once by the caller whose request ended it, so no caller waits
  for a worker's interpreter to start.

``filters.isolation = "inline"`` evaluates in the delivery thread instead (no budget;
only for trusted subscribers).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import math
import pickle
import threading
import time
from collections.abc import Sequence
from typing import Protocol

from lxml import etree
from wsnmom.core.codec import safe_parse
from wsnmom.core.filter_process import Verdict, Worker, WorkerDied, WorkerStarved
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


#: how much lower than the gateway the costly filters' workers run (``filters.costly_nice``)
COSTLY_NICE = 19


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
    """Worker processes with one memory limit and one costly priority, shared by every
    evaluator using them: the cheap filters' workers at the gateway's priority, and the
    costly filters' workers (:attr:`costly_idle`) ``nice`` lower."""

    def __init__(self, memory_mb: int, nice: int) -> None:
        self.memory_mb = memory_mb
        self.nice = nice
        #: the cheap filters' workers not in use
        self.idle: list[Worker] = []
        #: the costly filters' (low-priority) workers not in use
        self.costly_idle: list[Worker] = []
        self.size = 0
        self.costly_size = 0
        self._lock = threading.Lock()
        self._free = threading.Condition(self._lock)
        self._all: list[Worker] = []
        #: id() of each costly filters' worker
        self._costly: set[int] = set()
        self._warm = False

    def grow(self, processes: int, costly: int) -> None:
        with self._lock:
            while self.size < processes:
                worker = Worker(self.memory_mb)
                self._all.append(worker)
                self.idle.append(worker)
                self.size += 1
            while self.costly_size < costly:
                worker = Worker(self.memory_mb, self.nice)
                self._all.append(worker)
                self._costly.add(id(worker))
                self.costly_idle.append(worker)
                self.costly_size += 1
            self._free.notify_all()
        if self._warm:
            self.warm(again=True)

    def warm(self, *, again: bool = False) -> None:
        """Start every idle worker's process that is not running (once, on the pool's
        first use, unless ``again``): a cheap filter must never wait for an interpreter to
        start because a costly one took the worker that was running."""
        if self._warm and not again:
            return
        with self._lock:
            self._warm = True
            for worker in (*self.idle, *self.costly_idle):
                if not worker.running():
                    worker.start()

    def take(self) -> Worker:
        """A cheap filters' worker, waiting for one to be free."""
        with self._free:
            while not self.idle:
                self._free.wait()
            return self.idle.pop()

    def take_costly(self) -> Worker | None:
        """A costly filters' worker, or None when they are all in use."""
        with self._free:
            return self.costly_idle.pop() if self.costly_idle else None

    def costly_free(self) -> bool:
        """Whether :meth:`take_costly` would find a worker now."""
        with self._free:
            return bool(self.costly_idle)

    def give_back(self, worker: Worker) -> None:
        with self._free:
            (self.costly_idle if id(worker) in self._costly else self.idle).append(worker)
            self._free.notify_all()

    def close(self) -> None:
        with self._lock:
            workers, self._all = self._all, []
        for worker in workers:
            worker.close()


_POOLS: dict[tuple[int, int], _Pool] = {}
_POOLS_LOCK = threading.Lock()


def _pool(memory_mb: int, nice: int, processes: int, costly: int) -> _Pool:
    with _POOLS_LOCK:
        pool = _POOLS.get((memory_mb, nice))
        if pool is None:
            pool = _POOLS[memory_mb, nice] = _Pool(memory_mb, nice)
    pool.grow(processes, costly)
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
        costly_nice: int = COSTLY_NICE,
    ) -> None:
        self.cpu_limit = cpu_limit
        self.memory_mb = memory_mb
        self.wall_limit = max(4 * cpu_limit, cpu_limit + 2.0)
        #: the costly filters' workers: as many as their group's share needs at once
        costly = max(1, math.ceil(costly_share or 1))
        self._pool = _pool(memory_mb, costly_nice, processes, costly)
        #: each subscription's recent use of the workers (``filters.cpu_share``) and the
        #: costly ones' together (``filters.costly_share``)
        self.shares = FilterShares(
            cpu_share,
            heavy_cost=cpu_limit / 10,
            group_share=costly_share,
            burst=cpu_limit,
            end_after=over_share_end,
        )
        #: wall-clock seconds a costly evaluation held its worker lately (moving average)
        self._costly_turn = 0.0
        #: a pushed-back key's verdicts on the head of its batch: (payload digest,
        #: verdict), reused when the same payloads come again (no evaluation is wasted)
        self._kept: dict[str, list[tuple[bytes, Verdict]]] = {}
        self._kept_lock = threading.Lock()

    def ready(self, key: str) -> None:
        """Raise :class:`FilterBusy` when ``key`` would be refused a process now (before
        its messages are decoded for nothing), :class:`FilterBudgetExceeded` when it is to
        be ended."""
        self._pool.warm()
        if self._check(key) and not self._pool.costly_free():
            raise FilterBusy(self._busy_delay(key))

    def _busy_delay(self, key: str) -> float:
        """Seconds a heavy ``key`` refused for want of a free costly filters' worker waits:
        not less than a few of its own messages take, nor than a costly evaluation held a
        worker lately.  Each try decodes its channel's batch again, and twenty costly
        subscriptions not known yet (no cost of their own) retried every 0.1 s, about 200
        channel runs a second in the gateway while one worker was busy."""
        return max(0.1, 4 * self.shares.cost(key), self._costly_turn)

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
        self._pool.warm()
        if key is None:
            return self._evaluate(expression, payloads, self._pool.take())[0]
        out = self._resume(key, payloads)
        while len(out) < len(payloads):
            try:
                heavy = self._check(key)
                worker = self._pool.take_costly() if heavy else self._pool.take()
                if worker is None:
                    raise FilterBusy(self._busy_delay(key))
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
            except FilterBusy:  # its low-priority worker was not run: again later
                self._keep(key, payloads, out)
                raise
            finally:
                # the worker's CPU time: on a loaded machine the wall time of a cheap
                # filter's round trip can exceed a costly filter's threshold
                held = time.monotonic() - started
                if spent is None:  # the worker died or starved: not more than this
                    spent = min(held, self.cpu_limit * n)
                self.shares.charge(key, spent, n, heavy=heavy)
                if heavy:
                    self._costly_turn = (self._costly_turn + min(held, self.wall_limit)) / 2
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
        self, expression: FilterExpression, payloads: Sequence[bytes], worker: Worker
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
        except WorkerDied as exc:
            raise FilterBudgetExceeded(
                _describe(exc.reason, self.cpu_limit, self.memory_mb), exc.index
            ) from None
        except WorkerStarved:
            raise FilterBusy(self.wall_limit) from None
        finally:
            if not worker.running():
                # replaced now, by the caller whose request ended it: the next caller
                # does not wait for an interpreter to start
                with contextlib.suppress(OSError):
                    worker.start()
            self._pool.give_back(worker)

    def close(self) -> None:
        """The workers are shared and live as long as the process (see the module
        docstring); nothing to release per evaluator."""
