"""The bytecode cache the suite writes before it runs (tests/support/bytecode.py): written
once, and never run in place of a source that changed, even at the same size and the same
modification time (a mutant of mutmut's)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.bytecode import compile_sources


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
