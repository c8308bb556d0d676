"""Core's modules stay split where a reader would lose the thread: every module of ``core/``
says its one job in a docstring, and the modules split into parts of one job each (the
delivery channel, the store, the broker service; docs/architecture.md, "Core, module by
module") stay under 500 lines, so that a part that grows is split again rather than left to
become the next 1,000-line module.

Read from the sources, so the test needs no middleware.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path
from types import ModuleType

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
    # the pull points (docs/architecture.md, "Core, module by module")
    "pull_points.py",
    "pull_feeds.py",
    "pull_fed.py",
    "pull_buffer.py",
    "pull_reader.py",
    "pull_handout.py",
    "pull_owners.py",
    # the adapter contract (docs/plugins.md, "The adapter contract")
    "adapter.py",
    "adapter_subscription.py",
    "adapter_capabilities.py",
    "adapter_messages.py",
    "adapter_errors.py",
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


#: the parts of the adapter contract, whose names plugins import from ``wsnmom.core.adapter``
#: (docs/plugins.md, "The adapter contract"): where a name is written is not public
CONTRACT_PARTS = ("adapter_subscription", "adapter_capabilities", "adapter_messages")
CONTRACT_PARTS += ("adapter_errors",)


def _defined(module: ModuleType) -> list[str]:
    """The public names ``module`` defines: its ``__all__``, else its own classes and
    functions and its upper-case constants."""
    if hasattr(module, "__all__"):
        return list(module.__all__)
    return [
        n
        for n, v in vars(module).items()
        if not n.startswith("_")
        and n != "TYPE_CHECKING"
        and (
            v.__module__ == module.__name__
            if inspect.isclass(v) or inspect.isfunction(v)
            else n.isupper()
        )
    ]


@pytest.mark.parametrize("part", CONTRACT_PARTS)
def test_the_contract_is_imported_from_core_adapter(part: str) -> None:
    contract = importlib.import_module("wsnmom.core.adapter")
    module = importlib.import_module(f"wsnmom.core.{part}")
    names = _defined(module)
    assert names, part
    missing = [n for n in names if getattr(contract, n, None) is not getattr(module, n)]
    assert not missing, f"wsnmom.core.adapter does not re-export {missing} of core.{part}"
    unlisted = set(names) - set(contract.__all__)
    assert not unlisted, f"not in wsnmom.core.adapter.__all__: {sorted(unlisted)}"
