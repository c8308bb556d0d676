"""The bytecode cache the suite writes before it runs (tests/support/bytecode.py): written
once, and never run in place of a source that changed, even at the same size and the same
modification time (a mutant of mutmut's)."""

from __future__ import annotations

import os
import subprocess
import sys
from fnmatch import fnmatch
from pathlib import Path

import pytest
from _pytest.assertion.rewrite import _read_pyc

from tests.support.bytecode import compile_sources, rewrite_test_modules


def test_a_rewritten_source_is_never_run_from_the_cache(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    module = package / "probe.py"
    module.write_text("X = 1\n")
    assert compile_sources(tmp_path) == 1
    assert compile_sources(tmp_path) == 0  # current: not compiled again
    stat = module.stat()
    module.write_text("X = 2\n")  # same size; and the same modification time
    os.utime(module, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    env = {**os.environ, "PYTHONPATH": str(package), "PYTHONDONTWRITEBYTECODE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", "import probe; print(probe.X)"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert out.stdout.strip() == "2"
    assert compile_sources(tmp_path) == 1


def test_the_rewritten_test_modules_are_written_once_for_pytest_to_read(
    pytestconfig: pytest.Config, tmp_path: Path
) -> None:
    """pytest's own cache of a test module with its asserts rewritten is written (what
    pytest reads instead of rewriting the module again), once; a module pytest does not
    rewrite gets none."""
    from _pytest.assertion.rewrite import PYC_TAIL

    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "__init__.py").write_text("")
    probe = tests / "test_probe.py"
    probe.write_text("def test_probe() -> None:\n    assert 1 + 1 == 2\n")
    (tests / "helper.py").write_text("X = 1\n")
    assert rewrite_test_modules(pytestconfig, tmp_path) == 1
    assert rewrite_test_modules(pytestconfig, tmp_path) == 0  # current: not written again
    code = _read_pyc(probe, tests / "__pycache__" / f"test_probe{PYC_TAIL}")
    assert code is not None and "@pytest_ar" in code.co_names  # rewritten
    assert not (tests / "__pycache__" / f"helper{PYC_TAIL}").exists()
    probe.write_text("def test_probe() -> None:\n    assert 2 + 2 == 4\n")  # same size
    assert rewrite_test_modules(pytestconfig, tmp_path) == 1


def test_every_module_this_process_rewrote_was_read_from_pytests_cache(
    pytestconfig: pytest.Config,
) -> None:
    """The suite's controller wrote pytest's cache of the rewritten test modules and
    conftests before this process collected (tests/conftest.py): each of them that this
    process rewrote has a current cache, so it was read, not rewritten (pytest writes none
    itself where ``PYTHONDONTWRITEBYTECODE`` is set, as in this project's shells and CI).
    Not checked: modules marked for rewriting by a conftest the controller does not import
    (``tests.cluster.ha``), or by a run of pytester in this process."""
    from _pytest.assertion.rewrite import PYC_TAIL, assertstate_key, get_cache_dir

    hook = pytestconfig.stash[assertstate_key].hook
    assert hook is not None
    tests = Path(__file__).resolve().parents[1]
    rewritten = [
        source
        for source in dict(hook._rewritten_names).values()
        if source.is_relative_to(tests)
        and (source.name == "conftest.py" or any(fnmatch(source.name, p) for p in hook.fnpats))
    ]
    assert Path(__file__) in rewritten
    stale = [
        str(source)
        for source in rewritten
        if _read_pyc(source, get_cache_dir(source) / (source.name[:-3] + PYC_TAIL)) is None
    ]
    assert stale == []
