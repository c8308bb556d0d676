"""docs/plugins.md stays honest: every hook is documented with its current signature, and
the example adapter in it passes the conformance groups it claims to pass."""

from __future__ import annotations

import inspect
import re
import sys
import types
from pathlib import Path

import pytest
from wsnmom.core import hookspecs
from wsnmom.core.adapter import Adapter

from wsnmom.testing.conformance import (
    AckSemantics,
    AdapterBasics,
    CurrentMessage,
    Delete,
    Durability,
    HeadersAndBodies,
    PauseResume,
    PullSemantics,
    QueueLimitsSemantics,
    TopicRouting,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"


def hook_specs() -> list[tuple[str, str]]:
    out = []
    for name, func in vars(hookspecs).items():
        if name.startswith("wsnmom_") and hasattr(func, "wsnmom_spec"):
            params = ", ".join(inspect.signature(func).parameters)
            out.append((name, f"{name}({params})"))
    return out


def test_there_are_hooks() -> None:
    assert len(hook_specs()) >= 8


@pytest.mark.parametrize(("name", "signature"), hook_specs())
def test_hook_is_documented(name: str, signature: str) -> None:
    text = DOC.read_text()
    assert re.search(rf"^#+ {re.escape(name)}\s*$", text, re.M), f"no heading for {name}"
    assert f"\n{signature}\n" in text, f"signature {signature} missing or stale"


def test_hooks_have_docstrings_with_versionadded() -> None:
    for name, _ in hook_specs():
        doc = getattr(hookspecs, name).__doc__ or ""
        assert ".. versionadded::" in doc, name


def _toy_module() -> types.ModuleType:
    text = DOC.read_text()
    match = re.search(r"```python\n(# wsnmom_toy/adapter.py\n.*?)```", text, re.S)
    assert match, "the toy adapter example is missing from docs/plugins.md"
    module = types.ModuleType("wsnmom_toy_adapter_from_docs")
    sys.modules[module.__name__] = module
    exec(compile(match.group(1), str(DOC), "exec"), module.__dict__)
    return module


TOY = _toy_module()


class TestDocumentedToyAdapter(
    AdapterBasics,
    TopicRouting,
    AckSemantics,
    PullSemantics,
    PauseResume,
    Durability,
    QueueLimitsSemantics,
    CurrentMessage,
    Delete,
    HeadersAndBodies,
):
    """The example adapter of docs/plugins.md against the kit (durability etc. skip)."""

    receive_timeout = 2.0

    @pytest.fixture
    def adapter_url(self) -> str:
        return "toy://docs"

    @pytest.fixture
    def adapter_class(self) -> type[Adapter]:
        cls: type[Adapter] = TOY.ToyAdapter
        return cls
