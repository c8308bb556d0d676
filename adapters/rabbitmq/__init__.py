"""RabbitMQ adapter (pika): topic namespaces on topic exchanges, one durable queue per
WS-N subscription and pull point.  Needs the ``rabbitmq`` extra.

Importing this package does not import pika, so the plugin module can register the
adapter lazily; importing :mod:`wsnmom.adapters.rabbitmq.adapter` without pika raises an
ImportError that names the extra to install.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .adapter import RabbitMQAdapter

__all__ = ["RabbitMQAdapter"]


def __getattr__(name: str) -> Any:
    if name == "RabbitMQAdapter":
        from .adapter import RabbitMQAdapter

        return RabbitMQAdapter
    raise AttributeError(name)
