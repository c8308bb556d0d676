"""Adapter options declared once (``wsnmom.core.adapter_options``): every built-in adapter
refuses an unknown option with a did-you-mean and a bad boolean with a precise message, the
documented examples parse, and each adapter page documents exactly the declared options."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from wsnmom.adapters.embedded.adapter import EmbeddedAdapter
from wsnmom.adapters.filelog.adapter import FileLogAdapter
from wsnmom.adapters.kafka.adapter import KafkaAdapter
from wsnmom.adapters.mqtt.adapter import MqttAdapter
from wsnmom.adapters.rabbitmq.adapter import RabbitMQAdapter
from wsnmom.core.adapter import Adapter
from wsnmom.core.adapter_options import (
    AdapterOptionError,
    describe_options,
    option,
    parse_options,
)
from wsnmom.core.config import ConfigError
from wsnmom.core.plugins import get_plugin_manager

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

#: adapter class -> a URL it accepts without connecting anywhere (port 1: nothing listens)
ADAPTERS: dict[type[Adapter], str] = {
    EmbeddedAdapter: "embedded://:memory:",
    FileLogAdapter: "filelog://{tmp}/log",
    RabbitMQAdapter: "amqp://guest:guest@127.0.0.1:1/%2F",
    KafkaAdapter: "kafka://127.0.0.1:1",
    MqttAdapter: "mqtt://127.0.0.1:1",
}
IDS = [cls.name for cls in ADAPTERS]


def _make(cls: type[Adapter], tmp: Path, query: str = "", **options: Any) -> Adapter:
    url = ADAPTERS[cls].format(tmp=tmp)
    if query:
        url += ("&" if "?" in url else "?") + query
    if cls.uses_data_dir:
        options.setdefault("data_dir", str(tmp))
    return cls(url, options)


def _misspelt(name: str) -> str:
    """``name`` with one letter left out (``topic_prefix`` -> ``topic_prefx``)."""
    return name[:-2] + name[-1]


# --- the core function ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Declared:
    flag: bool = option(False, doc="a flag")
    count: int = option(1, minimum=1, doc="a count")
    secret: str = option("", secret=True, doc="a secret")


def test_query_options_and_precedence() -> None:
    got = parse_options(
        _Declared, adapter="test", query=[("count", "3"), ("flag", "yes")], options={"count": 5}
    )
    assert got == _Declared(flag=True, count=5, secret="")


@pytest.mark.parametrize(
    ("query", "options", "message"),
    [
        ([("conut", "3")], {}, "unknown test adapter option ?conut=3 (did you mean count?)"),
        ([], {"flga": True}, "unknown test adapter option adapter_options.flga = True"),
        ([("flag", "maybe")], {}, "test adapter option ?flag=maybe: not a boolean: 'maybe'"),
        ([], {"count": 0}, "test adapter option adapter_options.count = 0: 0 is too small"),
        ([], {"zzz": 1}, "(known: count, flag, secret)"),
    ],
)
def test_mistakes_name_the_option_and_its_source(
    query: list[tuple[str, str]], options: dict[str, Any], message: str
) -> None:
    with pytest.raises(AdapterOptionError) as caught:
        parse_options(_Declared, adapter="test", query=query, options=options)
    assert message in str(caught.value)
    assert isinstance(caught.value, ConfigError)  # wsnmom serve: the configuration status


def test_a_secret_is_never_echoed() -> None:
    with pytest.raises(AdapterOptionError) as caught:
        parse_options(_Declared, adapter="test", options={"secret": ["hunter2"]})
    assert "hunter2" not in str(caught.value)
    assert "adapter_options.secret = ***" in str(caught.value)
    # nor a misspelt one
    with pytest.raises(AdapterOptionError) as caught:
        parse_options(_Declared, adapter="test", query=[("the_password", "hunter2")])
    assert "hunter2" not in str(caught.value)
    assert "?the_password=***" in str(caught.value)


# --- every built-in adapter ----------------------------------------------------------------


@pytest.mark.parametrize("cls", list(ADAPTERS), ids=IDS)
def test_every_adapter_declares_documented_options(cls: type[Adapter]) -> None:
    assert cls.declared_options is not None
    for described in describe_options(cls.declared_options):
        assert described.doc, f"{cls.name}: option {described.name} has no doc string"


@pytest.mark.parametrize("cls", list(ADAPTERS), ids=IDS)
def test_unknown_option_gets_a_did_you_mean(cls: type[Adapter], tmp_path: Path) -> None:
    assert cls.declared_options is not None
    name = describe_options(cls.declared_options)[0].name
    typo = _misspelt(name)
    with pytest.raises(AdapterOptionError, match=rf"did you mean {name}\?"):
        _make(cls, tmp_path, **{typo: "1"})


@pytest.mark.parametrize("cls", list(ADAPTERS), ids=IDS)
def test_unknown_query_argument_gets_a_did_you_mean(cls: type[Adapter], tmp_path: Path) -> None:
    typo = {RabbitMQAdapter: "prefetchh", MqttAdapter: "protocl"}.get(cls, "")
    if not typo:
        assert cls.declared_options is not None
        typo = _misspelt(describe_options(cls.declared_options)[-1].name)
    with pytest.raises(AdapterOptionError, match=r"\?" + typo + r"=1.*did you mean"):
        _make(cls, tmp_path, query=f"{typo}=1")


def test_embedded_refuses_what_it_ignored() -> None:
    """``[adapter_options] foo = 1`` used to be silently ignored on embedded."""
    with pytest.raises(AdapterOptionError, match="unknown embedded adapter option"):
        EmbeddedAdapter("embedded://:memory:", {"foo": 1})


def _boolean_options() -> list[tuple[type[Adapter], str]]:
    found = []
    for cls in ADAPTERS:
        assert cls.declared_options is not None
        for spec in dataclasses.fields(cls.declared_options):
            if spec.type in ("bool", bool) and spec.metadata.get("option", True) and spec.init:
                found.append((cls, spec.name))
    return found


@pytest.mark.parametrize(
    ("cls", "name"), _boolean_options(), ids=[f"{c.name}-{n}" for c, n in _boolean_options()]
)
def test_bad_boolean_is_refused_with_a_precise_error(
    cls: type[Adapter], name: str, tmp_path: Path
) -> None:
    """One boolean rule everywhere: nothing silently becomes False (or True)."""
    with pytest.raises(AdapterOptionError) as caught:
        _make(cls, tmp_path, **{name: "tru"})
    assert f"adapter_options.{name} = 'tru': not a boolean: 'tru'" in str(caught.value)
    for text, expected in (("yes", True), ("0", False), ("OFF", False), ("true", True)):
        adapter = _make(cls, tmp_path, **{name: text})
        assert getattr(_options_of(adapter), name) is expected


def _options_of(adapter: Adapter) -> Any:
    for attr in ("opts", "settings"):
        if hasattr(adapter, attr):
            return getattr(adapter, attr)
    raise AssertionError(f"{adapter!r} keeps no parsed options")


def test_the_filelog_options_reach_the_log(tmp_path: Path) -> None:
    adapter = FileLogAdapter(f"filelog://{tmp_path}/log?partitions=3", {"fsync": "on"})
    assert adapter.opts.partitions == 3 and adapter.opts.fsync is True
    assert adapter.opts.retention is None and adapter.opts.catch_up_readers == 4


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("kafka://", "the Kafka URL needs at least one host:port"),
        ("kafka://h:1/path", "takes no path"),
        ("mqtt://127.0.0.1:1/path", "the MQTT URL takes no path"),
        ("embedded://", "needs a directory"),
        ("filelog://", "needs a directory"),
    ],
)
def test_bad_urls_are_configuration_errors(url: str, message: str, tmp_path: Path) -> None:
    adapter_class = get_plugin_manager().resolve(url)
    options = {"data_dir": str(tmp_path)} if adapter_class.uses_data_dir else {}
    with pytest.raises(ConfigError, match=message):
        adapter_class(url, options)


# --- the documentation ---------------------------------------------------------------------

#: adapter URLs in the documentation that are placeholders, not examples
_PLACEHOLDER = re.compile(r"…|<|PATH|host:port|://$")


def _documented_urls() -> list[str]:
    found: set[str] = set()
    for page in [ROOT / "README.md", *DOCS.glob("*.md"), *DOCS.glob("adapters/*.md")]:
        pattern = r"`((?:embedded|amqps?|rabbitmq|kafka|mqtts?|filelog)://[^`\s]*)`"
        for url in re.findall(pattern, page.read_text()):
            if not _PLACEHOLDER.search(url):
                found.add(url)
    return sorted(found)


@pytest.mark.parametrize("url", _documented_urls())
def test_each_documented_example_url_parses(url: str, tmp_path: Path) -> None:
    adapter_class = get_plugin_manager().resolve(url)
    options = {"data_dir": str(tmp_path)} if adapter_class.uses_data_dir else {}
    adapter_class(url, options)  # constructed, not opened: nothing is connected


def _documented_tables() -> list[tuple[str, str, dict[str, Any]]]:
    """(page, adapter URL, adapter options) of every TOML example with both."""
    found = []
    for page in [*DOCS.glob("*.md"), *DOCS.glob("adapters/*.md")]:
        for block in re.findall(r"```toml\n(.*?)```", page.read_text(), re.S):
            data = tomllib.loads(block)
            if "adapter_url" in data and "adapter_options" in data:
                found.append((page.name, data["adapter_url"], data["adapter_options"]))
    return found


@pytest.mark.parametrize(
    ("page", "url", "options"), _documented_tables(), ids=[t[0] for t in _documented_tables()]
)
def test_each_documented_options_table_parses(page: str, url: str, options: dict[str, Any]) -> None:
    declared = get_plugin_manager().resolve(url).declared_options
    assert declared is not None, page
    parse_options(declared, adapter=page, options=options, fixed=_fixed(declared))


def _fixed(declared: type) -> dict[str, Any]:
    """Values for the fields that come from the URL, not from options."""
    return {
        spec.name: {"bootstrap": "h:1", "host": "h", "port": 1}.get(spec.name, "")
        for spec in dataclasses.fields(declared)
        if not spec.metadata.get("option", True)
        and spec.default is dataclasses.MISSING
        and spec.default_factory is dataclasses.MISSING
    }


def _documented_options(page: Path) -> set[str]:
    """The option names in the first column of the page's ``| option | default |`` table."""
    names: set[str] = set()
    in_table = False
    for line in page.read_text().splitlines():
        if line.startswith("| option | default |"):
            in_table = True
            continue
        if in_table and not line.startswith("|"):
            break
        if in_table and not line.startswith("|---"):
            names.update(re.findall(r"`([a-z0-9_]+)`", line.split("|")[1]))
    return names


@pytest.mark.parametrize("cls", list(ADAPTERS), ids=IDS)
def test_adapter_page_documents_exactly_the_declared_options(cls: type[Adapter]) -> None:
    page = DOCS / "adapters" / f"{cls.name}.md"
    assert cls.declared_options is not None
    declared = {d.name for d in describe_options(cls.declared_options)}
    documented = _documented_options(page)
    assert not declared - documented, f"undocumented in {page.name}: {declared - documented}"
    assert not documented - declared, f"not declared by {cls.name}: {documented - declared}"


def test_configuration_page_links_every_adapter_page() -> None:
    text = (DOCS / "configuration.md").read_text()
    for cls in ADAPTERS:
        assert f"(adapters/{cls.name}.md" in text, cls.name


def test_rabbitmq_tls_verify_follows_the_boolean_rule() -> None:
    """``verify = "false"`` used to leave verification on (any text was true)."""
    url = "amqps://u:p@broker.example/%2F"
    adapter = RabbitMQAdapter(url, {"tls": {"verify": "false"}})
    assert adapter.opts.tls == {"verify": False}
    with pytest.raises(AdapterOptionError, match="not a boolean: 'flase'"):
        RabbitMQAdapter(url, {"tls": {"verify": "flase"}})
    with pytest.raises(
        AdapterOptionError, match=r"unknown key 'ca_fil' \(did you mean ca_file\?\)"
    ):
        RabbitMQAdapter(url, {"tls": {"ca_fil": "/x.pem"}})
