"""wsnmom: a WS-Notification gateway in front of RabbitMQ, Kafka and MQTT.

The import package is assembled from the repository's top-level folders
(``core/`` is ``wsnmom.core``, ``topic_mapping/`` is ``wsnmom.topic_mapping``, ...);
see ``pyproject.toml``.
"""

__version__ = "0.1.0"
