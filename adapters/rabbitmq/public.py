"""The RabbitMQ adapter's public surface for code that reads what a gateway's exchanges
carry without being a gateway (the Spark bridge's stream tap ``wsn_rabbitmq``).
Everything else in ``wsnmom.adapters.rabbitmq`` is the adapter's inside and may change
without notice.

* **The native name of a topic**: :class:`RabbitMQNames` (built from the adapter options
  ``exchanges`` and ``all_exchange``, default :data:`DEFAULT_ALL_EXCHANGE`) gives the
  exchange and binding key of every pattern a subscription would bind (``bindings_for``,
  each a :class:`Binding`), and the WS topic of a delivered message (``topic_of``).
* **A delivered message's headers** as the adapter reads them: :func:`headers_of` (AMQP
  properties to text headers).
* :class:`LogRecord`: the record type a stream reader yields.

Importing this module does not import pika.
"""

from __future__ import annotations

from wsnmom.adapters.logbase.public import LogRecord

from .names import DEFAULT_ALL_EXCHANGE, Binding, RabbitMQNames, headers_of

__all__ = ["DEFAULT_ALL_EXCHANGE", "Binding", "LogRecord", "RabbitMQNames", "headers_of"]
