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

pytest keeps a cache of its own, of the test modules with their ``assert`` statements
rewritten (``__pycache__/*-pytest-*.pyc``, checked by the source's hash too), and does not
write it either under that variable: each pytest-xdist worker rewrote every test module
again while it collected (about 14 s of CPU a worker for this suite, three workers at once
on two cores).  :func:`rewrite_test_modules` writes that cache once, in the controller,
before the workers start; they read it.
"""

from __future__ import annotations

import importlib.util
import py_compile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytest

ROOT = Path(__file__).resolve().parents[2]
#: top-level folders that hold no Python the suite imports
_SKIPPED = {"build", "docker", "docs"}
#: the flags of a checked hash-based pyc (PEP 552)
_CHECKED_HASH = (3).to_bytes(4, "little")


def _current(source: Path, data: bytes, cache: str | None = None) -> bool:
    """Whether the cache of ``source`` (Python's, or the file ``cache``) is a checked
    hash-based pyc of ``data``."""
    try:
        with open(cache or importlib.util.cache_from_source(str(source)), "rb") as cached:
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


def _rewritten_candidates(config: pytest.Config, root: Path) -> dict[Path, str]:
    """The Python files of the test paths and of the modules marked for rewriting
    (``pytest_plugins``, ``pytest.register_assert_rewrite``), with their module names."""
    from _pytest.assertion.rewrite import assertstate_key

    found: dict[Path, str] = {}
    for folder in config.getini("testpaths") or ["."]:
        for source in (root / folder).rglob("*.py"):
            parts = source.relative_to(root).with_suffix("").parts
            found[source] = ".".join(parts).removesuffix(".__init__")
    hook = config.stash[assertstate_key].hook
    for name in getattr(hook, "_must_rewrite", ()):
        base = root.joinpath(*name.split("."))
        for source in (base.with_suffix(".py"), base / "__init__.py"):
            if source.is_file():
                found[source] = name
    return found


def rewrite_test_modules(config: pytest.Config, root: Path = ROOT) -> int:
    """Write pytest's cache of every module its assertion rewriting hook would rewrite
    (test modules, conftests, marked plugins) whose cache is missing or stale; returns how
    many were written.  It uses pytest's own functions (private ones: with a pytest that
    lacks them it writes nothing, and each process rewrites as it did before)."""
    try:
        from _pytest.assertion.rewrite import (
            PYC_TAIL,
            _rewrite_test,
            _write_pyc,
            assertstate_key,
            get_cache_dir,
            try_makedirs,
        )

        state = config.stash[assertstate_key]
        hook = state.hook
        candidates = _rewritten_candidates(config, root)
    except (ImportError, KeyError, AttributeError):
        return 0
    if hook is None:  # --assert=plain
        return 0
    written = 0
    for source, name in sorted(candidates.items()):
        if not hook._should_rewrite(name, str(source), state):
            continue
        cache_dir = get_cache_dir(source)
        pyc = cache_dir / (source.name[:-3] + PYC_TAIL)
        if _current(source, source.read_bytes(), str(pyc)) or not try_makedirs(cache_dir):
            continue
        try:
            source_hash, code = _rewrite_test(source, config)
        except SyntaxError:
            continue  # the import that needs it reports it
        if _write_pyc(state, code, source_hash, pyc):
            written += 1
    return written
