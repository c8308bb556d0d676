"""Byte-compile the repository's Python sources once per test run.

The suite starts hundreds of Python processes (gateways, the command line, brokers'
helpers), and each one imports most of wsnmom.  Python reads a module's cached bytecode
from ``__pycache__`` and compiles the source only when it is missing; with
``PYTHONDONTWRITEBYTECODE`` set (as in some shells and CI images, and by mutmut) no process
writes the cache, so every process compiles every module it imports again: about 0.6 s of
CPU per gateway start on this project, most of a start's cost.  :func:`compile_sources`
writes the cache explicitly, whatever that variable says.

The cache it writes is checked by the hash of the source (PEP 552's checked hash-based
pycs), not by its modification time: a source rewritten within the same second at the
same size (a mutant of mutmut's, one operator for another) is never run from a stale
cache.  A file whose cache already holds its hash is not compiled again.
"""

from __future__ import annotations

import importlib.util
import py_compile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: top-level folders that hold no Python the suite imports
_SKIPPED = {"build", "docker", "docs"}
#: the flags of a checked hash-based pyc (PEP 552)
_CHECKED_HASH = (3).to_bytes(4, "little")


def _current(source: Path, data: bytes) -> bool:
    """Whether the cache of ``source`` is a checked hash-based pyc of ``data``."""
    try:
        with open(importlib.util.cache_from_source(str(source)), "rb") as cached:
            header = cached.read(16)
    except OSError:
        return False
    return (
        header[:4] == importlib.util.MAGIC_NUMBER
        and header[4:8] == _CHECKED_HASH
        and header[8:16] == importlib.util.source_hash(data)
    )


def compile_sources(root: Path = ROOT) -> int:
    """Write the missing or stale bytecode of every Python file under ``root``'s package
    folders; returns how many files were compiled.  A file that does not compile is left
    to the import that needs it (which reports the error)."""
    compiled = 0
    for folder in sorted(root.iterdir()):
        if not folder.is_dir() or folder.name.startswith(".") or folder.name in _SKIPPED:
            continue
        for source in folder.rglob("*.py"):
            if _current(source, source.read_bytes()):
                continue
            try:
                py_compile.compile(
                    str(source),
                    doraise=True,
                    invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
                )
            except py_compile.PyCompileError:
                continue
            compiled += 1
    return compiled
