"""Plugin manager and adapter registry.

Third-party plugins are found through the ``wsnmom.adapters`` entry-point group.  The
built-in plugins (one per adapter wsnmom ships) are listed once, in :data:`BUILTIN_PLUGINS`,
and imported by name, as pytest does with its own plugins: they load whether or not the
installed metadata is current, and ``WSNMOM_DISABLE_PLUGIN_AUTOLOAD`` never turns one off.
They are listed, blocked and replaced like any other plugin.

Plugins contribute adapter classes to an :class:`AdapterRegistry` in the
``wsnmom_register_adapters`` hook, **by dotted name**.  Resolving a URL imports the class
only then, so importing wsnmom never imports pika, confluent_kafka or paho; a missing
client library surfaces as an ImportError naming the extra to install.

Environment toggles
    ``WSNMOM_DISABLE_PLUGIN_AUTOLOAD=1``
        load only the built-in plugins (and those named in ``WSNMOM_PLUGINS``).
    ``WSNMOM_PLUGINS=name,pkg.module``
        load only these third-party plugins: entry-point names, or module paths that are
        imported and registered even when they have no entry point.
    ``WSNMOM_BLOCKED_PLUGINS=name,...``
        never register these plugins (built-in ones too).
    ``WSNMOM_TRACE_PLUGINS=1``
        log every hook call (logger ``wsnmom.plugins``, DEBUG).

Core talks to plugins through the typed methods of :class:`PluginManager` and never
through ``pm.hook`` directly.  The registry itself (``AdapterRegistry``, the scheme lookup and
its "unknown scheme" error) is ``wsnmom.core.adapter_registry``; every name of it is
re-exported here.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pluggy
from wsnmom.core import hookspecs
from wsnmom.core.adapter_registry import (
    KNOWN_SCHEMES,
    PLANNED_SCHEMES,
    AdapterEntry,
    AdapterRegistry,
    UnknownAdapterScheme,
    scheme_of,
)
from wsnmom.core.hookspecs import PROJECT, hookimpl

if TYPE_CHECKING:
    import click
    from wsnmom.core.adapter import Adapter, OutboundMessage, PublishReceipt
    from wsnmom.core.model import NotificationMessage

__all__ = [
    "BUILTIN_PLUGINS",
    "ENTRY_POINT_GROUP",
    "KNOWN_SCHEMES",
    "PLANNED_SCHEMES",
    "AdapterEntry",
    "AdapterRegistry",
    "PluginInfo",
    "PluginManager",
    "UnknownAdapterScheme",
    "create_adapter",
    "get_plugin_manager",
    "hookimpl",
    "resolve",
    "scheme_of",
]

log = logging.getLogger("wsnmom.plugins")

#: entry-point group plugins declare themselves in
ENTRY_POINT_GROUP = "wsnmom.adapters"

#: the built-in plugins, the one list of them: plugin name -> plugin module.  A plugin
#: module only names its adapter class, so importing it imports no client library.
BUILTIN_PLUGINS: Mapping[str, str] = {
    "embedded": "wsnmom.adapters.embedded.plugin",
    "rabbitmq": "wsnmom.adapters.rabbitmq.plugin",
    "kafka": "wsnmom.adapters.kafka.plugin",
    "mqtt": "wsnmom.adapters.mqtt.plugin",
    "filelog": "wsnmom.adapters.filelog.plugin",
}

ENV_DISABLE_AUTOLOAD = "WSNMOM_DISABLE_PLUGIN_AUTOLOAD"
ENV_PLUGINS = "WSNMOM_PLUGINS"
ENV_BLOCKED = "WSNMOM_BLOCKED_PLUGINS"
ENV_TRACE = "WSNMOM_TRACE_PLUGINS"


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() not in {"", "0", "false", "no", "off"}


def _split(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


# --------------------------------------------------------------------------- manager


@dataclass(frozen=True, slots=True)
class PluginInfo:
    """What ``wsnmom plugins`` shows about one plugin."""

    name: str
    module: str | None
    builtin: bool
    distribution: str | None = None
    version: str | None = None
    hooks: tuple[str, ...] = ()
    schemes: tuple[str, ...] = ()
    #: why it could not be loaded (None when it was)
    error: str | None = None
    blocked: bool = False


@dataclass(slots=True)
class _Failure:
    name: str
    module: str | None
    error: str
    builtin: bool
    distribution: str | None = None
    version: str | None = None


class PluginManager:
    """Typed facade over ``pluggy.PluginManager("wsnmom")``.

    :param environ: environment to read the toggles from (``os.environ`` by default).
    :param autoload: override ``WSNMOM_DISABLE_PLUGIN_AUTOLOAD`` (None: read the env).
    """

    def __init__(
        self, *, environ: Mapping[str, str] | None = None, autoload: bool | None = None
    ) -> None:
        self.pm = pluggy.PluginManager(PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.adapters = AdapterRegistry()
        self._env = dict(os.environ if environ is None else environ)
        self._autoload = (
            not _truthy(self._env.get(ENV_DISABLE_AUTOLOAD)) if autoload is None else autoload
        )
        self._failures: dict[str, _Failure] = {}
        #: entry-point name -> (distribution, version)
        self._dists: dict[str, tuple[str | None, str | None]] = {}
        self._loaded = False
        self._lock = threading.Lock()
        self._undo_trace: Any = None
        #: names of the hooks at least one registered plugin implements (None: recompute);
        #: lets the hot path skip observer calls without asking pluggy every time
        self._implemented: frozenset[str] | None = None
        if _truthy(self._env.get(ENV_TRACE)):
            self.enable_tracing()

    # ------------------------------------------------------------------ loading

    @property
    def blocked(self) -> list[str]:
        """Plugin names blocked by ``WSNMOM_BLOCKED_PLUGINS``."""
        return _split(self._env.get(ENV_BLOCKED))

    def load(self) -> PluginManager:
        """Discover and register plugins, then call ``wsnmom_register_adapters``; idempotent."""
        with self._lock:
            if self._loaded:
                return self
            self._loaded = True
            for name in self.blocked:
                self.pm.set_blocked(name)
            wanted = _split(self._env.get(ENV_PLUGINS))
            own = _own_distribution()
            for name, module in BUILTIN_PLUGINS.items():
                self._dists[name] = own
                self._load_one(name, module, True)
            seen: set[str] = set(BUILTIN_PLUGINS)
            for ep in _entry_points():
                if ep.name in seen:  # a built-in's name, or listed twice
                    continue
                seen.add(ep.name)
                if wanted and ep.name not in wanted:
                    continue
                if not self._autoload and ep.name not in wanted:
                    continue
                dist = getattr(ep, "dist", None)
                self._dists[ep.name] = (
                    getattr(dist, "name", None),
                    getattr(dist, "version", None),
                )
                self._load_one(ep.name, ep.value, False, loader=ep.load)
            for item in wanted:
                if item not in seen:
                    self._load_one(item, item, False)
        self.pm.hook.wsnmom_register_adapters.call_historic(kwargs={"registry": self.adapters})
        return self

    def _load_one(self, name: str, module: str, builtin: bool, loader: Any | None = None) -> None:
        if self.pm.is_blocked(name) or self.pm.has_plugin(name):
            return
        try:
            plugin = loader() if loader is not None else importlib.import_module(module)
        except Exception as exc:  # a broken plugin must not take the gateway down
            dist, version = self._dists.get(name, (None, None))
            self._failures[name] = _Failure(
                name, module, f"{type(exc).__name__}: {exc}", builtin, dist, version
            )
            log.warning("plugin %s (%s) could not be loaded: %s", name, module, exc)
            return
        self._implemented = None
        try:
            self.pm.register(plugin, name=name)
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:  # e.g. a misspelled hookimpl
            if self.pm.has_plugin(name):
                self.pm.unregister(name=name)
            dist, version = self._dists.get(name, (None, None))
            self._failures[name] = _Failure(
                name, module, f"invalid plugin: {exc}", builtin, dist, version
            )
            log.warning("plugin %s (%s) is invalid: %s", name, module, exc)

    def register(self, plugin: object, name: str | None = None) -> str:
        """Register a plugin object or module (tests, embedding applications).

        ``wsnmom_register_adapters`` is historic, so the plugin's adapters are added even
        when the manager is already loaded.
        """
        self._implemented = None
        try:
            registered = self.pm.register(plugin, name=name)
            if registered is None:
                raise ValueError(f"plugin {name or plugin!r} is blocked")
            self.pm.check_pending()
        finally:
            self._implemented = None
        return registered

    def unregister(self, name: str) -> None:
        """Unregister a plugin by name (its adapter schemes stay registered)."""
        try:
            self.pm.unregister(name=name)
        finally:
            self._implemented = None

    def observes(self, hook: str) -> bool:
        """Whether some registered plugin implements ``hook`` (e.g.
        ``"wsnmom_notification_delivered"``).  Cheap (a set lookup): core asks it on the
        hot path before building an observer call's arguments.  Plugins must be
        (un)registered through this facade for it to stay current."""
        implemented = self._implemented
        if implemented is None:
            implemented = frozenset(
                name
                for name in dir(self.pm.hook)
                if name.startswith("wsnmom_") and getattr(self.pm.hook, name).get_hookimpls()
            )
            self._implemented = implemented
        return hook in implemented

    def enable_tracing(self) -> None:
        """Log every hook call and its result at DEBUG level."""

        def before(hook_name: str, impls: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
            log.debug("hook %s(%s) -> %d impl(s)", hook_name, ", ".join(kwargs), len(impls))

        def after(outcome: Any, hook_name: str, impls: Sequence[Any], kwargs: Any) -> None:
            log.debug("hook %s done: %r", hook_name, outcome.get_result())

        self._undo_trace = self.pm.add_hookcall_monitoring(before, after)

    # ------------------------------------------------------------------ introspection

    def plugins(self) -> list[PluginInfo]:
        """Registered, failed and blocked plugins."""
        out: list[PluginInfo] = []
        schemes_by_module: dict[str, list[str]] = {}
        for entry in self.adapters.entries():
            if entry.registered_by:
                schemes_by_module.setdefault(entry.registered_by, []).append(entry.scheme)
        for name, plugin in self.pm.list_name_plugin():
            if plugin is None:
                continue
            module = getattr(plugin, "__name__", type(plugin).__module__)
            dist, version = self._dists.get(name, (None, None))
            hooks = tuple(sorted(h.name for h in self.pm.get_hookcallers(plugin) or ()))
            out.append(
                PluginInfo(
                    name=name,
                    module=module,
                    builtin=name in BUILTIN_PLUGINS,
                    distribution=dist,
                    version=version,
                    hooks=hooks,
                    schemes=tuple(schemes_by_module.get(module, ())),
                )
            )
        for f in self._failures.values():
            out.append(
                PluginInfo(
                    name=f.name,
                    module=f.module,
                    builtin=f.builtin,
                    distribution=f.distribution,
                    version=f.version,
                    error=f.error,
                )
            )
        for name in self.blocked:
            out.append(
                PluginInfo(name=name, module=None, builtin=name in BUILTIN_PLUGINS, blocked=True)
            )
        return sorted(out, key=lambda p: (not p.builtin, p.name))

    def failures(self) -> dict[str, str]:
        """Plugins that could not be loaded: name -> reason."""
        return {n: f.error for n, f in self._failures.items()}

    # ------------------------------------------------------------------ adapters

    def resolve(self, url: str) -> type[Adapter]:
        """The adapter class serving ``url`` (see :meth:`AdapterRegistry.load`)."""
        self.load()
        try:
            return self.adapters.resolve(url)
        except UnknownAdapterScheme as exc:
            failed = self.failures()
            if failed:
                detail = "; ".join(f"{n}: {e}" for n, e in sorted(failed.items()))
                hint = f"{exc.hint}. " if exc.hint else ""
                raise UnknownAdapterScheme(
                    exc.scheme, exc.known, f"{hint}Plugins that failed to load: {detail}"
                ) from None
            raise

    def create_adapter(self, url: str, options: Mapping[str, Any] | None = None) -> Adapter:
        """Construct (not open) the adapter for ``url``."""
        return self.resolve(url)(url, options)

    # ------------------------------------------------------------------ typed hook calls

    def register_commands(self, cli: click.Group) -> None:
        """Let plugins add CLI subcommands."""
        self.load()
        self.pm.hook.wsnmom_register_commands(cli=cli)

    def configure_app(self, app: Any, service: Any) -> None:
        """Let plugins customise the Flask app."""
        self.load()
        self.pm.hook.wsnmom_configure_app(app=app, service=service)

    def startup(self, runtime: Any) -> None:
        """Broker started; exceptions propagate (they abort the start)."""
        self.load()
        self.pm.hook.wsnmom_startup(runtime=runtime)

    def shutdown(self, runtime: Any) -> None:
        """Broker stopping; exceptions are logged."""
        self._observe("wsnmom_shutdown", runtime=runtime)

    def adapter_opened(self, adapter: Adapter) -> None:
        """An adapter was opened; exceptions are logged."""
        self._observe("wsnmom_adapter_opened", adapter=adapter)

    def notification_published(
        self, message: NotificationMessage | OutboundMessage, receipt: PublishReceipt | None = None
    ) -> None:
        """Observer: a publish was confirmed."""
        self._observe("wsnmom_notification_published", message=message, receipt=receipt)

    def notification_delivered(self, message: NotificationMessage, subscription_id: str) -> None:
        """Observer: a notification reached its consumer."""
        self._observe(
            "wsnmom_notification_delivered", message=message, subscription_id=subscription_id
        )

    def delivery_failed(
        self, message: NotificationMessage, subscription_id: str, error: BaseException
    ) -> None:
        """Observer: a push attempt failed."""
        self._observe(
            "wsnmom_delivery_failed",
            message=message,
            subscription_id=subscription_id,
            error=error,
        )

    def _observe(self, hook: str, **kwargs: Any) -> None:
        if not self.observes(hook):
            return
        try:
            getattr(self.pm.hook, hook)(**kwargs)
        except Exception:
            log.exception("plugin hook %s raised", hook)


def _own_distribution() -> tuple[str | None, str | None]:
    """wsnmom's distribution name and version, for the built-in plugins' listing."""
    try:
        return "wsnmom", importlib.metadata.version("wsnmom")
    except importlib.metadata.PackageNotFoundError:  # a source tree without metadata
        return None, None


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    eps = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    unique: dict[str, importlib.metadata.EntryPoint] = {}
    for ep in eps:
        unique.setdefault(ep.name, ep)  # an editable + regular install may list one twice
    return list(unique.values())


# --------------------------------------------------------------------------- defaults

_default: PluginManager | None = None
_default_lock = threading.Lock()


def get_plugin_manager() -> PluginManager:
    """The process-wide plugin manager, loaded on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = PluginManager()
        pm = _default
    return pm.load()


def resolve(url: str) -> type[Adapter]:
    """The adapter class serving ``url``, from the process-wide plugin manager.

    :raises UnknownAdapterScheme: no plugin registered the scheme ("Did you mean ...?").
    :raises ImportError: the adapter's client library is missing (names the extra).
    """
    return get_plugin_manager().resolve(url)


def create_adapter(url: str, options: Mapping[str, Any] | None = None) -> Adapter:
    """Construct (not open) the adapter for ``url`` with ``options``."""
    return get_plugin_manager().create_adapter(url, options)
