"""Every ``wsnmom`` command line the documentation shows (in a code block or a code span)
names commands and options the command line has, spelt as it spells them."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from wsnmom.cli import cli

ROOT = Path(__file__).resolve().parents[2]
DOCS = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]
_FENCED = re.compile(r"^ *```.*?^ *```", re.M | re.S)
#: ``wsnmom`` (or ``.venv/bin/wsnmom``) and its words, up to a shell operator or comment
_INVOCATION = re.compile(r"(?:^|[\s`(/$])wsnmom((?: +[^\s`|;&#>)]+)+)")
_WORD = re.compile(r"[a-z][a-z-]+")
_OPTION = re.compile(r"(--?[a-zA-Z][\w-]*)(?:=.*)?")


def _code(text: str) -> Iterator[str]:
    """The lines of the code blocks (continuations joined) and the code spans of a text."""
    for block in _FENCED.findall(text):
        yield from block.replace("\\\n", " ").splitlines()
    yield from re.findall(r"`([^`\n]+)`", _FENCED.sub("", text))


def _problems(words: list[str]) -> Iterator[str]:
    command: click.Command = cli
    path = ["wsnmom"]
    for word in words:
        if isinstance(command, click.Group) and not word.startswith("-"):
            if word in command.commands:
                command = command.commands[word]
                path.append(word)
                continue
            if _WORD.fullmatch(word):
                yield f"{' '.join(path)} {word}: no such command"
            return
        option = _OPTION.fullmatch(word)
        if option:
            known = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
            if option.group(1) not in known | {"--help"}:
                yield f"{' '.join(path)} {option.group(1)}: no such option"


def _invocations(doc: Path) -> list[list[str]]:
    return [
        match.group(1).split()
        for line in _code(doc.read_text())
        for match in _INVOCATION.finditer(line)
    ]


def test_the_documentation_shows_command_lines() -> None:
    assert sum(len(_invocations(doc)) for doc in DOCS) > 100


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_documented_command_line_exists(doc: Path) -> None:
    assert [p for words in _invocations(doc) for p in _problems(words)] == []


def test_a_misspelt_command_or_option_is_found() -> None:
    assert list(_problems(["serve", "--wait-for-middlewares"])) == [
        "wsnmom serve --wait-for-middlewares: no such option"
    ]
    assert list(_problems(["subscription", "list"])) == ["wsnmom subscription: no such command"]
    assert list(_problems(["store", "info", "--json", "sqlite:///x"])) == []


#: an example script and what follows it on the command line
_EXAMPLE = re.compile(r"\bexamples/(\w+)\.py((?: +[^\s`|;&#>)]+)*)")


def _example_options(script: str) -> set[str]:
    source = (ROOT / "examples" / f"{script}.py").read_text()
    return {"--help", *re.findall(r"add_argument\(\s*\"(--[\w-]+)\"", source)}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_documented_example_command_line_exists(doc: Path) -> None:
    """``python examples/X.py --option ...``: the script exists and takes those options."""
    wrong = [
        f"examples/{script}.py {option}"
        for line in _code(doc.read_text())
        for script, words in _EXAMPLE.findall(line)
        for option in re.findall(r"(?<!\S)(--[\w-]+)", words)
        if option not in _example_options(script)
    ]
    assert wrong == []


def test_the_spark_walkthroughs_variables_are_the_ones_its_script_writes() -> None:
    """docs/spark.md's steps use ``$WSN_*`` of the ``env.sh`` examples/spark_local_brokers.py
    writes."""
    written = set(
        re.findall(r'"(WSN_[A-Z_]+)":', (ROOT / "examples" / "spark_local_brokers.py").read_text())
    )
    used = set(re.findall(r"\$\{?(WSN_[A-Z_]+)", (ROOT / "docs" / "spark.md").read_text()))
    assert used and used <= written, used - written


#: ``python -m bench.NAME`` and what follows it
_BENCH = re.compile(r"-m (bench(?:\.\w+)*)((?: +[^\s`|;&#>)]+)*)")


def _module_options(module: str) -> set[str] | None:
    """The ``--options`` a benchmark module spells (None: no such module)."""
    path = ROOT / f"{module.replace('.', '/')}.py"
    path = path if path.is_file() else ROOT / module.replace(".", "/") / "__main__.py"
    return {"--help", *re.findall(r"\"(--[\w-]+)\"", path.read_text())} if path.is_file() else None


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_documented_benchmark_command_line_exists(doc: Path) -> None:
    """``python -m bench.X --option ...``: the module exists and knows those options."""
    wrong = []
    for line in _code(doc.read_text()):
        for module, words in _BENCH.findall(line):
            known = _module_options(module)
            options = re.findall(r"(?<!\S)(--[\w-]+)", words)
            wrong += [f"{module} {o}" for o in options if known is None or o not in known]
    assert wrong == []


def _leaf_commands(command: click.Command = cli, path: tuple[str, ...] = ()) -> Iterator[str]:
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from _leaf_commands(sub, (*path, name))
    else:
        yield " ".join(path)


def test_every_command_is_documented() -> None:
    """Each command of ``wsnmom`` is shown somewhere (``wsnmom GROUP a|b ID|NAME`` counts)."""
    text = "".join(doc.read_text() for doc in DOCS)
    missing = []
    for leaf in _leaf_commands():
        *group, name = leaf.split()
        prefix = "".join(f"{re.escape(word)} " for word in group)
        alternatives = r"(?:[^`\n|\\]*\\?\|)*"  # "list\|show ID\|" in a table
        if not re.search(rf"wsnmom {prefix}{alternatives}{re.escape(name)}\b", text):
            missing.append(leaf)
    assert missing == []
