"""The data directory's free space: refusing new work before the disk is full, and
recognising a full disk in the errors of the storage libraries.

With ``--data-dir`` on a small filesystem, 11 Notifies of 64 KB to 200 pull points filled
256 MiB; Notify then answered 500 "internal error" while ``/readyz`` said ready, and a
transaction left open by a failed COMMIT kept every later write failing until a restart.
Now:

* :class:`DiskWatch` reads the free space of the filesystems that hold the gateway's data
  (``os.statvfs``, a system call of a microsecond or two, at most every 50 ms) and
  reports them *low* below ``storage.min_free`` bytes, or for a few seconds after a write
  failed for lack of space;
* the broker refuses new work while the disk is low (``MiddlewareGate.require_space``:
  Notify, Subscribe, CreatePullPoint, RegisterPublisher), with a ResourceUnavailableFault,
  HTTP 503 and ``Retry-After``; reads, Unsubscribe and DestroyPullPoint go on, since they
  give space back;
* :func:`is_storage_full` tells a full disk (``ENOSPC``, ``EDQUOT``, SQLite's
  ``SQLITE_FULL`` and the I/O errors a failed write of its journal gives) from other
  errors, wherever it is raised, so the frontend answers it as a fault that says so.

Space comes back without a restart: the stores roll back a failed transaction and give
pages of destroyed resources back to the filesystem (SQLite incremental vacuum).
"""

from __future__ import annotations

import errno
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = ["DiskState", "DiskWatch", "is_storage_full", "storage_full_text"]

_MIB = 1024 * 1024
#: SQLite primary result codes of a write that found no space (SQLITE_FULL, SQLITE_IOERR:
#: a journal or WAL write that failed with ENOSPC reports an I/O error)
_SQLITE_CODES = frozenset({13, 10})
#: seconds a write that failed for lack of space keeps the disk "low" without statvfs
#: agreeing (a quota, a filesystem that reserves blocks)
_STICKY = 5.0
#: bytes beyond ``min_free`` (at most a quarter of it) that must be free before a low disk
#: takes new work again
_HYSTERESIS = 16 * _MIB


def is_storage_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is a write that found the disk
    full."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if isinstance(current, sqlite3.Error):
            code = getattr(current, "sqlite_errorcode", None)
            if isinstance(code, int) and code & 0xFF in _SQLITE_CODES:
                return True
            text = str(current).lower()
            if "database or disk is full" in text or "disk i/o error" in text:
                return True
        current = current.__cause__ or current.__context__
    return False


def storage_full_text(state: DiskState | None = None) -> str:
    """The description of a refusal for lack of space."""
    if state is None or state.free is None:
        return "the gateway's disk is full; retry later"
    if state.free >= state.minimum:  # recovering, within the margin
        return (
            f"the gateway's disk is full: {state.free / _MIB:.1f} MiB free in {state.path} "
            f"after it fell below storage.min_free ({state.minimum / _MIB:.1f} MiB); new "
            f"work waits for {state.resume / _MIB:.1f} MiB; retry later"
        )
    return (
        f"the gateway's disk is full: {state.free / _MIB:.1f} MiB free in {state.path}, "
        f"below storage.min_free ({state.minimum / _MIB:.1f} MiB); retry later"
    )


@dataclass(frozen=True, slots=True)
class DiskState:
    """The tightest of the watched filesystems."""

    #: a directory on it
    path: str
    #: bytes free to the gateway (None: unknown)
    free: int | None
    minimum: int
    #: below ``minimum``, or a write failed for lack of space just now
    low: bool
    #: bytes that must be free before a low disk takes new work again
    resume: int = 0


class DiskWatch:
    """Free space of the directories ``paths`` (see the module docstring); thread-safe."""

    def __init__(
        self,
        paths: Iterable[str],
        min_free: int,
        *,
        interval: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
        statvfs: Callable[[str], os.statvfs_result] = os.statvfs,
    ) -> None:
        self.paths = sorted({os.path.abspath(p) for p in paths if p})
        self.min_free = min_free
        self._interval = interval
        self._clock = clock
        self._statvfs = statvfs
        self._lock = threading.Lock()
        self._state: DiskState | None = None
        self._read_at = float("-inf")
        self._full_at = float("-inf")

    def note_full(self) -> None:
        """A write failed for lack of space: low for the next few seconds."""
        with self._lock:
            self._full_at = self._clock()
            self._read_at = float("-inf")

    def state(self) -> DiskState:
        """The state now (statvfs at most once per interval)."""
        now = self._clock()
        with self._lock:
            if self._state is None or now - self._read_at >= self._interval:
                self._state = self._read(now)
                self._read_at = now
            return self._state

    def low(self) -> DiskState | None:
        """The state when the disk is low, else None."""
        state = self.state()
        return state if state.low else None

    def _read(self, now: float) -> DiskState:
        tightest: tuple[str, int | None] = (self.paths[0] if self.paths else "", None)
        for path in self.paths:
            free = self._free(path)
            if free is not None and (tightest[1] is None or free < tightest[1]):
                tightest = (path, free)
        path, free = tightest
        # once low, stay low until a margin is free again: writes and WAL checkpoints
        # move the free space up and down by megabytes, which would flap
        was_low = self._state is not None and self._state.low
        resume = self.min_free + min(self.min_free // 4, _HYSTERESIS)
        bound = resume if was_low else self.min_free
        low = now - self._full_at < _STICKY or (
            free is not None and self.min_free > 0 and free < bound
        )
        return DiskState(path, free, self.min_free, low, resume)

    def _free(self, path: str) -> int | None:
        """Free bytes of ``path``'s filesystem (its nearest existing ancestor's)."""
        while True:
            try:
                st = self._statvfs(path)
            except FileNotFoundError:
                parent = os.path.dirname(path)
                if parent == path:
                    return None
                path = parent
                continue
            except OSError:
                return None
            return int(st.f_bavail) * int(st.f_frsize)
