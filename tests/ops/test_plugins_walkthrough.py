"""The walk-through at the top of docs/plugins.md stays true to the code.

It names the contract's classes, methods, fields, hooks and modules: every one of them must
exist.  It sorts every ``Capabilities`` field into "acted on by core" or "informational",
exactly once, as the field's own doc comment in ``core/adapter_capabilities.py`` says, and
the reference section "Capabilities" agrees.  It names every abstract method of ``Adapter`` and
``SubscriptionHandle``, links each step to a section of the page, and every link of the
page leads to a document and heading.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
from wsnmom.adapters.logbase.adapter import LogAdapter
from wsnmom.adapters.logbase.backend import LogBackend
from wsnmom.adapters.logbase.cursor import CursorHandle
from wsnmom.adapters.logbase.engine import CursorEngine
from wsnmom.core import adapter as contract
from wsnmom.core import hookspecs
from wsnmom.core.adapter import (
    Adapter,
    Capabilities,
    Received,
    SubscriptionHandle,
    SubscriptionSpec,
)
from wsnmom.core.adapter_options import AdapterOptionError
from wsnmom.core.plugins import AdapterRegistry
from wsnmom.core.pull_buffer import PullBuffer
from wsnmom.core.pull_reader import PullReader

from wsnmom.testing.conformance import AdapterConformance

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "plugins.md"
TITLE = "## Writing an adapter in ten steps"

#: the classes the walk-through may name, by the name it uses
CLASSES: dict[str, type[Any]] = {
    "Adapter": Adapter,
    "SubscriptionHandle": SubscriptionHandle,
    "Capabilities": Capabilities,
    "Received": Received,
    "SubscriptionSpec": SubscriptionSpec,
    "LogAdapter": LogAdapter,
    "LogBackend": LogBackend,
    "CursorEngine": CursorEngine,
    "CursorHandle": CursorHandle,
    "AdapterOptionError": AdapterOptionError,
    "AdapterRegistry": AdapterRegistry,
    "PullBuffer": PullBuffer,
    "PullReader": PullReader,
    "AdapterConformance": AdapterConformance,
    "AdapterUnavailable": contract.AdapterUnavailable,
    "PublishFailed": contract.PublishFailed,
}

#: backticked words of the walk-through that are not code names, and what they are
NOT_CODE = {
    "on_message": "the callback argument of SubscriptionHandle.start",
    "adapter_url": "the fixture a conformance subclass provides",
    "redelivered": "Received's flag (a field declared on the class, see test below)",
    "filelog": "the name and scheme of the file-log reference adapter",
    "True": "Python's",
}

_TOKEN = re.compile(r"`([^`\n]+)`")
_IDENT = re.compile(r"[A-Za-z_]\w*(?:\.\w+)*")


def _page() -> str:
    return DOC.read_text(encoding="utf-8")


def _walkthrough() -> str:
    text = _page()
    start = text.index(TITLE)
    end = text.index("\n## ", start + len(TITLE))
    return text[start:end]


def _has(cls: type[Any], attr: str) -> bool:
    if hasattr(cls, attr):
        return True
    return any(attr in vars(base).get("__annotations__", {}) for base in cls.__mro__)


def _resolve(dotted: str) -> object:
    """Import the longest module prefix of ``dotted`` and get the rest as attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(dotted)


def _named() -> list[str]:
    """Code names in backticks: identifiers and dotted names, a call's arguments cut."""
    out = []
    for token in _TOKEN.findall(_walkthrough()):
        head = token.split("(", 1)[0]
        if _IDENT.fullmatch(head):
            out.append(head)
    return out


def _field_docs() -> dict[str, str]:
    """Each ``Capabilities`` field's ``#:`` doc comment, from the source."""
    docs: dict[str, str] = {}
    comment: list[str] = []
    for line in inspect.getsource(Capabilities).splitlines():
        stripped = line.strip()
        if stripped.startswith("#:"):
            comment.append(stripped[2:].strip())
            continue
        match = re.match(r"(\w+): ", stripped)
        if match and comment:
            docs[match.group(1)] = " ".join(comment)
        comment = []
    return docs


def _listed(label: str) -> list[str]:
    lines = [line for line in _walkthrough().splitlines() if line.startswith(f"- **{label}:**")]
    assert len(lines) == 1, f"one line '- **{label}:** ...' in the walk-through"
    return _TOKEN.findall(lines[0])


def test_the_walkthrough_is_one_page_of_steps_each_linked_to_the_reference() -> None:
    text = _walkthrough()
    assert 80 <= len(text.splitlines()) <= 130
    steps = re.findall(r"^\*\*(\d+)\. (.*?)(?=^\*\*\d+\. |\Z)", text, re.M | re.S)
    assert [int(n) for n, _ in steps] == list(range(1, 11))
    for number, body in steps:
        assert "](#" in body, f"step {number} links to no section of the reference"
    assert _page().index(TITLE) < _page().index("## Plugin discovery"), "not at the top"


def test_every_name_the_walkthrough_gives_exists_in_the_code() -> None:
    fields = {f.name for f in dataclasses.fields(Capabilities)}
    named_classes = [CLASSES[n.split(".")[0]] for n in _named() if n.split(".")[0] in CLASSES]
    for name in _named():
        head, _, attr = name.partition(".")
        if name in NOT_CODE or name in fields:
            continue
        if name.startswith("wsnmom."):
            _resolve(name)  # raises when it is gone
        elif name.startswith("wsnmom_"):
            assert hasattr(hookspecs, name), f"{name} is not a hook"
        elif head[0].isupper() and not head.isupper():
            assert head in CLASSES, f"`{name}`: add {head} to CLASSES (or fix the page)"
            assert not attr or _has(CLASSES[head], attr), f"{head} has no {attr}"
        elif head.isupper():
            assert hasattr(contract, name), f"{name} is not in wsnmom.core.adapter"
        else:
            owners = [c.__name__ for c in named_classes if _has(c, name)]
            assert owners, f"`{name}` is no member of a class the walk-through names"
    assert _has(Received, "redelivered")


def test_the_paths_it_cites_exist() -> None:
    for token in _TOKEN.findall(_walkthrough()):
        if token.startswith("adapters/"):
            assert (ROOT / token).exists(), token


@pytest.mark.parametrize("cls", [Adapter, SubscriptionHandle], ids=lambda c: c.__name__)
def test_it_names_every_abstract_method(cls: type[Any]) -> None:
    named = set(_named())
    for method in sorted(cls.__abstractmethods__):
        assert f"{cls.__name__}.{method}" in named, f"{cls.__name__}.{method} is not named"


def test_every_capability_is_acted_on_or_informational_once_as_its_docstring_says() -> None:
    acted, informational = _listed("Acted on by core"), _listed("Informational")
    fields = [f.name for f in dataclasses.fields(Capabilities)]
    assert sorted(acted + informational) == sorted(fields), "each field exactly once"
    docs = _field_docs()
    assert set(docs) == set(fields), "every field has a doc comment"
    for name in fields:
        says = "Informational" in docs[name]
        assert says == (name in informational), f"{name}: the page and its docstring disagree"


def test_the_reference_section_agrees_on_the_informational_fields() -> None:
    text = _page()
    start = text.index("**Informational fields.**")
    paragraph = text[start : text.index("\n\n", start)]
    first_sentence = re.split(r"\s+change\s+nothing", paragraph, maxsplit=1)[0]
    assert sorted(_TOKEN.findall(first_sentence)) == sorted(_listed("Informational"))
    table = text[text.index("How core acts on them:") : start]
    rows = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `")]
    in_table = {t.split("=")[0] for row in rows for t in _TOKEN.findall(row)} - {"True", "False"}
    assert in_table == set(_listed("Acted on by core")), "the table covers what core acts on"


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", doc.read_text(encoding="utf-8"), flags=re.M | re.S)
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}  # no code comments


def test_every_link_of_the_page_leads_to_a_document_and_heading() -> None:
    for target, anchor in re.findall(r"\]\(([\w/.-]*?)(?:#([^)]+))?\)", _page()):
        if target.startswith(("http:", "https:")):
            continue
        doc = DOC.parent / target if target else DOC
        assert doc.is_file(), f"{target} is no document"
        if anchor:
            assert anchor in _anchors(doc), f"{target}#{anchor} leads nowhere"
