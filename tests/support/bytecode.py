"""Byte-compile the repository's Python sources once per test run.

The suite starts hundreds of Python processes (gateways, the command line, brokers'
helpers), and each one imports most of wsnmom.  Python reads a module's cached bytecode
from ``__pycache__`` and compiles the source only when it is missing; with
``PYTHONDONTWRITEBYTECODE`` set (as in some shells and CI images) no process ever writes
the cache, so every process compiles every module it imports again: about 0.6 s of CPU per
gateway start on this project, most of a start's cost.  :func:`compile_sources` writes the
cache explicitly (``compileall`` writes it whatever that variable says); where the cache
is current it only compares timestamps.
"""

from __future__ import annotations

import compileall
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: top-level folders that hold no Python the suite imports
_SKIPPED = {"build", "docker", "docs"}


def compile_sources(root: Path = ROOT) -> bool:
    """Write missing or stale bytecode of every package folder under ``root``; False when
    a file did not compile (the import that needs it reports the error)."""
    ok = True
    for folder in sorted(root.iterdir()):
        if not folder.is_dir() or folder.name.startswith(".") or folder.name in _SKIPPED:
            continue
        ok = bool(compileall.compile_dir(folder, quiet=2)) and ok
    return ok
