"""The gateway process as the admin page's *Node* cards show it: memory, open files,
threads, and the size of its store and data directory (``node`` in
``GET /wsn/admin/api/overview``).  Linux's ``/proc`` gives memory, open files and OS
threads; where it is missing those are ``null``."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

__all__ = ["node_json"]

_PROC = Path("/proc/self")


def _status(field: str) -> int | None:
    """A number of ``/proc/self/status`` (``VmRSS`` in kB, ``Threads``)."""
    try:
        for line in (_PROC / "status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _open_files() -> int | None:
    try:
        return len(os.listdir(_PROC / "fd"))
    except OSError:
        return None


def _size(path: Path) -> int | None:
    """Bytes of a file (with its SQLite ``-wal``/``-shm``) or of a directory tree."""
    try:
        if path.is_dir():
            return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        files = [path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")]
        return sum(f.stat().st_size for f in files if f.exists())
    except OSError:
        return None


def node_json(settings: Any) -> dict[str, Any]:
    """Memory (resident bytes), open files, threads (OS and Python), the store file's and
    the data directory's size in bytes."""
    rss = _status("VmRSS")
    store = str(getattr(settings, "store_url", "") or "")
    store_path = store.removeprefix("sqlite:///") if store.startswith("sqlite:///") else None
    data_dir = getattr(settings, "data_dir", None)
    return {
        "pid": os.getpid(),
        "memory": rss * 1024 if rss is not None else None,
        "open_files": _open_files(),
        "threads": _status("Threads"),
        "python_threads": threading.active_count(),
        "store_bytes": _size(Path(store_path)) if store_path and store_path != ":memory:" else None,
        "data_dir": data_dir,
        "data_bytes": _size(Path(data_dir)) if data_dir else None,
    }
