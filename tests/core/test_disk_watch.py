"""Issue 22, item 4, the parts that need no full disk: what counts as a full disk, the
free-space threshold with its margin, and incremental vacuum giving pages back."""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from wsnmom.core.disk import DiskWatch, is_storage_full, storage_full_text
from wsnmom.core.sqlite_space import reclaimable, vacuum_step

MIB = 1024 * 1024


def test_full_disk_errors_are_recognised_through_their_causes() -> None:
    full = sqlite3.OperationalError("database or disk is full")
    assert is_storage_full(full)
    assert is_storage_full(OSError(errno.ENOSPC, "No space left on device"))
    try:
        try:
            raise full
        except sqlite3.Error as exc:
            raise RuntimeError("publishing failed") from exc
    except RuntimeError as wrapped:
        assert is_storage_full(wrapped)
    assert not is_storage_full(sqlite3.OperationalError("no such table: x"))
    assert not is_storage_full(OSError(errno.EACCES, "Permission denied"))


def test_threshold_refuses_below_min_free_and_resumes_past_a_margin() -> None:
    free = [100 * MIB]
    now = [0.0]

    def statvfs(path: str) -> Any:
        return SimpleNamespace(f_bavail=free[0] // 4096, f_frsize=4096)

    watch = DiskWatch(["/data"], 64 * MIB, clock=lambda: now[0], statvfs=statvfs)
    assert watch.low() is None
    for value, low in ((63, True), (70, True), (79, True), (81, False), (70, False)):
        free[0], now[0] = value * MIB, now[0] + 1
        assert (watch.low() is not None) is low, value
    free[0], now[0] = 10 * MIB, now[0] + 1
    low_state = watch.low()
    assert low_state is not None and "10.0 MiB free in /data" in storage_full_text(low_state)
    # a write that found the disk full counts for a few seconds, whatever statvfs says
    free[0], now[0] = 500 * MIB, now[0] + 1
    watch.note_full()
    assert watch.low() is not None
    now[0] += 10
    assert watch.low() is None


def test_deleted_rows_give_their_pages_back_to_the_filesystem(tmp_path: Path) -> None:
    path = str(tmp_path / "db.sqlite3")
    conn = sqlite3.connect(path, isolation_level=None)
    reclaimable(conn, path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t (body BLOB)")
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO t VALUES (?)", [(os.urandom(64 * 1024),) for _ in range(64)])
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    full = os.path.getsize(path)
    conn.execute("DELETE FROM t")
    while vacuum_step(conn, checkpoint=True):
        pass
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert os.path.getsize(path) < full // 4, (full, os.path.getsize(path))
    conn.close()


def test_an_existing_database_is_converted_to_incremental_vacuum(tmp_path: Path) -> None:
    path = str(tmp_path / "old.sqlite3")
    old = sqlite3.connect(path, isolation_level=None)
    old.execute("CREATE TABLE t (x)")
    old.close()
    conn = sqlite3.connect(path, isolation_level=None)
    reclaimable(conn, path)
    assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2
    conn.close()
