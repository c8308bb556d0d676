"""Garbage collection of a serving gateway (wsnmom/gc_tuning.py): the start-up heap is
frozen and young collections run less often, in ``wsnmom serve`` itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.ops.serve_process import free_port, running_serve, serve_env
from wsnmom import gc_tuning

#: written into a private sitecustomize: the serving process reports its collector at exit
_PROBE = """
import atexit, gc, os, sys
def _report():
    if "serve" in sys.argv:
        with open(os.environ["GC_PROBE_OUT"], "w") as f:
            f.write(f"{gc.get_freeze_count()} {gc.get_threshold()[0]}")
atexit.register(_report)
"""


def test_tune_freezes_what_exists_and_raises_the_young_threshold() -> None:
    code = (
        "import gc; from wsnmom import gc_tuning; before = gc.get_freeze_count(); "
        "gc_tuning.tune(); print(before, gc.get_freeze_count(), *gc.get_threshold())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    before, frozen, young, middle, old = map(int, out)
    assert before == 0 and frozen > 1000
    assert (young, middle, old) == (gc_tuning.YOUNG, 10, 10)


def test_serve_tunes_the_collector_after_start_up(tmp_path: Path) -> None:
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "sitecustomize.py").write_text(_PROBE)
    out = tmp_path / "gc.txt"
    env = serve_env(tmp_path, PYTHONPATH=str(probe), GC_PROBE_OUT=str(out))
    with running_serve([], env, free_port()):
        pass
    frozen, young = map(int, out.read_text().split())
    # the modules, the application and the broker built at start-up: tens of thousands
    assert frozen > 10_000
    assert young == gc_tuning.YOUNG
