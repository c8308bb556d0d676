"""The RabbitMQ adapter's package stays split by job (docs/adapters/rabbitmq.md, "Code
layout"): every module has a docstring, no module or class grows past 500 lines, and the
parts do not know the facade (``adapter.py`` builds and wires them: composition).

Read from the sources (``ast``); imports under ``if TYPE_CHECKING:`` count too, since a
part that needs the facade's type is already coupled to it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "adapters" / "rabbitmq"
MODULES = sorted(PACKAGE.glob("*.py"))
#: the most lines a module or a class of the package may have
LIMIT = 500
#: the modules that may import the facade: the lazy package attribute and the plugin
#: (which names it as a string, so does not import it either)
FACADE_USERS = {"__init__.py", "plugin.py"}


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def test_the_package_is_split() -> None:
    names = {p.name for p in MODULES}
    assert {"adapter.py", "publisher.py", "current.py", "consumers.py"} <= names


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_module_has_a_docstring_and_stays_small(path: Path) -> None:
    tree = _tree(path)
    assert ast.get_docstring(tree), f"{path.name} has no module docstring"
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= LIMIT, f"{path.name}: {lines} lines"
    big = {
        node.name: size
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        and (size := (node.end_lineno or node.lineno) - node.lineno + 1) > LIMIT
    }
    assert not big, f"{path.name}: classes over {LIMIT} lines: {big}"


@pytest.mark.parametrize(
    "path",
    [p for p in MODULES if p.name not in FACADE_USERS | {"adapter.py"}],
    ids=lambda p: p.name,
)
def test_parts_do_not_import_the_facade(path: Path) -> None:
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            relative_facade = node.level == 1 and module == "adapter"
            absolute_facade = module == "wsnmom.adapters.rabbitmq.adapter"
            assert not (relative_facade or absolute_facade), f"{path.name} imports the facade"
            if node.level == 1 and not module:
                assert "adapter" not in {a.name for a in node.names}, path.name
