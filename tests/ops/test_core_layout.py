"""The product's modules stay split where a reader would lose the thread: every module of
``core/`` says its one job in a docstring, and no module of the product's packages
(``wsnmom/``, ``core/``, ``adapters/``, ``soap_frontend/``, ``topic_mapping/``,
``spark_bridge/``; not ``tests/`` or ``bench/``) grows past 500 lines, so that a module that
grows is split along its jobs (docs/architecture.md) rather than left to become the next
1,000-line module.

Read from the sources, so the test needs no middleware.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "core"
#: the folders of the product's import packages (pyproject's package-dir)
PRODUCT = ("wsnmom", "core", "adapters", "soap_frontend", "topic_mapping", "spark_bridge")
#: the most lines a module may have
LIMIT = 500


@pytest.mark.parametrize("path", sorted(CORE.glob("*.py")), ids=lambda p: p.name)
def test_every_core_module_has_a_docstring(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    assert ast.get_docstring(tree), f"core/{path.name} has no module docstring"


def test_every_product_module_stays_under_the_limit() -> None:
    sizes = {
        path.relative_to(ROOT).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for package in PRODUCT
        for path in (ROOT / package).rglob("*.py")
    }
    assert len(sizes) > 300, sorted(sizes)  # the walk found the product's modules
    over = [f"{name} has {n} lines" for name, n in sorted(sizes.items()) if n > LIMIT]
    assert not over, (
        f"modules over {LIMIT} lines (split each along its jobs, one job per module; "
        f"docs/architecture.md): " + "; ".join(over)
    )


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
