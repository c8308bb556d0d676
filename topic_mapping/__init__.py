"""WS-Topics engine: topic model, dialect parsers, topic namespaces and sets, matching,
and translation of topic expressions to RabbitMQ, MQTT and Kafka patterns.

Pure functions and data: no Flask, no middleware client, no I/O.
"""
