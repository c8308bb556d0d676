"""RabbitMQ adapter (pika): topic namespaces on topic exchanges, one durable queue per
WS-N subscription and pull point.  Needs the ``rabbitmq`` extra."""

try:
    import pika  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError('the RabbitMQ adapter needs pika: pip install "wsnmom[rabbitmq]"') from exc
