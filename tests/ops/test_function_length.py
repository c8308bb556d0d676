"""No function of the gateway grows past 80 lines, where a reader loses the thread (issue
24, item 7): a longer one is split into named steps.  ``LONGER`` lists the few that may
be longer and why; an entry may shrink below the limit.

Read from the sources (``ast``); the tests, the benchmarks and the shipped test kit
(``wsnmom/testing``) are not counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ["core", "topic_mapping", "soap_frontend", "adapters", "spark_bridge", "wsnmom"]
#: the most lines a function may have
LIMIT = 80
#: functions that may be longer: path:name -> why
LONGER = {
    # one flat list of the policy's fields, each a line or a sentence: nothing to follow
    "core/policy.py:build_policy": "a declaration",
}


def _functions() -> dict[str, int]:
    """``folder/module.py:name`` -> lines of every function (the longest of a name)."""
    sizes: dict[str, int] = {}
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "testing" in path.relative_to(ROOT).parts:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    key = f"{path.relative_to(ROOT).as_posix()}:{node.name}"
                    size = (node.end_lineno or node.lineno) - node.lineno + 1
                    sizes[key] = max(size, sizes.get(key, 0))
    return sizes


def test_no_function_is_longer_than_the_limit() -> None:
    sizes = _functions()
    assert len(sizes) > 1000  # the walk found the gateway's functions
    over = {name: n for name, n in sizes.items() if n > LIMIT and name not in LONGER}
    assert not over, f"functions over {LIMIT} lines (split them into named steps): {over}"


def test_every_exception_names_a_function_that_exists() -> None:
    assert set(LONGER) <= set(_functions())
