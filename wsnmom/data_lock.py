"""One gateway per store: an advisory lock beside the store's database file.

Two gateways on one store would both recover, expire and deliver the same subscriptions.
:func:`lock_store` takes an exclusive ``flock`` on ``<store file>.lock`` (the file holds
the owner's process id, for the message) and raises :class:`DataDirInUse` when another
process holds it.  The lock goes away with the process, however it ends.
"""

from __future__ import annotations

from pathlib import Path

from wsnmom.core.file_lock import LockHeld, lock_file, unlock_file

__all__ = ["DataDirInUse", "StoreLock", "lock_store"]


class DataDirInUse(RuntimeError):
    """Another process holds the store's lock."""

    def __init__(self, lock_path: Path, owner: str) -> None:
        self.lock_path = lock_path
        self.owner = owner
        who = f"process {owner}" if owner else "another process"
        super().__init__(
            f"data directory {lock_path.parent} is in use by another gateway ({who} holds "
            f"{lock_path.name})"
        )


class StoreLock:
    """A held lock; :meth:`release` (idempotent) gives it up."""

    def __init__(self, path: Path | None, fd: int | None) -> None:
        self.path = path
        self._fd = fd

    def release(self) -> None:
        unlock_file(self._fd)
        self._fd = None


def lock_store(store_url: str) -> StoreLock:
    """Lock the store of ``store_url`` (a no-op for ``:memory:`` and non-SQLite URLs).

    :raises DataDirInUse: another process holds the lock.
    :raises OSError: the directory cannot be created or written.
    """
    prefix = "sqlite:///"
    if not store_url.startswith(prefix):
        return StoreLock(None, None)
    db = store_url[len(prefix) :]
    if not db or db == ":memory:":
        return StoreLock(None, None)
    path = Path(db + ".lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = lock_file(str(path))
    except LockHeld as held:
        raise DataDirInUse(path, held.owner) from held
    return StoreLock(path if fd is not None else None, fd)
