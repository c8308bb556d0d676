"""Gateway settings: dataclasses loaded from a TOML file, ``WSNMOM_`` environment variables
and command-line overrides.

Precedence (highest first): CLI overrides > environment > TOML file > defaults.

TOML layout mirrors the dataclasses; top-level scalars plus one table per section::

    adapter_url = "amqp://guest:guest@localhost/"
    data_dir = "/var/lib/wsnmom"
    port = 8080

    [termination]
    default = "PT1H"          # xsd:duration or a number of seconds
    maximum = "P30D"
    allow_infinite = false

    [retry]
    max_attempts = 8
    give_up = "end"           # "keep" | "end"

Environment variables use ``__`` for nesting: ``WSNMOM_PORT=9090``,
``WSNMOM_RETRY__MAX_ATTEMPTS=3``, ``WSNMOM_OUTBOUND__DENY=10.0.0.0/8,*.internal``
(lists are comma separated; booleans accept 1/0, true/false, yes/no, on/off).
Durations accept ISO 8601 / xsd:duration (``PT30S``) or a number of seconds.

An unknown key or ``WSNMOM_*`` variable is reported as a warning (with a "did you mean"),
never an error: :data:`OTHER_VARIABLES` and :data:`RESERVED_PREFIXES` name the variables
that are not settings.  An unusable value is a :class:`ConfigError` naming the setting
and where the value came from (``WSNMOM_RETRY__MAX_DELAY=5min: retry.max_delay: ...``).

Where data lives (:func:`default_data_dir`): ``data_dir`` (default
``$XDG_DATA_HOME/wsnmom`` or ``~/.local/share/wsnmom``) holds the store
(``store.db``) and the embedded middleware, unless ``store_url`` / ``adapter_url`` say
otherwise; an explicit ``embedded://PATH`` without a ``data_dir`` makes PATH the data
directory, so one directory holds everything.

Code layout: this module reads the sources into the settings (names, values, warnings,
validation) and is the one to import from; the dataclasses are in
:mod:`wsnmom.core.config_model` (the root and some sections),
:mod:`wsnmom.core.config_delivery` and :mod:`wsnmom.core.config_protection`, the
``[[upstream]]`` entries in
:mod:`wsnmom.core.config_upstreams`, where data lives in :mod:`wsnmom.core.config_locations`,
converting and checking one value in :mod:`wsnmom.core.config_values`.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
import tomllib
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from wsnmom.core.config_delivery import (
    DeadLetterSettings,
    DeliverySettings,
    FilterSettings,
    LimitSettings,
    OutboundSettings,
    RetrySettings,
    TerminationSettings,
)
from wsnmom.core.config_locations import (
    EMBEDDED_PREFIX,
    _derive_locations,
    default_data_dir,
    embedded_path,
)
from wsnmom.core.config_model import (
    ClusterSettings,
    MiddlewareSettings,
    Settings,
    StorageSettings,
    TracingSettings,
)
from wsnmom.core.config_protection import (
    AdminSettings,
    AuthSettings,
    ConnectionSettings,
    LoopSettings,
    QuotaSettings,
    TlsSettings,
)
from wsnmom.core.config_upstreams import (
    UPSTREAM_NAME,
    UpstreamSettings,
    check_upstreams,
    upstream_from_json,
    upstream_to_json,
)
from wsnmom.core.config_values import ConfigError, InvalidValue, convert, parse_duration

__all__ = [
    "EMBEDDED_PREFIX",
    "ENV_PREFIX",
    "OTHER_VARIABLES",
    "RESERVED_PREFIXES",
    "UPSTREAM_NAME",
    "AdminSettings",
    "AuthSettings",
    "ClusterSettings",
    "ConfigError",
    "ConfigFileError",
    "ConnectionSettings",
    "DeadLetterSettings",
    "DeliverySettings",
    "FilterSettings",
    "LimitSettings",
    "LoopSettings",
    "MiddlewareSettings",
    "OutboundSettings",
    "QuotaSettings",
    "RetrySettings",
    "Settings",
    "StorageSettings",
    "TerminationSettings",
    "TlsSettings",
    "TracingSettings",
    "UpstreamSettings",
    "check_upstreams",
    "default_data_dir",
    "embedded_path",
    "env_name",
    "load_settings",
    "parse_duration",
    "secret_variables",
    "setting_names",
    "upstream_from_json",
    "upstream_to_json",
    "validate",
]

ENV_PREFIX = "WSNMOM_"

#: ``WSNMOM_*`` variables that are read but are not settings, with what they are for
#: (docs/configuration.md lists them; core.plugins reads the plugin ones)
OTHER_VARIABLES: Mapping[str, str] = {
    "WSNMOM_CONFIG": "the TOML configuration file to read",
    "WSNMOM_PLUGINS": "load only these third-party plugins (names or module paths)",
    "WSNMOM_BLOCKED_PLUGINS": "never register these plugins",
    "WSNMOM_DISABLE_PLUGIN_AUTOLOAD": "load only the built-in plugins (and WSNMOM_PLUGINS)",
    "WSNMOM_TRACE_PLUGINS": "log every plugin hook call at DEBUG level",
    "WSNMOM_BROKER": "the broker endpoint of the shell client's commands (not the gateway's)",
    "WSNMOM_UPSTREAM_PASSWORD": "the producer's password of ``wsnmom upstream add``",
    "WSNMOM_UPSTREAM_TOKEN": "the producer's bearer token of ``wsnmom upstream add``",
}
#: prefixes of variables read by the test suite and the benchmarks, never by the gateway
RESERVED_PREFIXES = ("WSNMOM_TEST_", "WSNMOM_BENCH_")

log = logging.getLogger("wsnmom.config")


# --------------------------------------------------------------------------------------------
# names
# --------------------------------------------------------------------------------------------


def _fields(cls: type) -> dict[str, dataclasses.Field[Any]]:
    return {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal", False)}


def _is_section(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def setting_names(cls: type = Settings, prefix: str = "") -> list[str]:
    """Every dotted setting name (``port``, ``retry.max_delay``, ...)."""
    hints = typing.get_type_hints(cls)
    names: list[str] = []
    for name in _fields(cls):
        if _is_section(hints[name]):
            names.extend(setting_names(hints[name], f"{prefix}{name}."))
        else:
            names.append(prefix + name)
    return names


def env_name(dotted: str) -> str:
    """The environment variable of a dotted setting name (``retry.max_delay`` ->
    ``WSNMOM_RETRY__MAX_DELAY``)."""
    return ENV_PREFIX + dotted.replace(".", "__").upper()


def _suggest(word: str, candidates: list[str], *, quote: bool = False, strip: str = "") -> str:
    """ " (did you mean X?)" for the candidate closest to ``word``, or ""; a common
    ``strip`` prefix is left out of the comparison (it would make everything similar)."""
    by_name = {c.removeprefix(strip): c for c in candidates}
    close = difflib.get_close_matches(word.removeprefix(strip), list(by_name), n=1, cutoff=0.75)
    if not close:
        return ""
    best = by_name[close[0]]
    return f" (did you mean {best!r}?)" if quote else f" (did you mean {best}?)"


# --------------------------------------------------------------------------------------------
# applying values
# --------------------------------------------------------------------------------------------

Warn = Callable[[str], None]


class _Loader:
    """Applies values from the sources to one :class:`Settings`, recording origins."""

    def __init__(self, settings: Settings, warn: Warn) -> None:
        self.settings = settings
        self.warn = warn
        self.explicit: set[str] = set()

    def set(self, path: list[str], value: object, origin: str) -> None:
        """Set the setting at ``path`` (lower-case parts) to ``value``.  Unknown names are
        warnings; unusable values are :class:`ConfigError`."""
        obj: Any = self.settings
        for i, part in enumerate(path):
            dotted = ".".join(path[: i + 1])
            known = _fields(type(obj))
            if part not in known:
                self._unknown(origin, path, type(obj), i)
                return
            tp = typing.get_type_hints(type(obj))[part]
            rest = path[i + 1 :]
            if _is_section(tp):
                if not rest:
                    if not isinstance(value, Mapping):
                        raise ConfigError(
                            f"{origin}: {dotted}: is a section; set its members "
                            f"(e.g. {env_name(dotted + '.' + next(iter(_fields(tp))))})"
                        )
                    for key, item in value.items():
                        self.set([*path, _key(key)], item, origin)
                    return
                obj = getattr(obj, part)
                continue
            if rest and typing.get_origin(tp) is dict:  # one key of a table setting
                value, rest = {"__".join(rest): value}, []
            if rest:
                self._unknown(origin, path, type(obj), i + 1)
                return
            self._assign(obj, part, tp, known[part], value, origin, dotted)
            return

    def _assign(
        self,
        obj: Any,
        attr: str,
        tp: Any,
        spec: dataclasses.Field[Any],
        value: object,
        origin: str,
        dotted: str,
    ) -> None:
        if spec.metadata.get("secret") and "=" in origin:
            origin = origin.split("=", 1)[0] + "=***"  # never echo a secret
        try:
            converted = convert(value, tp, spec.metadata)
        except InvalidValue as exc:
            raise ConfigError(f"{origin}: {dotted}: {exc}") from None
        if isinstance(converted, dict):  # tables merge across sources
            converted = {**getattr(obj, attr), **converted}
        setattr(obj, attr, converted)
        self.settings.origins[dotted] = origin
        self.explicit.add(dotted)

    def _unknown(self, origin: str, path: list[str], cls: type, depth: int) -> None:
        dotted = ".".join(path)
        if origin.startswith(ENV_PREFIX):
            variable = origin.split("=", 1)[0]
            names = [env_name(n) for n in setting_names()] + list(OTHER_VARIABLES)
            hint = _suggest(variable, names, strip=ENV_PREFIX)
            self.warn(f"{variable}: not a wsnmom setting, ignored{hint}")
            return
        prefix = ".".join(path[:depth])
        prefix = prefix + "." if prefix else ""
        names = setting_names(cls, prefix) + [prefix + name for name in _fields(cls)]
        self.warn(
            f"{origin}: unknown setting {dotted!r}, ignored{_suggest(dotted, names, quote=True)}"
        )


def _key(key: object) -> str:
    return str(key).replace("-", "_").lower()


def _file_values(path: str | Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise ConfigFileError(
            f"cannot read configuration file {path}: {exc.strerror or exc}"
        ) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigFileError(f"configuration file {path} is not valid TOML: {exc}") from exc


class ConfigFileError(ConfigError):
    """The configuration file cannot be read or parsed."""


def _env_entries(env: Mapping[str, str], warn: Warn) -> list[tuple[list[str], str, str]]:
    """(path, value, origin) of every ``WSNMOM_*`` variable that should be a setting."""
    entries = []
    for variable in sorted(env):
        if not variable.startswith(ENV_PREFIX) or variable in OTHER_VARIABLES:
            continue
        if variable.startswith(RESERVED_PREFIXES):
            continue
        name = variable[len(ENV_PREFIX) :]
        path = [p for p in name.lower().split("__")]
        if not all(path):
            warn(f"{variable}: not a wsnmom setting (empty name part), ignored")
            continue
        shown = "***" if variable in secret_variables() else env[variable]
        entries.append((path, env[variable], f"{variable}={shown}"))
    return entries


def secret_variables(cls: type = Settings, prefix: str = "") -> frozenset[str]:
    """The environment variables of settings whose values are never shown (tokens)."""
    hints = typing.get_type_hints(cls)
    found: set[str] = set()
    for name, spec in _fields(cls).items():
        if _is_section(hints[name]):
            found |= secret_variables(hints[name], f"{prefix}{name}.")
        elif spec.metadata.get("secret"):
            found.add(env_name(prefix + name))
    return frozenset(found)


def load_settings(
    config_file: str | Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    options: Mapping[str, str] | None = None,
    warn: Warn | None = None,
) -> Settings:
    """Build settings: defaults < TOML file < environment < ``overrides`` (CLI).

    ``config_file`` defaults to ``$WSNMOM_CONFIG`` when set.  ``overrides`` keys are
    setting names, nested mappings or ``section__name`` flat keys; None values are
    ignored.  ``options`` names the command-line option of an override key for messages
    (default ``--key-with-dashes``).  ``warn`` receives each warning (unknown settings);
    by default they are logged to ``wsnmom.config``.

    :raises ConfigFileError: the file cannot be read or parsed.
    :raises ConfigError: a value cannot be used (the message names it and its source).
    """
    env = os.environ if environ is None else environ
    loader = _Loader(Settings(), warn or log.warning)
    path = config_file or env.get(ENV_PREFIX + "CONFIG")
    if path:
        for key, value in _file_values(path).items():
            loader.set([_key(key)], value, str(path))
    for entry_path, value, origin in _env_entries(env, loader.warn):
        loader.set(entry_path, value, origin)
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        option = (options or {}).get(key) or "--" + key.replace("_", "-")
        loader.set(key.lower().split("__"), value, f"{option}={value}")
    settings = loader.settings
    _derive_locations(settings, frozenset(loader.explicit), env)
    validate(settings)
    return settings


def validate(settings: Settings) -> None:
    """Reject combinations of settings that cannot work (single values are checked as
    they are read)."""
    t = settings.termination
    if t.maximum is not None and t.maximum < t.default:
        raise ConfigError(
            f"termination.maximum ({t.maximum}, from {settings.origin('termination.maximum')})"
            f" must not be shorter than termination.default ({t.default}, from "
            f"{settings.origin('termination.default')})"
        )
    check_upstreams(settings.upstream, settings.origin("upstream"))
    if not settings.host.strip():
        raise ConfigError(f"{settings.origin('host')}: host: must not be empty")
