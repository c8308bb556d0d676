"""Namespace URI <-> native root: where each topic namespace lives in a middleware's names.

The first levels of a native name (RabbitMQ: the exchange) say which namespace the rest of
the name belongs to; :mod:`.translate` writes and reads the rest.

* a configured namespace uses its configured root (one or more levels);
* any other namespace gets the derived one-level root ``"n"`` + the first 16 characters
  of the lower-case base32 of SHA-256(namespace URI as UTF-8), e.g. ``nq7mjdr2m5m3hwx2k``;
  it is registered on first use so that native names under it map back;
* a native name under no known root maps to the **fallback namespace**:
  ``urn:wsnmom:native`` with the empty root for MQTT/Kafka (the whole native name is the
  topic path), and ``urn:wsnmom:native:<percent-encoded exchange>`` for RabbitMQ (the
  routing key is the path).  Those namespaces translate back to the same native names.

A root claims a native name only if it is a *proper* prefix of the name's levels, and
configured roots must not be prefixes of one another, so the mapping stays bijective.
"""

from __future__ import annotations

import base64
import hashlib
import threading
from collections.abc import Mapping, Sequence
from typing import Final
from urllib.parse import quote, unquote

from .errors import NameNotRepresentable
from .syntax import WildcardSyntax

__all__ = [
    "FALLBACK_NAMESPACE",
    "NamespaceRoots",
    "Root",
    "derived_root",
    "fallback_namespace",
    "fallback_root",
]

#: namespace of natively published names under no known root
FALLBACK_NAMESPACE: Final = "urn:wsnmom:native"

Root = tuple[str, ...]


def derived_root(namespace: str) -> str:
    """The one-level root of a namespace that has none configured."""
    digest = hashlib.sha256(namespace.encode("utf-8")).digest()
    return "n" + base64.b32encode(digest).decode("ascii").lower()[:16]


def fallback_namespace(root: str) -> str:
    """Fallback namespace for the unknown root ``root`` ("" for no root at all)."""
    return FALLBACK_NAMESPACE if not root else FALLBACK_NAMESPACE + ":" + quote(root, safe="")


def fallback_root(namespace: str) -> str | None:
    """Inverse of :func:`fallback_namespace`, None when ``namespace`` is not a fallback one."""
    if namespace == FALLBACK_NAMESPACE:
        return ""
    prefix = FALLBACK_NAMESPACE + ":"
    if namespace.startswith(prefix):
        encoded = namespace[len(prefix) :]
        try:
            root = unquote(encoded, errors="strict")
        except UnicodeDecodeError:
            return None
        if root and quote(root, safe="") == encoded:
            return root
    return None


def _is_prefix(a: Root, b: Root) -> bool:
    return len(a) <= len(b) and b[: len(a)] == a


class NamespaceRoots:
    """Namespace URI <-> native root, from configuration plus derived roots.

    ``configured`` maps a namespace URI to its root: a sequence of levels, or a string that
    is one level (or, when ``separator`` is given, split on it: ``"org/wsn"`` -> two levels;
    use :meth:`for_syntax`).  Thread-safe; derived roots are registered on use.
    """

    def __init__(
        self,
        configured: Mapping[str, str | Sequence[str]] | None = None,
        *,
        separator: str | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._configured: dict[str, Root] = {}
        self._by_root: dict[Root, str] = {}
        self._derived: dict[str, Root] = {}
        for namespace, value in (configured or {}).items():
            if isinstance(value, str):
                root: Root = tuple(value.split(separator)) if separator else (value,)
            else:
                root = tuple(value)
            if not root or any(not level for level in root):
                raise ValueError(f"root of {namespace!r} has an empty level: {value!r}")
            if namespace == FALLBACK_NAMESPACE or namespace.startswith(FALLBACK_NAMESPACE + ":"):
                raise ValueError(f"{namespace!r} is reserved for natively published names")
            for other, ns in self._by_root.items():
                if _is_prefix(other, root) or _is_prefix(root, other):
                    raise ValueError(
                        f"roots of {ns!r} {other!r} and {namespace!r} {root!r} overlap"
                    )
            self._configured[namespace] = root
            self._by_root[root] = namespace

    @classmethod
    def for_syntax(
        cls, configured: Mapping[str, str | Sequence[str]], syntax: WildcardSyntax
    ) -> NamespaceRoots:
        """Roots whose string values are split on ``syntax``'s separator when the root is
        part of the native name (MQTT ``org/wsn``, Kafka ``wsn.events``); a RabbitMQ
        exchange name is kept whole."""
        return cls(configured, separator=syntax.separator if syntax.root_in_name else None)

    @property
    def configured(self) -> dict[str, Root]:
        """The configured namespace -> root mapping."""
        return dict(self._configured)

    def register(self, namespace: str) -> Root:
        """Make ``namespace``'s root known for reverse lookups and return it."""
        return self.root_for(namespace)

    def root_for(self, namespace: str) -> Root:
        """The root of ``namespace`` (configured, fallback or derived-and-registered)."""
        root = self._configured.get(namespace)
        if root is not None:
            return root
        fb = fallback_root(namespace)
        if fb is not None:
            return (fb,) if fb else ()
        with self._lock:
            root = self._derived.get(namespace)
            if root is None:
                root = (derived_root(namespace),)
                for other, ns in self._by_root.items():
                    if _is_prefix(other, root) or _is_prefix(root, other):
                        raise NameNotRepresentable(
                            f"derived root {root[0]!r} of {namespace!r} collides with {ns!r}"
                        )
                self._derived[namespace] = root
                self._by_root[root] = namespace
            return root

    def namespace_for_root(self, root: Root) -> str | None:
        """The namespace whose root is exactly ``root``, if known."""
        with self._lock:
            return self._by_root.get(root)

    def split(self, levels: Sequence[str]) -> tuple[str, Root, tuple[str, ...]]:
        """``(namespace, root, rest)`` for a root-in-name native name's levels: the known
        root that is a proper prefix, else the fallback namespace with the empty root."""
        levels = tuple(levels)
        with self._lock:
            for n in range(1, len(levels)):
                namespace = self._by_root.get(levels[:n])
                if namespace is not None:
                    return namespace, levels[:n], levels[n:]
        return FALLBACK_NAMESPACE, (), levels

    def claims(self, levels: Sequence[str]) -> bool:
        """Whether some known root is a proper prefix of ``levels``."""
        return self.split(levels)[0] != FALLBACK_NAMESPACE
