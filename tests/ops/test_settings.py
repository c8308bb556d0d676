"""Settings from every source: documented variables work, unknown names are warnings with a
"did you mean", unusable values are errors naming the setting and where it came from, and
numeric settings are range-checked."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from wsnmom.core import plugins
from wsnmom.core.config import (
    OTHER_VARIABLES,
    RESERVED_PREFIXES,
    ConfigError,
    Settings,
    env_name,
    load_settings,
    secret_variables,
    setting_names,
)

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTED = [*sorted(ROOT.glob("docs/**/*.md")), ROOT / "README.md"]
_VARIABLE = re.compile(r"\bWSNMOM_[A-Z0-9_]*[A-Z0-9]\b(?:=(\S+?))?(?=[`\s|,)]|$)")


def _load(
    env: dict[str, str], file: Path | None = None, **overrides: Any
) -> tuple[Settings, list[str]]:
    warnings: list[str] = []
    settings = load_settings(
        file, environ={"HOME": "/nohome", **env}, overrides=overrides, warn=warnings.append
    )
    return settings, warnings


def _documented_variables() -> dict[str, set[str]]:
    """Every WSNMOM_* name the documentation mentions, with the values it shows."""
    found: dict[str, set[str]] = {}
    for doc in DOCUMENTED:
        for match in _VARIABLE.finditer(doc.read_text()):
            name, value = match.group(0).split("=", 1)[0], match.group(1)
            found.setdefault(name, set())
            if value:
                found[name].add(value.strip("`"))
    return found


def test_the_documentation_names_variables() -> None:
    names = _documented_variables()
    assert {"WSNMOM_CONFIG", "WSNMOM_PLUGINS", "WSNMOM_PORT"} <= names.keys()


@pytest.mark.parametrize("name", sorted(_documented_variables()))
def test_every_documented_variable_is_accepted(name: str, tmp_path: Path) -> None:
    """A variable the docs mention is a setting, a known non-setting variable, or a test or
    benchmark variable: none of them warns.  Each value the docs show for a setting loads,
    or (an example of an error) fails with a message naming the variable and value."""
    values = _documented_variables()[name]
    if name == "WSNMOM_CONFIG":
        (tmp_path / "empty.toml").write_text("")
        values = {str(tmp_path / "empty.toml")}
    if name in OTHER_VARIABLES or name.startswith(RESERVED_PREFIXES):
        _, warnings = _load({name: next(iter(values), "1")})
        assert warnings == []
        return
    settings_env = {env_name(n): n for n in setting_names()}
    prefixes = [env_name(n) + "__" for n in ("adapter_options", "log_levels")]
    assert name in settings_env or name.startswith(tuple(prefixes)), name
    for value in values:
        try:
            settings, warnings = _load({name: value})
        except ConfigError as exc:
            assert str(exc).startswith(f"{name}={value}: "), exc
            continue
        assert warnings == []
        shown = "***" if name in secret_variables() else value  # tokens are never shown
        assert f"{name}={shown}" in settings.origins.values()


def test_plugin_variables_are_the_plugin_managers() -> None:
    for variable in (
        plugins.ENV_PLUGINS,
        plugins.ENV_BLOCKED,
        plugins.ENV_DISABLE_AUTOLOAD,
        plugins.ENV_TRACE,
    ):
        assert variable in OTHER_VARIABLES


def test_plugin_and_test_variables_do_not_disturb_the_settings() -> None:
    env = {
        "WSNMOM_BLOCKED_PLUGINS": "nats",
        "WSNMOM_PLUGINS": "embedded",
        "WSNMOM_DISABLE_PLUGIN_AUTOLOAD": "1",
        "WSNMOM_TRACE_PLUGINS": "1",
        "WSNMOM_TEST_AMQP_URL": "amqp://guest:guest@127.0.0.1:1/",
        "WSNMOM_TEST_E2E_ADAPTERS": "embedded",
        "WSNMOM_BENCH_AMQP_URL": "amqp://127.0.0.1:1/",
    }
    settings, warnings = _load(env)
    assert warnings == []
    assert settings == Settings(data_dir="/nohome/.local/share/wsnmom")


@pytest.mark.parametrize(
    ("variable", "suggestion"),
    [
        ("WSNMOM_THREAD", "WSNMOM_THREADS"),
        ("WSNMOM_PLUGIN", "WSNMOM_PLUGINS"),
        ("WSNMOM_RETRY__MAX_ATEMPTS", "WSNMOM_RETRY__MAX_ATTEMPTS"),
        ("WSNMOM_LOG_LEVLE", "WSNMOM_LOG_LEVEL"),
        ("WSNMOM_DATADIR", "WSNMOM_DATA_DIR"),
    ],
)
def test_unknown_variable_is_a_warning_with_a_suggestion(variable: str, suggestion: str) -> None:
    settings, warnings = _load({variable: "4"})
    assert warnings == [f"{variable}: not a wsnmom setting, ignored (did you mean {suggestion}?)"]
    assert settings.threads == 16 and settings.retry.max_attempts == 8


def test_unknown_variable_without_a_close_name() -> None:
    _, warnings = _load({"WSNMOM_SOMETHING_ELSE": "x"})
    assert warnings == ["WSNMOM_SOMETHING_ELSE: not a wsnmom setting, ignored"]


def test_toml_typos_name_the_file_and_key(tmp_path: Path) -> None:
    cfg = tmp_path / "gw.toml"
    cfg.write_text("thread = 4\nport = 9000\n[retry]\nmax_atempts = 2\n[retyr]\nx = 1\n")
    settings, warnings = _load({}, cfg)
    assert warnings == [
        f"{cfg}: unknown setting 'thread', ignored (did you mean 'threads'?)",
        f"{cfg}: unknown setting 'retry.max_atempts', ignored (did you mean 'retry.max_attempts'?)",
        f"{cfg}: unknown setting 'retyr', ignored (did you mean 'retry'?)",
    ]
    assert settings.port == 9000 and settings.origin("port") == str(cfg)


def test_warnings_go_to_the_config_logger_by_default(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="wsnmom.config"):
        load_settings(None, environ={"WSNMOM_THREAD": "3"})
    assert [r.getMessage() for r in caplog.records if r.name == "wsnmom.config"] == [
        "WSNMOM_THREAD: not a wsnmom setting, ignored (did you mean WSNMOM_THREADS?)"
    ]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"WSNMOM_RETRY__MAX_DELAY": "5min"},
            "WSNMOM_RETRY__MAX_DELAY=5min: retry.max_delay: not a duration: '5min'",
        ),
        ({"WSNMOM_PORT": "eighty"}, "WSNMOM_PORT=eighty: port: not an integer: 'eighty'"),
        (
            {"WSNMOM_RETRY__GIVE_UP": "maybe"},
            "WSNMOM_RETRY__GIVE_UP=maybe: retry.give_up: 'maybe' is not one of: keep, end",
        ),
        (
            {"WSNMOM_LOG_LEVEL": "verbose"},
            "WSNMOM_LOG_LEVEL=verbose: log_level: not a log level: 'verbose'",
        ),
        (
            {"WSNMOM_LOG_LEVELS__PIKA": "loud"},
            "WSNMOM_LOG_LEVELS__PIKA=loud: log_levels: not a log level for logger 'pika'",
        ),
        (
            {"WSNMOM_RETRY": "3"},
            "WSNMOM_RETRY=3: retry: is a section; set its members (e.g. WSNMOM_RETRY__",
        ),
        (
            {"WSNMOM_OUTBOUND__ALLOW_LOOPBACK": "perhaps"},
            "WSNMOM_OUTBOUND__ALLOW_LOOPBACK=perhaps: outbound.allow_loopback: not a boolean",
        ),
        (
            {"WSNMOM_PUBLIC_URL": "ftp://gw.example"},
            "WSNMOM_PUBLIC_URL=ftp://gw.example: public_url: not an http:// or https:// URL",
        ),
        (
            {"WSNMOM_TRUSTED_PROXIES": "10.0.0.0/8,proxy.example"},
            "WSNMOM_TRUSTED_PROXIES=10.0.0.0/8,proxy.example: trusted_proxies: not an IP address",
        ),
        (
            {"WSNMOM_LOG_FORMAT": "xml"},
            "WSNMOM_LOG_FORMAT=xml: log_format: 'xml' is not one of: text, json",
        ),
    ],
)
def test_environment_errors_name_variable_setting_and_problem(
    env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        _load(env)
    assert str(info.value).startswith(message), str(info.value)


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    cfg = tmp_path / "gw.toml"
    cfg.write_text('[retry]\nmax_delay = "5min"\n')
    with pytest.raises(ConfigError, match=re.escape(f"{cfg}: retry.max_delay: not a duration")):
        _load({}, cfg)


def test_command_line_errors_name_the_option() -> None:
    with pytest.raises(
        ConfigError, match=r"^--port=70000: port: 70000 is out of range \(1\.\.65535\)"
    ):
        load_settings(None, environ={}, overrides={"port": 70000}, options={"port": "--port"})


def test_cross_setting_errors_name_both_origins() -> None:
    with pytest.raises(ConfigError) as info:
        _load({"WSNMOM_TERMINATION__MAXIMUM": "60"})
    assert "termination.maximum" in str(info.value)
    assert "from WSNMOM_TERMINATION__MAXIMUM=60" in str(info.value)
    assert "termination.default (1:00:00, from default)" in str(info.value)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("port", 0),
        ("port", 65536),
        ("port", 70000),
        ("port", -1),
        ("threads", 0),
        ("max_request_bytes", 0),
        ("publish_timeout", 0),
        ("publish_timeout", "nan"),
        ("retry__max_attempts", 0),
        ("retry__multiplier", 0.5),
        ("retry__timeout", 0),
        ("retry__initial_delay", -1),
        ("retry__max_delay", "inf"),
        ("limits__max_messages", 0),
        ("limits__max_bytes", -5),
        ("limits__max_age", "PT0S"),
        ("limits__get_messages_cap", 0),
        ("delivery__workers", 0),
        ("delivery__batch_size", 0),
        ("delivery__prefetch", 0),
        ("termination__default", 0),
        ("termination__maximum", "-PT1S"),
        ("termination__sweep_interval", 0),
        ("termination__pull_point_default", "PT0S"),
    ],
)
def test_numbers_out_of_range_are_refused(name: str, value: object) -> None:
    with pytest.raises(ConfigError, match=re.escape(name.replace("__", "."))):
        load_settings(None, environ={}, overrides={name: value})


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("port", 1, 1),
        ("port", "65535", 65535),
        ("limits__max_messages", "none", None),
        ("termination__maximum", "unbounded", None),
        ("retry__initial_delay", "0", 0),
        ("log_level", "debug", "DEBUG"),
        ("log_format", "JSON", "json"),
    ],
)
def test_bounds_and_normalisation(name: str, value: object, expected: object) -> None:
    settings = load_settings(None, environ={}, overrides={name: value})
    section, _, attr = name.rpartition("__")
    holder = getattr(settings, section) if section else settings
    result = getattr(holder, attr)
    if hasattr(result, "total_seconds"):
        result = result.total_seconds()
    assert result == expected


def test_tables_merge_across_sources(tmp_path: Path) -> None:
    cfg = tmp_path / "gw.toml"
    cfg.write_text('[log_levels]\npika = "INFO"\n"wsnmom.soap" = "debug"\n')
    settings, _ = _load({"WSNMOM_LOG_LEVELS__URLLIB3": "error"}, cfg)
    assert settings.log_levels == {"pika": "INFO", "wsnmom.soap": "DEBUG", "urllib3": "ERROR"}
