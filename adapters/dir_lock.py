"""One process per adapter directory: an advisory ``flock`` on a file in the directory.

The embedded adapter's queues, the file log's streams and the MQTT adapter's session state
each belong to one process: two gateways on one directory would both deliver the same
queues, or (MQTT) connect with the same client ids and cut each other off for ever.
:func:`lock_directory` takes the lock without waiting (another process holds it: waiting
would not help) and writes the holder's process id into the file for the message.  The
lock goes away with the process, however it ends.
"""

from __future__ import annotations

import os

from wsnmom.core.adapter import DirectoryInUse
from wsnmom.core.file_lock import LockHeld, lock_file, unlock_file

__all__ = ["DirectoryLock", "lock_directory"]


class DirectoryLock:
    """A held lock; :meth:`release` (idempotent) gives it up."""

    def __init__(self, fd: int | None) -> None:
        self._fd = fd

    def release(self) -> None:
        unlock_file(self._fd)
        self._fd = None


def lock_directory(directory: str, file: str, what: str) -> DirectoryLock:
    """Lock ``directory`` (created if missing) through its ``file``.

    :raises DirectoryInUse: another process holds the lock (``what`` names the directory's
        use in the message).
    :raises OSError: the directory or its lock file cannot be made.
    """
    os.makedirs(directory, exist_ok=True)
    try:
        return DirectoryLock(lock_file(os.path.join(directory, file)))
    except LockHeld as held:
        holder = f"process {held.owner}" if held.owner else "another process"
        raise DirectoryInUse(f"{what} {directory!r} is in use by {holder} ({file})") from held
