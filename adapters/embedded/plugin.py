"""Plugin module of the embedded adapter (entry point ``wsnmom.adapters: embedded``).

Registers the class by dotted name: nothing is imported until an ``embedded://`` URL is
resolved.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from wsnmom.core.hookspecs import hookimpl

if TYPE_CHECKING:
    from wsnmom.core.plugins import AdapterRegistry


@hookimpl
def wsnmom_register_adapters(registry: AdapterRegistry) -> None:
    """Register ``embedded://``."""
    registry.add("embedded", "wsnmom.adapters.embedded.adapter:EmbeddedAdapter", extra=None)
