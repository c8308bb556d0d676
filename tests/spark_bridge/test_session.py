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
