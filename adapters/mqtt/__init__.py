"""MQTT adapter (paho-mqtt): WS-Topics trees on MQTT topics, durable subscriptions kept by
one persistent session per gateway instance.  Needs the ``mqtt`` extra.

Importing this package does not import paho-mqtt, so the plugin module can register the
adapter lazily; importing :mod:`wsnmom.adapters.mqtt.adapter` without it raises an
ImportError that names the extra to install.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .adapter import MqttAdapter

__all__ = ["MqttAdapter"]


def __getattr__(name: str) -> Any:
    if name == "MqttAdapter":
        from .adapter import MqttAdapter

        return MqttAdapter
    raise AttributeError(name)
