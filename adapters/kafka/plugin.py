"""Registers the Kafka adapter for the ``kafka`` URL scheme.

Loaded through the ``wsnmom.adapters`` entry point.  The adapter class is named by its
import path so that confluent-kafka is imported only when a Kafka URL is actually used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from wsnmom.core.hookspecs import hookimpl

if TYPE_CHECKING:
    from wsnmom.core.plugins import AdapterRegistry

#: the adapter class, imported only when a URL with one of these schemes is resolved
ADAPTER = "wsnmom.adapters.kafka.adapter:KafkaAdapter"
SCHEMES = ("kafka",)


@hookimpl
def wsnmom_register_adapters(registry: AdapterRegistry) -> None:
    """Register the Kafka adapter for its URL scheme."""
    for scheme in SCHEMES:
        registry.add(scheme, ADAPTER, extra="kafka")
