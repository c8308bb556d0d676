"""wsnmom's Spark bridge: read the notifications flowing through the middleware behind a
gateway into Spark, in batch and streaming mode, from several brokers at once, and publish
results back as notifications.  Needs the ``spark`` extra (pyspark 4.2+, pyarrow) and
Java 17 or 21.  See ``docs/spark.md``.

Data sources (Python Data Source API; ``register(spark)`` makes them available):

* ``wsn_kafka`` (:mod:`.kafka_source`): Kafka topics as the gateway's Kafka adapter maps them;
  Spark's own Kafka connector is used instead when its jar is on the classpath
  (:mod:`.native_kafka`);
* ``wsn_rabbitmq`` (:mod:`.rabbitmq_tap`): a stream-queue tap bound like a subscription;
* ``wsn_log`` (:mod:`.log_source`): the notification logs of buffers, the MQTT buffer
  ``wsnmom spark-buffer`` (:mod:`.buffer`) in particular;
* ``wsn_notify`` (:mod:`.sink`): publishes rows as notifications, once per row.

All sources share one schema (:mod:`.schema`), select with WS-Topics expressions compiled
as the gateway compiles subscriptions (:mod:`.selection`) and are replayable by offset
(:mod:`.reader`).  :func:`read_notifications` unions several of them; the module imports
pyspark only when these names are used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .api import (
        Source,
        kafka,
        log_file,
        plan_batch,
        rabbitmq,
        read_notifications,
        write_notifications,
    )
    from .columns import with_xpath, xml_element
    from .native_kafka import native_kafka_available
    from .options import BridgeError, SourceError
    from .schema import COLUMNS, DDL
    from .session import local_session, register

__all__ = [
    "COLUMNS",
    "DDL",
    "BridgeError",
    "Source",
    "SourceError",
    "kafka",
    "local_session",
    "log_file",
    "native_kafka_available",
    "plan_batch",
    "rabbitmq",
    "read_notifications",
    "register",
    "with_xpath",
    "write_notifications",
    "xml_element",
]

_WHERE = {
    "Source": "api",
    "kafka": "api",
    "log_file": "api",
    "plan_batch": "api",
    "rabbitmq": "api",
    "read_notifications": "api",
    "write_notifications": "api",
    "with_xpath": "columns",
    "xml_element": "columns",
    "native_kafka_available": "native_kafka",
    "BridgeError": "options",
    "SourceError": "options",
    "COLUMNS": "schema",
    "DDL": "schema",
    "local_session": "session",
    "register": "session",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(name)
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
