"""Plugin manager, adapter registry, env toggles and the adapters/plugins commands."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from wsnmom.core import plugins as plugins_mod
from wsnmom.core.hookspecs import hookimpl
from wsnmom.core.plugins import (
    AdapterRegistry,
    PluginManager,
    UnknownAdapterScheme,
    create_adapter,
    resolve,
)


@pytest.fixture
def plugin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory on sys.path holding throwaway plugin modules."""
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("wsnmom_test_plugin")]:
        del sys.modules[name]


def write_plugin(directory: Path, module: str, scheme: str, target: str | None = None) -> None:
    target = target or "wsnmom.adapters.embedded.adapter:EmbeddedAdapter"
    (directory / f"{module}.py").write_text(
        textwrap.dedent(
            f"""
            from wsnmom.core.hookspecs import hookimpl

            @hookimpl
            def wsnmom_register_adapters(registry):
                registry.add({scheme!r}, {target!r}, extra="testextra")
            """
        )
    )


def fake_entry_points(
    monkeypatch: pytest.MonkeyPatch, extra: dict[str, str]
) -> list[importlib.metadata.EntryPoint]:
    eps = [
        importlib.metadata.EntryPoint(name, module, plugins_mod.ENTRY_POINT_GROUP)
        for name, module in extra.items()
    ]
    monkeypatch.setattr(plugins_mod, "_entry_points", lambda: eps)
    return eps


# --------------------------------------------------------------------------- registry


def test_resolve_embedded() -> None:
    cls = resolve("embedded:///tmp/x")
    assert cls.name == "embedded"
    assert "embedded" in cls.schemes


def test_create_adapter_does_not_open(tmp_path: Path) -> None:
    adapter = create_adapter(f"embedded://{tmp_path / 's'}", {"synchronous": "full"})
    assert adapter.options["synchronous"] == "full"
    assert adapter.ping() is False
    assert not (tmp_path / "s").exists()


def test_did_you_mean() -> None:
    with pytest.raises(UnknownAdapterScheme, match="Did you mean 'embedded'"):
        resolve("embeded://x")


def test_known_scheme_names_the_extra() -> None:
    pm = PluginManager(environ={"WSNMOM_BLOCKED_PLUGINS": "rabbitmq,kafka"}).load()
    with pytest.raises(UnknownAdapterScheme, match=r'pip install "wsnmom\[rabbitmq\]"'):
        pm.resolve("amqp://localhost")


@pytest.mark.parametrize("url", ["kafka://localhost:9092", "mqtt://localhost", "mqtts://h"])
def test_planned_scheme_suggests_no_extra(url: str) -> None:
    """Until the Kafka and MQTT adapters ship, their schemes suggest no extra to install."""
    pm = PluginManager(environ={}).load()
    if url.split(":", 1)[0] in pm.adapters:
        return  # the adapter has shipped: resolving may need its client library instead
    with pytest.raises(UnknownAdapterScheme, match="in progress") as info:
        pm.resolve(url)
    assert "pip install" not in str(info.value)


def test_url_without_scheme() -> None:
    with pytest.raises(ValueError, match="scheme"):
        resolve("/just/a/path")


def test_missing_client_library_names_the_extra() -> None:
    reg = AdapterRegistry()
    reg.add("nope", "wsnmom_no_such_client_lib.adapter:Adapter", extra="nope")
    with pytest.raises(ImportError, match=r'pip install "wsnmom\[nope\]"'):
        reg.load("nope")


def test_target_is_imported_lazily(plugin_dir: Path) -> None:
    (plugin_dir / "wsnmom_test_plugin_lazy.py").write_text("raise RuntimeError('imported!')\n")
    reg = AdapterRegistry()
    reg.add("lazy", "wsnmom_test_plugin_lazy:Adapter")
    assert "wsnmom_test_plugin_lazy" not in sys.modules
    assert reg.schemes() == ["lazy"]


def test_target_must_be_an_adapter() -> None:
    reg = AdapterRegistry()
    reg.add("bad", "wsnmom.core.plugins:PluginManager")
    with pytest.raises(TypeError, match=r"not a wsnmom\.core\.adapter\.Adapter"):
        reg.load("bad")


def test_duplicate_scheme_needs_replace() -> None:
    reg = AdapterRegistry()
    reg.add("x", "a.b:C")
    reg.add("x", "a.b:C")  # same target again: fine
    with pytest.raises(ValueError, match="already registered"):
        reg.add("x", "d.e:F")
    reg.add("x", "d.e:F", replace=True)
    entry = reg.get("X")
    assert entry is not None and entry.target == "d.e:F"


def test_target_format_checked() -> None:
    with pytest.raises(ValueError, match="module:Class"):
        AdapterRegistry().add("x", "no.colon.Here")


def test_importing_wsnmom_imports_no_client_library() -> None:
    code = (
        "import sys, wsnmom.core.plugins as p; p.get_plugin_manager();"
        "p.resolve('embedded://x');"
        "print(sorted(m for m in ('pika', 'confluent_kafka', 'paho') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------- manager


def test_builtins_load_from_the_one_list() -> None:
    pm = PluginManager(environ={}).load()
    names = {p.name: p for p in pm.plugins()}
    assert {n for n, p in names.items() if p.builtin} == set(plugins_mod.BUILTIN_PLUGINS)
    assert names["embedded"].schemes == ("embedded",)
    assert names["embedded"].distribution == "wsnmom"
    assert "wsnmom_register_adapters" in names["embedded"].hooks


def test_builtins_are_not_declared_twice() -> None:
    """The built-ins are listed once, in code; wsnmom's pyproject declares no entry point
    for them (a second list that could drift, as kafka and mqtt once did)."""
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    entry_points = tomllib.loads(pyproject.read_text())["project"].get("entry-points", {})
    assert plugins_mod.ENTRY_POINT_GROUP not in entry_points


def test_stale_metadata_naming_a_builtin_loads_it_once(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_entry_points(monkeypatch, {"kafka": "wsnmom.adapters.kafka.plugin"})
    pm = PluginManager(environ={}).load()
    kafka = [p for p in pm.plugins() if p.name == "kafka"]
    assert len(kafka) == 1 and kafka[0].builtin and not pm.failures()


def test_known_schemes_cover_the_builtins() -> None:
    pm = PluginManager(environ={}).load()
    registered = {e.scheme for e in pm.adapters.entries()}
    # the two adapters without a client library need no install hint
    assert registered - {"embedded", "filelog"} == set(plugins_mod.KNOWN_SCHEMES)


@pytest.mark.parametrize(
    "url",
    [
        "embedded:///tmp/x",
        "amqp://127.0.0.1/",
        "amqps://127.0.0.1/",
        "kafka://127.0.0.1:9092",
        "mqtt://127.0.0.1:1883",
        "mqtts://127.0.0.1:8883",
    ],
)
def test_disable_autoload_resolves_every_builtin_scheme(url: str) -> None:
    pm = PluginManager(environ={"WSNMOM_DISABLE_PLUGIN_AUTOLOAD": "1"}).load()
    assert pm.resolve(url).__name__.endswith("Adapter")


def test_disable_autoload_in_a_fresh_process() -> None:
    code = (
        "import wsnmom.core.plugins as p;"
        "print(p.resolve('kafka://127.0.0.1:9092').__name__,"
        " p.resolve('mqtt://127.0.0.1').__name__)"
    )
    env = {**os.environ, "WSNMOM_DISABLE_PLUGIN_AUTOLOAD": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.split() == ["KafkaAdapter", "MqttAdapter"]


def test_third_party_entry_point(monkeypatch: pytest.MonkeyPatch, plugin_dir: Path) -> None:
    write_plugin(plugin_dir, "wsnmom_test_plugin_a", "alpha")
    fake_entry_points(monkeypatch, {"alpha": "wsnmom_test_plugin_a"})
    pm = PluginManager(environ={}).load()
    assert "alpha" in pm.adapters
    assert pm.resolve("alpha://x").name == "embedded"


def test_disable_autoload_keeps_builtins(monkeypatch: pytest.MonkeyPatch, plugin_dir: Path) -> None:
    write_plugin(plugin_dir, "wsnmom_test_plugin_a", "alpha")
    fake_entry_points(monkeypatch, {"alpha": "wsnmom_test_plugin_a"})
    pm = PluginManager(environ={"WSNMOM_DISABLE_PLUGIN_AUTOLOAD": "1"}).load()
    assert "alpha" not in pm.adapters
    assert "embedded" in pm.adapters


def test_wsnmom_plugins_selects(monkeypatch: pytest.MonkeyPatch, plugin_dir: Path) -> None:
    write_plugin(plugin_dir, "wsnmom_test_plugin_a", "alpha")
    write_plugin(plugin_dir, "wsnmom_test_plugin_b", "beta")
    write_plugin(plugin_dir, "wsnmom_test_plugin_c", "gamma")
    fake_entry_points(
        monkeypatch, {"alpha": "wsnmom_test_plugin_a", "beta": "wsnmom_test_plugin_b"}
    )
    env = {"WSNMOM_PLUGINS": "beta,wsnmom_test_plugin_c", "WSNMOM_DISABLE_PLUGIN_AUTOLOAD": "1"}
    pm = PluginManager(environ=env).load()
    assert "alpha" not in pm.adapters
    assert "beta" in pm.adapters
    assert "gamma" in pm.adapters  # a module path without an entry point
    assert "embedded" in pm.adapters


def test_blocked_plugins(monkeypatch: pytest.MonkeyPatch, plugin_dir: Path) -> None:
    write_plugin(plugin_dir, "wsnmom_test_plugin_a", "alpha")
    fake_entry_points(monkeypatch, {"alpha": "wsnmom_test_plugin_a"})
    pm = PluginManager(environ={"WSNMOM_BLOCKED_PLUGINS": "alpha, embedded"}).load()
    assert "alpha" not in pm.adapters
    assert "embedded" not in pm.adapters
    blocked = {p.name for p in pm.plugins() if p.blocked}
    assert blocked == {"alpha", "embedded"}


def test_broken_plugin_is_reported(monkeypatch: pytest.MonkeyPatch, plugin_dir: Path) -> None:
    (plugin_dir / "wsnmom_test_plugin_broken.py").write_text("import no_such_module_xyz\n")
    (plugin_dir / "wsnmom_test_plugin_typo.py").write_text(
        "from wsnmom.core.hookspecs import hookimpl\n"
        "@hookimpl\ndef wsnmom_register_adaptors(registry):\n    pass\n"
    )
    fake_entry_points(
        monkeypatch,
        {"broken": "wsnmom_test_plugin_broken", "typo": "wsnmom_test_plugin_typo"},
    )
    pm = PluginManager(environ={}).load()
    failures = pm.failures()
    assert "no_such_module_xyz" in failures["broken"]
    assert "wsnmom_register_adaptors" in failures["typo"]
    assert "embedded" in pm.adapters
    with pytest.raises(UnknownAdapterScheme, match="failed to load: broken"):
        pm.resolve("zzz://x")


def test_late_registration_is_historic() -> None:
    pm = PluginManager(environ={}).load()

    class Late:
        @hookimpl
        def wsnmom_register_adapters(self, registry: AdapterRegistry) -> None:
            registry.add("late", "wsnmom.adapters.embedded.adapter:EmbeddedAdapter")

    pm.register(Late(), name="late")
    assert "late" in pm.adapters


def test_observer_errors_are_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    pm = PluginManager(environ={}).load()
    calls: list[str] = []

    class Observer:
        @hookimpl
        def wsnmom_notification_delivered(self, subscription_id: str) -> None:
            calls.append(subscription_id)
            raise RuntimeError("observer bug")

    pm.register(Observer(), name="observer")
    pm.notification_delivered(message=object(), subscription_id="s1")  # type: ignore[arg-type]
    assert calls == ["s1"]
    assert "observer bug" in caplog.text


def test_register_commands_hook() -> None:
    import click

    pm = PluginManager(environ={}).load()

    class Commands:
        @hookimpl
        def wsnmom_register_commands(self, cli: click.Group) -> None:
            @cli.command("hello")
            def hello() -> None:
                click.echo("hi")

    pm.register(Commands(), name="commands")
    group = click.Group()
    pm.register_commands(group)
    assert CliRunner().invoke(group, ["hello"]).output == "hi\n"


# --------------------------------------------------------------------------- CLI


def test_cli_adapters_lists_capabilities() -> None:
    from wsnmom.cli import cli

    result = CliRunner().invoke(cli, ["adapters", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["scheme"]: r for r in json.loads(result.output)["adapters"]}
    emb = rows["embedded"]
    assert emb["available"] is True
    assert emb["capabilities"]["syntax"] == "embedded"
    assert emb["capabilities"]["native_queue_limits"] is True
    (synchronous,) = emb["options"]
    assert synchronous["name"] == "synchronous" and synchronous["default"] == "'NORMAL'"
    assert "SQLite durability" in synchronous["doc"]
    text = CliRunner().invoke(cli, ["adapters"]).output
    assert "embedded://  embedded  installed  " in text
    assert "    options: synchronous\n" in text
    # an installed adapter with an extra gets no install hint (its library is there)
    (kafka,) = [line for line in text.splitlines() if line.startswith("kafka://")]
    if rows["kafka"]["available"]:
        assert "installed" in kafka and "pip install" not in kafka


def test_cli_adapters_shows_why_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    from wsnmom.cli import cli

    pm = PluginManager(environ={}).load()
    pm.adapters.add("ghost", "wsnmom_ghost_client.x:Adapter", extra="ghost")
    monkeypatch.setattr("wsnmom.core.plugin_cli.get_plugin_manager", lambda: pm)
    result = CliRunner().invoke(cli, ["adapters"])
    assert result.exit_code == 0
    assert "ghost://  NOT INSTALLED" in result.output
    assert 'pip install "wsnmom[ghost]"' in result.output


def test_cli_plugins() -> None:
    from wsnmom.cli import cli

    result = CliRunner().invoke(cli, ["plugins", "--json"])
    assert result.exit_code == 0, result.output
    names = {p["name"] for p in json.loads(result.output)}
    assert {"embedded", "rabbitmq"} <= names
    assert "embedded  [builtin]" in CliRunner().invoke(cli, ["plugins"]).output


def test_trace_plugins_logs_hook_calls(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("DEBUG", logger="wsnmom.plugins")
    PluginManager(environ={"WSNMOM_TRACE_PLUGINS": "1"}).load()
    assert "hook wsnmom_register_adapters" in caplog.text
