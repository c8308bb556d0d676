"""Kafka adapter (confluent-kafka): WS-Topics trees on Kafka topics, subscriptions as
cursors over the log.  Needs the ``kafka`` extra.

Importing this package does not import confluent-kafka, so the plugin module can register
the adapter lazily; importing :mod:`wsnmom.adapters.kafka.adapter` without it raises an
ImportError that names the extra to install.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .adapter import KafkaAdapter

__all__ = ["KafkaAdapter"]


def __getattr__(name: str) -> Any:
    if name == "KafkaAdapter":
        from .adapter import KafkaAdapter

        return KafkaAdapter
    raise AttributeError(name)
