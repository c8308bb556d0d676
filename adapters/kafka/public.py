"""The Kafka adapter's public surface for code that reads what a gateway wrote without being
a gateway (the Spark bridge's ``wsn_kafka`` source).  Everything else in
``wsnmom.adapters.kafka`` is the adapter's inside and may change without notice.

* **Settings from the gateway's URL**: :func:`parse_settings` turns the adapter URL and
  options into :class:`KafkaSettings`; a reader uses its ``bootstrap``, ``client_config``,
  ``connect_timeout``, ``exact_watermarks`` and the librdkafka configurations ``admin()``
  and ``consumer(group)``.
* **The native name of a topic, and back**: :class:`KafkaMapping`, built from those
  settings, is the adapter's own mapping: which Kafka topics it follows (``follows``) and
  which may carry a selection's topics (``may_carry``), the Kafka topic of a WS topic, the
  WS topic of a record (``record_topic``, ``log_topic``, ``cached_log_topic``,
  ``is_shared``, ``shared_log``, ``shared_logs``, ``internal_topic``, ``prefix``,
  ``roots``, ``register``).
* **A raw reader of the log**: :func:`records` turns consumed confluent-kafka messages into
  :class:`LogRecord` s with the topic, headers, media type and timestamp the gateway would
  give them; :data:`CONTENT_TYPE_HEADERS` and :func:`sniff_content_type` are the adapter's
  rule for a record's media type, for readers that build columns themselves.

Importing this module does not import confluent-kafka (:func:`records` does, when called).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from wsnmom.adapters.logbase.public import LogRecord
from wsnmom.adapters.native import sniff_content_type

from .config import KafkaSettings, parse_settings
from .mapping import CONTENT_TYPE_HEADERS, KafkaMapping

if TYPE_CHECKING:
    from confluent_kafka import Message

__all__ = [
    "CONTENT_TYPE_HEADERS",
    "KafkaMapping",
    "KafkaSettings",
    "LogRecord",
    "parse_settings",
    "records",
    "sniff_content_type",
]


def records(messages: Iterable[Message], mapping: KafkaMapping) -> Iterator[LogRecord]:
    """The records of consumed messages (none of them an error), in their order, as the
    gateway's readers make them: the WS topic now, the rest on first use."""
    from .clients import record_from_message

    for message in messages:
        yield record_from_message(message, mapping)
