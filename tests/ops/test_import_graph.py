"""The import graph of the wsnmom package: no import cycles, and the layers keep to their
side (core knows no SOAP and no middleware, topic_mapping is pure, the SOAP frontend
reaches the broker only through ``core.ports.BrokerPort``, the Spark bridge reaches the
adapters only through their public surfaces and no adapter imports the bridge).

The graph is read from the sources (``ast``), so an import inside a function counts like
one at the top of a module; imports under ``if TYPE_CHECKING:`` never run and are left out.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: import package -> folder, as pyproject's package-dir maps them
PACKAGES = {
    "wsnmom.core": ROOT / "core",
    "wsnmom.topic_mapping": ROOT / "topic_mapping",
    "wsnmom.soap_frontend": ROOT / "soap_frontend",
    "wsnmom.adapters": ROOT / "adapters",
    "wsnmom.spark_bridge": ROOT / "spark_bridge",
    "wsnmom": ROOT / "wsnmom",
}


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found.setdefault(".".join([package, *parts]), path)
    return found


MODULES = _modules()


def _import_statements(
    body: list[ast.stmt], typing_only: bool = False
) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """The import statements in ``body`` and the blocks nested in it (functions included),
    each with whether it sits under ``if TYPE_CHECKING:`` (its test or any branch of it).
    Imports are statements, so only statement blocks are searched: walking every node of
    every expression cost seconds of each worker's collection."""
    for stmt in body:
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            yield stmt, typing_only
            continue
        inner = typing_only or (
            isinstance(stmt, ast.If) and "TYPE_CHECKING" in ast.unparse(stmt.test)
        )
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            for child in getattr(stmt, field, ()):
                if isinstance(child, ast.stmt):
                    yield from _import_statements([child], inner)
                else:  # an except handler or a match case: a block of its own
                    yield from _import_statements(child.body, inner)


def _runtime_imports(name: str, tree: ast.Module, *, typing: bool = False) -> Iterator[str]:
    """Every wsnmom module ``name`` (parsed: ``tree``) imports when it runs (functions
    included); with ``typing``, those it imports for type checking only too."""
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
    for node, typing_only in _import_statements(tree.body):
        if typing_only and not typing:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [module] + [f"{module}.{alias.name}" for alias in node.names]
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):
                yield target


@cache
def _trees() -> dict[str, ast.Module]:
    """Every module's syntax tree, parsed when a test first needs the graph (not at
    collection, which every worker runs)."""
    return {name: ast.parse(path.read_text(encoding="utf-8")) for name, path in MODULES.items()}


@cache
def graph() -> dict[str, set[str]]:
    """Module -> the wsnmom modules it imports when it runs."""
    return {name: set(_runtime_imports(name, tree)) for name, tree in _trees().items()}


@cache
def typed_graph() -> dict[str, set[str]]:
    """:func:`graph` with the imports made for type checking only."""
    return {name: set(_runtime_imports(name, t, typing=True)) for name, t in _trees().items()}


#: what adapters offer code outside the gateway (the Spark bridge): one module each
PUBLIC_SURFACES = frozenset(
    {
        "wsnmom.adapters.kafka.public",
        "wsnmom.adapters.logbase.public",
        "wsnmom.adapters.mqtt.public",
        "wsnmom.adapters.rabbitmq.public",
    }
)


def _cycles() -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph()[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph()):
        if v not in index:
            visit(v)
    return found


def test_the_graph_is_read() -> None:
    assert "wsnmom.soap_frontend.fastpath" in MODULES
    assert "wsnmom.soap_frontend.dispatch" in graph()["wsnmom.soap_frontend.fastpath"]
    assert "wsnmom.core.ports" in graph()["wsnmom.soap_frontend.dispatch"]


def test_no_import_cycles() -> None:
    assert _cycles() == []


def test_the_spark_bridge_is_in_the_graph() -> None:
    assert "wsnmom.adapters.mqtt.public" in graph()["wsnmom.spark_bridge.buffer"]
    assert "wsnmom.adapters.kafka.public" in typed_graph()["wsnmom.spark_bridge.native_kafka"]
    assert "wsnmom.adapters.kafka.public" not in graph()["wsnmom.spark_bridge.native_kafka"]


def _imports_under(prefix: str) -> dict[str, set[str]]:
    return {n: deps for n, deps in graph().items() if n == prefix or n.startswith(prefix + ".")}


def test_core_knows_no_soap_and_no_middleware() -> None:
    for name, deps in _imports_under("wsnmom.core").items():
        bad = {
            d
            for d in deps
            if d.startswith(("wsnmom.soap_frontend", "wsnmom.adapters"))
            or d in ("wsnmom.server", "wsnmom.cli")
        }
        assert not bad, f"{name} imports {sorted(bad)}"


def test_topic_mapping_is_pure() -> None:
    for name, deps in _imports_under("wsnmom.topic_mapping").items():
        outside = {d for d in deps if not d.startswith("wsnmom.topic_mapping")}
        assert not outside, f"{name} imports {sorted(outside)}"


def test_the_soap_frontend_reaches_the_broker_through_its_port() -> None:
    for name, deps in _imports_under("wsnmom.soap_frontend").items():
        assert "wsnmom.core.service" not in deps, name
        assert not any(d.startswith("wsnmom.adapters") for d in deps), name


def test_the_frontend_imports_the_core_modules_architecture_md_names_and_no_other() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text[text.index("### What the frontend shares with core") :]
    section = section[: section.index("\n#", 1)]
    core = {n.removeprefix("wsnmom.core.") for n in MODULES if n.startswith("wsnmom.core.")}
    listed = set(re.findall(r"`(\w+)`", section)) & core
    used = {
        d.removeprefix("wsnmom.core.")
        for name, deps in _imports_under("wsnmom.soap_frontend").items()
        for d in typed_graph()[name]
        if d.startswith("wsnmom.core.")
    }
    assert used - listed == set(), "imported by the frontend, not named in architecture.md"
    assert listed - used == set(), "named in architecture.md, not imported by the frontend"


def test_the_spark_bridge_reaches_adapters_only_through_their_public_surfaces() -> None:
    assert all(surface in MODULES for surface in PUBLIC_SURFACES)
    for name, deps in typed_graph().items():
        if not name.startswith("wsnmom.spark_bridge"):
            continue
        inside = {d for d in deps if d.startswith("wsnmom.adapters") and d not in PUBLIC_SURFACES}
        assert not inside, f"{name} imports adapter internals {sorted(inside)}"


def test_no_adapter_imports_the_spark_bridge() -> None:
    for name in _imports_under("wsnmom.adapters"):
        bridge = {d for d in typed_graph()[name] if d.startswith("wsnmom.spark_bridge")}
        assert not bridge, f"{name} imports {sorted(bridge)}"
