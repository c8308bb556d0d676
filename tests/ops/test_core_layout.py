"""Core's modules stay split where a reader would lose the thread: every module of ``core/``
says its one job in a docstring, and the modules split into parts of one job each (the
delivery channel, the store, the broker service; docs/architecture.md, "Core, module by
module") stay under 500 lines, so that a part that grows is split again rather than left to
become the next 1,000-line module.

Read from the sources, so the test needs no middleware.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "core"
#: the most lines a split module may have
LIMIT = 500
#: the modules of core split into parts, and their parts
SPLIT = (
    # the delivery channel
    "channel.py",
    "channel_state.py",
    "channel_give_up.py",
    "channel_signals.py",
    "channel_status.py",
    "backoff.py",
    # the store
    "store.py",
    "store_documents.py",
    "store_sqlite.py",
    "store_postgres.py",
    "store_postgres_pool.py",
    "store_postgres_deadline.py",
    "store_postgres_schema.py",
    # the broker service
    "service.py",
    "service_setup.py",
    "service_operators.py",
    "cluster_parts.py",
    "advertised.py",
    "readiness.py",
    # the dead letters
    "dead_letters.py",
    "dead_letter_records.py",
    "dead_letter_box.py",
    # the settings model
    "config_model.py",
    "config_delivery.py",
    "config_protection.py",
)


@pytest.mark.parametrize("path", sorted(CORE.glob("*.py")), ids=lambda p: p.name)
def test_every_core_module_has_a_docstring(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    assert ast.get_docstring(tree), f"core/{path.name} has no module docstring"


@pytest.mark.parametrize("name", SPLIT)
def test_split_modules_stay_under_the_limit(name: str) -> None:
    lines = len((CORE / name).read_text(encoding="utf-8").splitlines())
    assert lines <= LIMIT, f"core/{name} has {lines} lines (at most {LIMIT}): split it again"
