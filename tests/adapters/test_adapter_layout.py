"""Every adapter stays split where a reader would lose the thread: no class in ``adapters/``
grows past 500 lines (issue 24, item 7), every module of the packages split into parts
of one job each has a docstring (docs/adapters/embedded.md, "Code layout"; the module
docstrings of ``logbase/engine.py`` and ``mqtt/session.py``).  That no module grows past
500 lines is tests/ops/test_core_layout.py's, for every package of the product.

Read from the sources (``ast``), so the test needs no middleware.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ADAPTERS = Path(__file__).resolve().parents[2] / "adapters"
#: the most lines a class of an adapter may have
LIMIT = 500
#: the packages split into parts of one job each
SPLIT = ("embedded", "logbase", "mqtt")


def _classes() -> dict[str, int]:
    """``package/module.py:Class`` -> lines, for every class under ``adapters/``."""
    sizes: dict[str, int] = {}
    for path in sorted(ADAPTERS.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                name = f"{path.relative_to(ADAPTERS).as_posix()}:{node.name}"
                sizes[name] = (node.end_lineno or node.lineno) - node.lineno + 1
    return sizes


def test_the_largest_class_in_adapters_is_under_the_limit() -> None:
    sizes = _classes()
    assert len(sizes) > 50  # the walk found the adapters' classes
    over = {name: n for name, n in sizes.items() if n > LIMIT}
    assert not over, f"classes over {LIMIT} lines: {over}"


@pytest.mark.parametrize(
    "path",
    sorted(p for package in SPLIT for p in (ADAPTERS / package).glob("*.py")),
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_split_modules_have_a_docstring(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    assert ast.get_docstring(tree), f"{path.name} has no module docstring"


@pytest.mark.parametrize(
    ("package", "parts"),
    [
        (
            "embedded",
            {"store.py", "storage.py", "subscriptions.py", "publish.py", "queues.py"}
            | {"limits.py", "dead_letters.py", "outbox.py", "dispatch.py", "records.py"},
        ),
        (
            "logbase",
            {"engine.py", "head.py", "catch_up.py", "commits.py", "burial.py"}
            | {"subscriptions.py", "backlog.py"},
        ),
        (
            "mqtt",
            {"session.py", "barriers.py", "ingest.py", "inbox.py", "sub_client.py"}
            | {"sub_protocol.py"},
        ),
    ],
)
def test_the_engines_are_split_by_job(package: str, parts: set[str]) -> None:
    assert parts <= {p.name for p in (ADAPTERS / package).glob("*.py")}
