"""docs/configuration.md against the settings model, both ways: every setting has its row
in its section's table and every row is a setting, with the default the code has (in the
units the table gives), every ``[[upstream]]`` key likewise, and every ``WSNMOM_*``
variable that is not a setting (the command line's ones included) is listed there."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import click
import pytest
from wsnmom.core.config import OTHER_VARIABLES, load_settings, setting_names
from wsnmom.core.config_upstreams import UpstreamSettings

from tests.support.documented_values import HOME, documented_value, split_defaults
from wsnmom.cli import cli

ROOT = Path(__file__).resolve().parents[2]
CONFIGURATION = ROOT / "docs" / "configuration.md"
DOCS = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]
#: defaults the table describes rather than states: (documented text, the code's value)
DESCRIBED = {
    "public_url": ("`http://host:port`", None),
    "loops.gateway_id": ("random at each start", ""),
    "quotas.burst": ("2 s of `rate`", None),
    "upstream.namespace": ("the producer's", None),
}


def _rows() -> Iterator[tuple[str, str]]:
    """(dotted name, documented default) of every row of the settings tables: the top
    level's and each ``[section]``'s; ``upstream.KEY`` for the keys of ``[[upstream]]``."""
    section: str | None = None
    for line in CONFIGURATION.read_text().splitlines():
        if line.startswith("## "):
            heading = re.match(r"## `\[\[?(\w+)\]\]?`", line)
            section = "" if line == "## Top level" else heading.group(1) if heading else None
            continue
        if section is None or not line.startswith("| `"):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        names = re.findall(r"`([a-z_]+)`", cells[0])
        for name, default in zip(names, split_defaults(cells[1], len(names)), strict=True):
            yield (f"{section}.{name}" if section and name != "upstream" else name), default


def _defaults() -> dict[str, object]:
    settings = load_settings(None, environ={"HOME": HOME})
    values: dict[str, object] = {}
    for name in setting_names():
        value: object = settings
        for part in name.split("."):
            value = getattr(value, part)
        values[name] = value
    upstream = UpstreamSettings()
    for spec in dataclasses.fields(UpstreamSettings):
        values[f"upstream.{spec.name}"] = getattr(upstream, spec.name)
    return values


def test_every_setting_has_its_row_and_every_row_is_a_setting() -> None:
    documented = [name for name, _ in _rows()]
    assert len(documented) == len(set(documented)), "a setting with two rows"
    assert set(documented) == set(_defaults())


def test_every_documented_default_is_the_codes() -> None:
    defaults = _defaults()
    wrong = []
    for name, text in _rows():
        if name in DESCRIBED:
            assert (text, defaults[name]) == DESCRIBED[name], name
        elif documented_value(text, defaults[name]) != defaults[name]:
            wrong.append(f"{name}: documented {text!r}, the code has {defaults[name]!r}")
    assert wrong == []


def test_a_wrong_default_is_found() -> None:
    assert documented_value("5 min", timedelta(minutes=5)) == timedelta(minutes=5)
    assert documented_value("`PT8H`", timedelta(hours=8)) == timedelta(hours=8)
    assert documented_value("268435456 (256 MiB)", 0) == 256 << 20
    assert documented_value("10,000", 0) == 10_000
    assert documented_value("10 MiB", 0) != 10_000_000
    assert documented_value("1 s", timedelta(0)) != timedelta(seconds=10)


def _command_line_variables() -> set[str]:
    found: set[str] = set()

    def walk(command: click.Command) -> None:
        for param in command.params:
            envvar = param.envvar
            found.update([envvar] if isinstance(envvar, str) else envvar or [])
        for sub in command.commands.values() if isinstance(command, click.Group) else []:
            walk(sub)

    walk(cli)
    return found


def test_every_variable_that_is_not_a_setting_is_listed() -> None:
    text = CONFIGURATION.read_text()
    table = text[text.index("These `WSNMOM_*` variables are read but are not settings") :]
    table = table[: table.index("\n\n", table.index("|"))]
    listed = set(re.findall(r"`(WSNMOM_[A-Z_]*[A-Z])`", table))
    assert listed - {"WSNMOM_TEST_AMQP_URL", "WSNMOM_BENCH_AMQP_URL"} == set(OTHER_VARIABLES)


def test_the_command_lines_variables_are_known_and_documented() -> None:
    variables = _command_line_variables()
    assert {"WSNMOM_BROKER", "WSN_TOKEN"} <= variables
    assert {v for v in variables if v.startswith("WSNMOM_")} <= set(OTHER_VARIABLES)
    text = "".join(doc.read_text() for doc in DOCS)
    assert [v for v in sorted(variables) if f"`{v}`" not in text] == []


def _toml_examples() -> list[tuple[str, str]]:
    """(page, text) of every gateway configuration the documentation shows in a ``toml``
    block; not a credentials file (``[users.NAME]``) nor a ``pyproject.toml``."""
    return [
        (f"{doc.relative_to(ROOT)}#{n}", block)
        for doc in DOCS
        for n, block in enumerate(
            re.findall(r"^ *```toml\n(.*?)^ *```", doc.read_text(), re.M | re.S)
        )
        if not re.search(r"^\[(?:users|project)\b", block, re.M)
    ]


@pytest.mark.parametrize(("page", "text"), _toml_examples(), ids=[p for p, _ in _toml_examples()])
def test_every_documented_configuration_loads_without_a_warning(
    page: str, text: str, tmp_path: Path
) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(text)
    warnings: list[str] = []
    load_settings(config, environ={"HOME": HOME}, warn=warnings.append)
    assert warnings == [], page


def test_every_test_and_benchmark_variable_is_documented_and_read() -> None:
    """The ``WSNMOM_TEST_*`` and ``WSNMOM_BENCH_*`` variables the suite and the benchmarks
    read are the ones the documentation names."""
    pattern = re.compile(r"\bWSNMOM_(?:TEST|BENCH)_[A-Z0-9_]*[A-Z0-9]\b")
    read = {
        name
        for folder in ("tests", "bench", "wsnmom", "scripts")
        for path in (ROOT / folder).rglob("*")
        if path.suffix in (".py", ".sh") and path != Path(__file__)
        for name in pattern.findall(path.read_text())
    }
    documented = {name for doc in DOCS for name in pattern.findall(doc.read_text())}
    assert read == documented
