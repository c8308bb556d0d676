"""The MQTT adapter's public surface for code that reads MQTT as a gateway does without
being one (the Spark bridge's buffer).  Everything else in ``wsnmom.adapters.mqtt`` is the
adapter's inside and may change without notice.

* **Settings from the gateway's URL**: :func:`parse_settings` turns an adapter URL and
  options into :class:`MqttSettings` (ValueError, an ``AdapterOptionError``, when unusable).
* **Taps**, the consumers of a session besides the subscriptions' queues: a :class:`Tap`
  names topic patterns and a sink that takes :class:`Arrival` s (the MQTT topic name, the
  message as the gateway maps it, the DUP flag) before they are acknowledged.  An adapter
  option listed in :data:`TAP_PROVIDERS` adds taps to a gateway's own session through the
  :class:`TapProvider` it names.
* **The session for a buffer**: :class:`TapSession`, a persistent session whose only
  consumers are taps, with its client id and filters kept in a state directory.

Importing this module imports paho-mqtt (the ``mqtt`` extra).
"""

from __future__ import annotations

from .config import MqttSettings, parse_settings
from .standalone import TapSession
from .taps import TAP_PROVIDERS, Arrival, Sink, Tap, TapProvider

__all__ = [
    "TAP_PROVIDERS",
    "Arrival",
    "MqttSettings",
    "Sink",
    "Tap",
    "TapProvider",
    "TapSession",
    "parse_settings",
]
