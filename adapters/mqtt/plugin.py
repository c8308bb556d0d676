"""Registers the MQTT adapter for the ``mqtt`` and ``mqtts`` URL schemes.

Loaded through the ``wsnmom.adapters`` entry point.  The adapter class is named by its
import path so that paho-mqtt is imported only when an MQTT URL is actually used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from wsnmom.core.hookspecs import hookimpl

if TYPE_CHECKING:
    from wsnmom.core.plugins import AdapterRegistry

#: the adapter class, imported only when a URL with one of these schemes is resolved
ADAPTER = "wsnmom.adapters.mqtt.adapter:MqttAdapter"
SCHEMES = ("mqtt", "mqtts")


@hookimpl
def wsnmom_register_adapters(registry: AdapterRegistry) -> None:
    """Register the MQTT adapter for its URL schemes."""
    for scheme in SCHEMES:
        registry.add(scheme, ADAPTER, extra="mqtt")
