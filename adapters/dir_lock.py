"""One process per adapter directory: an advisory ``flock`` on a file in the directory.

The embedded adapter's queues, the file log's streams and the MQTT adapter's session state
each belong to one process: two gateways on one directory would both deliver the same
queues, or (MQTT) connect with the same client ids and cut each other off for ever.
:func:`lock_directory` takes the lock without waiting (another process holds it: waiting
would not help) and writes the holder's process id into the file for the message.  The
lock goes away with the process, however it ends.
"""

from __future__ import annotations

import contextlib
import os

from wsnmom.core.adapter import DirectoryInUse

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no cross-process guard
    fcntl = None  # type: ignore[assignment]

__all__ = ["DirectoryLock", "lock_directory"]


class DirectoryLock:
    """A held lock; :meth:`release` (idempotent) gives it up."""

    def __init__(self, fd: int | None) -> None:
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)  # closing releases the flock
            self._fd = None


def lock_directory(directory: str, file: str, what: str) -> DirectoryLock:
    """Lock ``directory`` (created if missing) through its ``file``.

    :raises DirectoryInUse: another process holds the lock (``what`` names the directory's
        use in the message).
    :raises OSError: the directory or its lock file cannot be made.
    """
    if fcntl is None:  # pragma: no cover - Windows
        return DirectoryLock(None)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, file)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        owner = ""
        with contextlib.suppress(OSError):
            owner = os.read(fd, 32).decode("ascii", "replace").strip()
        os.close(fd)
        holder = f"process {owner}" if owner else "another process"
        raise DirectoryInUse(f"{what} {directory!r} is in use by {holder} ({file})") from exc
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return DirectoryLock(fd)
