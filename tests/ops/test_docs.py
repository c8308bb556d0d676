"""The documentation stands alone and matches the code: no paths outside the repository,
every conformance rule worded with its specification section, every metric described,
the endpoints and the in-progress adapters stated honestly, the documented example
commands work on the shipped sample files."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client.metrics_core import Metric
from wsnmom.core import metrics
from wsnmom.core.plugins import PLANNED_SCHEMES, PluginManager

from wsnmom.cli import cli

ROOT = Path(__file__).resolve().parents[2]
DOCS = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]
CONFORMANCE = ROOT / "docs" / "conformance.md"
OPERATIONS = ROOT / "docs" / "operations.md"

#: paths of the design notes, specifications and checklists kept outside the repository
_OUTSIDE = re.compile(
    r"\bshared/(?:design|specs|schemas)\b|\.\./shared\b|\bdesign/[\w.-]+\.md\b|architecture §|"
    r"wsn-1\.3-checklist|/work/"
)
_RULE_ROW = re.compile(r"^\| ([A-Z]+-B?\d+) \| (.*?) \| (.*?) \|")
_SECTION = re.compile(r"\((?:BN|BR|WS-RP|WS-RL|WS-Topics)[^()]*\)$")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_documentation_cites_nothing_outside_the_repository(doc: Path) -> None:
    hits = [
        f"{n}: {line.strip()}"
        for n, line in enumerate(doc.read_text().splitlines(), 1)
        if _OUTSIDE.search(line)
    ]
    assert hits == []


#: sections of documents the repository does not hold, as code comments used to cite them
_UNHELD_SECTION = re.compile(r"\b(?:architecture|checklist) §", re.IGNORECASE)
_CODE = ["core", "topic_mapping", "soap_frontend", "adapters", "wsnmom", "spark_bridge", "tests"]


def test_code_comments_cite_no_section_of_a_document_outside_the_repository() -> None:
    hits = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for folder in _CODE
        for path in sorted((ROOT / folder).rglob("*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if _UNHELD_SECTION.search(line) and path != Path(__file__)
    ]
    assert hits == []


#: a Markdown document named in code (``docs/x.md``, ``x.md §4``)
_CITED_DOC = re.compile(r"(?<![\w.-])([\w-]+\.md)\b")


def test_code_cites_only_documents_the_repository_holds() -> None:
    held = {p.name for p in ROOT.rglob("*.md") if ".venv" not in p.parts}
    hits = [
        f"{path.relative_to(ROOT)}:{n}: {name}"
        for folder in _CODE
        for path in sorted((ROOT / folder).rglob("*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        for name in _CITED_DOC.findall(line)
        if name not in held and path != Path(__file__)
    ]
    assert hits == []


def _rule_rows() -> dict[str, str]:
    rows = {}
    for line in CONFORMANCE.read_text().splitlines():
        match = _RULE_ROW.match(line)
        if match:
            rows[match.group(1)] = match.group(2)
    return rows


def test_every_rule_has_its_wording_and_section() -> None:
    rows = _rule_rows()
    assert len(rows) >= 200
    for rule, wording in rows.items():
        assert _SECTION.search(wording), (rule, wording)
        assert len(wording) > 30, (rule, wording)


def test_rule_ids_cited_in_the_code_are_defined_in_the_docs() -> None:
    prefixes = sorted({rule.rsplit("-", 1)[0] for rule in _rule_rows()}, key=len, reverse=True)
    cited = re.compile(rf"\b(?:{'|'.join(prefixes)})-B?\d{{1,2}}\b")
    defined = set(_rule_rows())
    missing = set()
    for folder in ("core", "soap_frontend", "adapters", "topic_mapping", "wsnmom", "tests"):
        for source in (ROOT / folder).rglob("*.py"):
            missing |= set(cited.findall(source.read_text())) - defined
    assert missing == set()


def _exported() -> set[str]:
    import wsnmom.server  # noqa: F401 - everything that may register metrics

    names = set()
    family: Metric
    for family in metrics.REGISTRY.collect():
        names.add(f"{family.name}_total" if family.type == "counter" else family.name)
    return names


def test_every_metric_is_documented_and_every_documented_one_exists() -> None:
    text = OPERATIONS.read_text()
    table = text[text.index("## Metrics") :]
    table = table[: table.index("\n## ", 1)]
    documented = set(re.findall(r"^\| `(wsnmom_[a-z_]+)` \|", table, re.M))
    assert _exported() == documented


@pytest.mark.parametrize("doc", [ROOT / "README.md", OPERATIONS], ids=lambda p: p.name)
def test_endpoints_are_described(doc: Path) -> None:
    text = doc.read_text()
    for endpoint in ("/healthz", "/readyz", "/metrics", "/wsn/policy", "/wsn/schemas/", "/admin"):
        assert f"`GET {endpoint}" in text, endpoint


def test_the_served_schema_names_are_listed() -> None:
    from wsnmom.soap_frontend.metadata import SCHEMA_FILES

    text = OPERATIONS.read_text()
    assert all(f"`{name}`" in text for name in SCHEMA_FILES)


def test_adapters_not_shipped_are_not_claimed() -> None:
    registered = PluginManager(environ={}).load().adapters
    readme = (ROOT / "README.md").read_text()
    intro = readme.split("\n## ", 1)[0]
    for scheme, name in PLANNED_SCHEMES.items():
        if scheme in registered:
            continue
        assert name in intro and "in progress" in intro, name
    assert "wsnmom[kafka]" not in readme


def _documented_commands(doc: Path, command: str) -> list[tuple[list[str], str]]:
    """(arguments, output) of every ``$ wsnmom COMMAND ...`` example: its lines joined where
    they end in ``\\``, its output the lines after it up to a blank line."""
    lines = doc.read_text().splitlines()
    found = []
    for i, line in enumerate(lines):
        if not line.strip().startswith(f"$ wsnmom {command}"):
            continue
        words = line.strip()[2:]
        while words.endswith("\\"):
            i += 1
            words = words[:-1] + lines[i].strip()
        output = []
        for following in lines[i + 1 :]:
            if not following.strip():
                break
            output.append(following.strip())
        found.append((shlex.split(words)[1:], "\n".join(output)))
    return found


def test_topics_check_example_works_on_the_shipped_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    examples = _documented_commands(ROOT / "docs" / "topic-mapping.md", "topics check")
    assert examples
    monkeypatch.chdir(ROOT)
    for args, expected in examples:
        assert (ROOT / args[-1]).is_file(), args[-1]
        assert args[-1].startswith("docs/examples/")
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, result.output
        assert result.output.strip() == expected


def test_topics_translate_examples_print_what_is_shown() -> None:
    examples = _documented_commands(ROOT / "docs" / "topic-mapping.md", "topics translate")
    assert len(examples) >= 2
    for args, expected in examples:
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, result.output
        assert [line.strip() for line in result.output.strip().splitlines()] == expected.split(
            "\n"
        ), args


def test_sample_namespace_loads_as_the_gateways_topic_set(tmp_path: Path) -> None:
    from wsnmom.core.config import load_settings

    from wsnmom.server import load_topic_set

    sample = ROOT / "docs" / "examples" / "building-topics.xml"
    settings = load_settings(
        None, environ={}, overrides={"topic_namespaces": [str(sample)], "data_dir": str(tmp_path)}
    )
    topics = load_topic_set(settings).topics()
    assert {"/".join(t.path) for t in topics} >= {"sensors/temperature", "doors/closed"}


@pytest.mark.parametrize("adapter", ["rabbitmq", "kafka", "mqtt"])
def test_every_metadata_header_is_listed_in_the_adapter_docs(adapter: str) -> None:
    """The headers (MQTT 5 user properties) native consumers see: every one core sets."""
    from wsnmom.core import adapter as core_adapter
    from wsnmom.core import codec

    headers = {
        value
        for module in (core_adapter, codec)
        for name, value in vars(module).items()
        if name.startswith("HEADER_") and isinstance(value, str) and value.startswith("wsnmom-")
    }
    assert {"wsnmom-request-id", "wsnmom-via"} <= headers
    text = (ROOT / "docs" / "adapters" / f"{adapter}.md").read_text()
    assert not [h for h in sorted(headers) if f"`{h}`" not in text]


_FENCED = re.compile(r"^ *```.*?^ *```", re.M | re.S)
_LINK = re.compile(r"\]\(([^)\s]*)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading (without the ``-1`` of a repeated one)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#+ (.+)$", _FENCED.sub("", doc.read_text()), re.M):
        slug = _slug(heading)
        seen[slug] = seen.get(slug, 0) + 1
    return {f"{s}-{n}" if n else s for s, count in seen.items() for n in range(count)}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_to_a_file_and_heading(doc: Path) -> None:
    """A link between documents (``[x](operations.md#logs)``) names a file the repository
    holds and, with an anchor, a heading of that document."""
    text = re.sub(r"`[^`\n]*`", "", _FENCED.sub("", doc.read_text()))
    broken = []
    for link in _LINK.findall(text):
        if link.startswith(("http:", "https:", "mailto:")):
            continue
        target, _, anchor = link.partition("#")
        linked = (doc.parent / target) if target else doc
        if not linked.exists():
            broken.append(f"{link}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{link}: no such heading")
    assert broken == []


#: a test named in a code span: ``test_x``, ``test_x[param]`` or ``path/file.py::test_x``;
#: not an earlier name the text gives with its new one (```old`, now ``new```)
_CITED_TEST = re.compile(r"`(?:([\w/.-]+\.py)::)?(test_\w+)(?:\[[^\]`]*\])?`(?!, now )")


def _tests_defined() -> dict[str, set[str]]:
    """Test functions and test modules (without ``.py``) -> the files that hold them."""
    defined: dict[str, set[str]] = {}
    for folder in ("tests", "wsnmom/testing"):
        for path in (ROOT / folder).rglob("*.py"):
            defined.setdefault(path.stem, set()).add(path.name)
            for name in re.findall(r"def (test_\w+)", path.read_text()):
                defined.setdefault(name, set()).add(path.name)
    return defined


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cited_test_exists(doc: Path) -> None:
    """A test the documentation names as proof of something is one the suite has (in the
    module named with it)."""
    defined = _tests_defined()
    missing = [
        f"{module}::{name}" if module else name
        for module, name in _CITED_TEST.findall(doc.read_text())
        if name not in defined or (module and Path(module).name not in defined[name])
    ]
    assert missing == []


def _admin_routes() -> set[str]:
    """``METHOD /path`` of every admin API route, parameters as ``<>``; the subscription
    action route once per action."""
    from flask import Flask
    from wsnmom.soap_frontend import admin_actions, app  # noqa: F401 - registers the routes
    from wsnmom.soap_frontend.admin_api import admin_api

    flask_app = Flask(__name__)
    flask_app.register_blueprint(admin_api)
    routes = set()
    for rule in flask_app.url_map.iter_rules():
        if rule.endpoint == "static":
            continue
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
            path = re.sub(r"<(?:[^:>]+:)?([^>]+)>", r"<\1>", rule.rule)
            if path.endswith("/<action>"):
                actions = admin_actions._SUBSCRIPTION_ACTIONS
                routes |= {f"{method} {path[: -len('<action>')]}{a}" for a in actions}
            else:
                routes.add(f"{method} {path}")
    return {re.sub(r"<[^>]+>", "<>", route) for route in routes}


def test_every_admin_api_route_is_documented_and_every_documented_one_exists() -> None:
    """operations.md names every route of the admin API (``GET /wsn/admin/api/...``, in its
    tables or its text) and no other."""
    text = OPERATIONS.read_text()
    documented = set()
    for method, path, more in re.findall(
        r"\b(GET|POST)\s+(/wsn/admin/api/[^`\s\[?]*)[^`]*`(?: \(([^)]*)\))?", text
    ):
        path = re.sub(r"<[^>]+>", "<>", path)
        documented.add(f"{method} {path}")
        for alternative in re.findall(r"`(\w+)`", more):  # "/pause` (`resume`, ...)"
            documented.add(f"{method} {path.rsplit('/', 1)[0]}/{alternative}")
    assert documented == _admin_routes()


def test_every_hook_is_documented_with_its_arguments() -> None:
    """docs/plugins.md has a heading and a call line (``wsnmom_x(a, b)``) for every hook of
    ``core/hookspecs.py``, with the hook's arguments, and documents no other hook."""
    import inspect

    from wsnmom.core import hookspecs

    text = (ROOT / "docs" / "plugins.md").read_text()
    hooks = {
        name: list(inspect.signature(function).parameters)
        for name, function in vars(hookspecs).items()
        if name.startswith("wsnmom_") and inspect.isfunction(function)
    }
    documented = {
        name: [a.strip() for a in arguments.split(",") if a.strip()]
        for name, arguments in re.findall(r"^(wsnmom_\w+)\(([^)]*)\)$", text, re.M)
    }
    headings = set(re.findall(r"^#### (wsnmom_\w+)$", text, re.M))
    assert documented == hooks
    assert headings == set(hooks)
