"""The adapter registry: URL scheme -> adapter class, imported only when a URL is resolved.

Plugins add their adapter classes to an :class:`AdapterRegistry` by dotted name in the
``wsnmom_register_adapters`` hook (``wsnmom.core.plugins`` runs the hooks); resolving a URL
imports the class then, so importing wsnmom never imports a client library, and a missing
one surfaces as an ImportError naming the extra to install.  An unknown scheme raises
:class:`UnknownAdapterScheme` ("Did you mean ...?", and how to install a built-in
adapter whose plugin is blocked).  ``wsnmom.core.plugins`` re-exports every name.
"""

from __future__ import annotations

import difflib
import importlib
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from wsnmom.core.adapter import Adapter

#: schemes of the built-in adapters, with the extra that installs their client library;
#: only used to explain an "unknown scheme" when their plugin is blocked
#: (tests/core/test_plugins.py checks it against what the built-in plugins register)
KNOWN_SCHEMES: Mapping[str, str] = {
    "amqp": "rabbitmq",
    "amqps": "rabbitmq",
    "rabbitmq": "rabbitmq",
    "kafka": "kafka",
    "mqtt": "mqtt",
    "mqtts": "mqtt",
}
#: schemes of adapters that are being built but are not part of this version yet, with
#: the middleware's name: "unknown scheme" says so instead of suggesting an extra
PLANNED_SCHEMES: Mapping[str, str] = {}


class UnknownAdapterScheme(LookupError):
    """No adapter is registered for a URL scheme."""

    def __init__(self, scheme: str, known: Sequence[str], hint: str = "") -> None:
        self.scheme = scheme
        self.known = tuple(known)
        self.hint = hint
        msg = f"no adapter for URL scheme {scheme!r}"
        close = difflib.get_close_matches(scheme, self.known, n=1)
        if close:
            msg += f". Did you mean {close[0]!r}?"
        msg += f" (known: {', '.join(sorted(self.known)) or 'none'})"
        if hint:
            msg += f". {hint}"
        super().__init__(msg)

    def __str__(self) -> str:
        return str(self.args[0])


def _import_target(target: str) -> Any:
    module_name, _, attr = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split(".") if attr else ():
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True, slots=True)
class AdapterEntry:
    """One registered scheme."""

    #: URL scheme, lower case
    scheme: str
    #: ``"package.module:ClassName"`` (or the class itself, for test plugins)
    target: str | type[Adapter]
    #: pip extra that installs the client library, None when nothing extra is needed
    extra: str | None = None
    #: module that registered it (the plugin), for ``wsnmom adapters``
    registered_by: str | None = None

    @property
    def target_name(self) -> str:
        """The dotted name of the class."""
        if isinstance(self.target, str):
            return self.target
        return f"{self.target.__module__}:{self.target.__qualname__}"


class AdapterRegistry:
    """URL scheme -> adapter class, imported lazily (kombu's transport alias table)."""

    def __init__(self) -> None:
        self._entries: dict[str, AdapterEntry] = {}
        self._cache: dict[str, type[Adapter]] = {}
        self._lock = threading.Lock()

    def add(
        self,
        scheme: str,
        target: str | type[Adapter],
        *,
        extra: str | None = None,
        replace: bool = False,
    ) -> None:
        """Register ``target`` (``"module:Class"``) for ``scheme``.

        :param replace: allow overriding a scheme another plugin registered; without it a
            duplicate raises ValueError.
        """
        key = scheme.lower()
        if isinstance(target, str) and ":" not in target:
            raise ValueError(f"adapter target must be 'module:Class', not {target!r}")
        caller = sys._getframe(1).f_globals.get("__name__")
        with self._lock:
            old = self._entries.get(key)
            if old is not None and not replace and old.target_name != _name_of(target):
                raise ValueError(
                    f"scheme {key!r} is already registered to {old.target_name} "
                    f"(by {old.registered_by}); pass replace=True to override"
                )
            self._entries[key] = AdapterEntry(key, target, extra, caller)
            self._cache.pop(key, None)

    def remove(self, scheme: str) -> None:
        """Forget ``scheme`` (no error when absent)."""
        with self._lock:
            self._entries.pop(scheme.lower(), None)
            self._cache.pop(scheme.lower(), None)

    def get(self, scheme: str) -> AdapterEntry | None:
        """The entry of ``scheme``, if registered."""
        return self._entries.get(scheme.lower())

    def schemes(self) -> list[str]:
        """Registered schemes, sorted."""
        return sorted(self._entries)

    def entries(self) -> list[AdapterEntry]:
        """Registered entries, sorted by scheme."""
        return [self._entries[s] for s in self.schemes()]

    def __contains__(self, scheme: object) -> bool:
        return isinstance(scheme, str) and scheme.lower() in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def load(self, scheme: str) -> type[Adapter]:
        """Import and return the class of ``scheme``.

        :raises UnknownAdapterScheme: nothing is registered for ``scheme``.
        :raises ImportError: the class (or its client library) cannot be imported; the
            message names the extra to install.
        """
        key = scheme.lower()
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        entry = self._entries.get(key)
        if entry is None:
            hint = ""
            if key in KNOWN_SCHEMES:
                extra = KNOWN_SCHEMES[key]
                hint = f'Its adapter is installed with: pip install "wsnmom[{extra}]"'
            elif key in PLANNED_SCHEMES:
                hint = (
                    f"The {PLANNED_SCHEMES[key]} adapter is in progress and not part of this "
                    "version of wsnmom yet"
                )
            raise UnknownAdapterScheme(key, self.schemes(), hint)
        if isinstance(entry.target, str):
            try:
                cls = _import_target(entry.target)
            except ImportError as exc:
                if entry.extra:
                    raise ImportError(
                        f"the {key}:// adapter ({entry.target}) cannot be imported: {exc}. "
                        f'Install it with: pip install "wsnmom[{entry.extra}]"'
                    ) from exc
                raise
            except AttributeError as exc:
                raise ImportError(f"{entry.target} does not exist: {exc}") from exc
        else:
            cls = entry.target
        from wsnmom.core.adapter import Adapter

        if not (isinstance(cls, type) and issubclass(cls, Adapter)):
            raise TypeError(f"{entry.target_name} is not a wsnmom.core.adapter.Adapter")
        self._cache[key] = cls
        return cls

    def resolve(self, url: str) -> type[Adapter]:
        """The adapter class for ``url``'s scheme (see :meth:`load`)."""
        return self.load(scheme_of(url))


def _name_of(target: str | type[Adapter]) -> str:
    if isinstance(target, str):
        return target
    return f"{target.__module__}:{target.__qualname__}"


def scheme_of(url: str) -> str:
    """The lower-case scheme of an adapter URL (ValueError when there is none)."""
    scheme = urlsplit(url).scheme if "://" in url else ""
    if not scheme:
        raise ValueError(f"adapter URL needs a scheme (e.g. embedded://data): {url!r}")
    return scheme.lower()
