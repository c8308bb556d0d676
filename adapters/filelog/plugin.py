"""Plugin module of the file-log reference adapter (entry point ``wsnmom.adapters:
filelog``).  Registers the class by dotted name: nothing is imported until a
``filelog://`` URL is resolved.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from wsnmom.core.hookspecs import hookimpl

if TYPE_CHECKING:
    from wsnmom.core.plugins import AdapterRegistry


@hookimpl
def wsnmom_register_adapters(registry: AdapterRegistry) -> None:
    """Register ``filelog://``."""
    registry.add("filelog", "wsnmom.adapters.filelog.adapter:FileLogAdapter", extra=None)
