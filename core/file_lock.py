"""An exclusive, non-waiting ``flock`` on a file that names its holder.

The gateway's store lock (``wsnmom.data_lock``) and the adapters' directory locks
(``wsnmom.adapters.dir_lock``) take their locks here: the file is created if missing, the
lock is tried without waiting (another process holds it: waiting would not help), and the
holder writes its process id into the file for the other's message.  Closing the returned
descriptor (or the process ending, however it ends) releases the lock.
"""

from __future__ import annotations

import contextlib
import os

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no cross-process guard
    fcntl = None  # type: ignore[assignment]

__all__ = ["LockHeld", "lock_file", "unlock_file"]


class LockHeld(Exception):
    """Another process holds the lock; ``owner`` is the process id it wrote ("" unknown)."""

    def __init__(self, owner: str) -> None:
        super().__init__(owner)
        self.owner = owner


def lock_file(path: str) -> int | None:
    """Take the lock of ``path``; its descriptor, or None where there is no ``flock``.

    :raises LockHeld: another process holds it.
    :raises OSError: the file cannot be opened or created.
    """
    if fcntl is None:  # pragma: no cover - Windows
        return None
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        owner = ""
        with contextlib.suppress(OSError):
            owner = os.read(fd, 32).decode("ascii", "replace").strip()
        os.close(fd)
        raise LockHeld(owner) from exc
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd


def unlock_file(fd: int | None) -> None:
    """Release a lock :func:`lock_file` took (None: nothing to release)."""
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)  # closing releases the flock
