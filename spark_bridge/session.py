"""Registering the bridge's data sources with a SparkSession, and a local session for
development and tests.

``register(spark)`` makes the formats ``wsn_kafka``, ``wsn_rabbitmq``, ``wsn_log`` and
``wsn_notify`` available; ``read_notifications`` and ``write_notifications`` call it
themselves.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["local_session", "register"]

#: sessions the data sources were registered with (by id: sessions are not hashable)
_registered: set[int] = set()


def register(spark: SparkSession) -> None:
    """Register every data source of the bridge with ``spark`` (once per session)."""
    key = id(spark)
    if key in _registered:
        return
    from .kafka_source import KafkaSource
    from .log_source import LogSource
    from .rabbitmq_tap import RabbitMQSource
    from .sink import NotifySink

    for source in (KafkaSource, RabbitMQSource, LogSource, NotifySink):
        spark.dataSource.register(source)
    _registered.add(key)


def local_session(
    app_name: str = "wsnmom", cores: int = 2, *, driver_memory: str = "1g"
) -> SparkSession:
    """A ``local[cores]`` SparkSession for development and tests: bound to loopback, no
    web UI, Python workers on this interpreter (which has the bridge and its clients),
    few shuffle partitions; the bridge's data sources registered."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.memory", driver_memory)
        .config("spark.sql.shuffle.partitions", str(max(1, cores)))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    register(spark)
    return spark
