"""``local_session``'s Python workers: they import the installed pyspark (with its
bytecode), not the uncompiled ``pyspark.zip`` Spark puts first on their ``PYTHONPATH``.

From the zip every worker process compiled pyspark again: 1.1-1.2 s of CPU instead of
0.25 s to import the streaming source runner (4-5 s wall at load 8), and Spark gives a
streaming source's runner a fixed 10 s to connect back (session 9: a sink test failed
with "Python worker failed to connect back" at load 9)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from wsnmom.spark_bridge.session import worker_python


def _pyspark_file(_: object) -> str:
    import pyspark

    return str(pyspark.__file__)


def test_python_workers_import_the_installed_pyspark(spark: Any) -> None:
    (where,) = spark.sparkContext.parallelize([0], 1).map(_pyspark_file).collect()
    assert ".zip" not in where, where


def test_the_worker_launcher_drops_only_sparks_own_archives(tmp_path: Path) -> None:
    import pyspark

    home = Path(pyspark.__file__).parent
    archives = [str(p) for p in sorted((home / "python" / "lib").glob("*.zip"))]
    kept = str(tmp_path)
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "PYTHONPATH": os.pathsep.join([*archives, kept]),
    }
    shown = subprocess.run(
        [
            worker_python(),
            "-c",
            "import os, pyspark, sys; print(pyspark.__file__); print(os.environ['PYTHONPATH'])",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.splitlines()
    assert ".zip" not in shown[0], shown  # the installed one
    assert shown[1] == kept, shown


def _launcher_path() -> Path:
    path = Path(worker_python())
    assert path.name.startswith("wsnmom-spark-python-"), path
    return path


@pytest.mark.parametrize("tamper", ["content", "mode", "symlink", "owner"])
def test_a_launcher_someone_else_could_have_written_is_never_run(
    tmp_path: Path, tamper: str
) -> None:
    """The launcher's name in the shared temporary directory is predictable: a file found
    there that is not this user's own, unwritable by others and holding the launcher is
    replaced (or, when it cannot be, the interpreter itself is used), never run."""
    if tamper == "owner" and os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")  # CI runs as root
    path = _launcher_path()
    path.unlink()
    planted = tmp_path / "planted"
    planted.write_text("#!/bin/sh\necho planted\n")
    planted.chmod(0o755)
    if tamper == "content":
        path.write_text(planted.read_text())
        path.chmod(0o755)
    elif tamper == "mode":
        path.write_text(_launcher_text())
        path.chmod(0o777)
    elif tamper == "symlink":
        path.symlink_to(planted)
    else:
        path.write_text(_launcher_text())
        path.chmod(0o755)
        os.chown(path, 65534, 65534)
    chosen = worker_python()
    ran = subprocess.run(
        [chosen, "-c", "print('interpreter')"], capture_output=True, text=True, timeout=60
    ).stdout
    assert ran.strip() == "interpreter", (tamper, chosen, ran)
    launcher = _launcher_path()
    assert launcher.read_text() == _launcher_text()
    found = launcher.lstat()
    assert (found.st_uid, found.st_mode & 0o7777) == (os.getuid(), 0o755), tamper


def _launcher_text() -> str:
    import shlex
    import sys

    from wsnmom.spark_bridge import session

    return session._LAUNCHER % shlex.quote(sys.executable)
