"""Registering the bridge's data sources with a SparkSession, and a local session for
development and tests.

``register(spark)`` makes the formats ``wsn_kafka``, ``wsn_rabbitmq``, ``wsn_log`` and
``wsn_notify`` available; ``read_notifications`` and ``write_notifications`` call it
themselves.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import stat
import sys
import tempfile
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["local_session", "register", "worker_python"]

#: sessions the data sources were registered with, held weakly: a session object that is
#: gone leaves the set, so a new session at its address (``id``) is registered again
_registered: weakref.WeakSet[SparkSession] = weakref.WeakSet()


def register(spark: SparkSession) -> None:
    """Register every data source of the bridge with ``spark`` (once per session)."""
    if spark in _registered:
        return
    from .kafka_source import KafkaSource
    from .log_source import LogSource
    from .rabbitmq_tap import RabbitMQSource
    from .sink import NotifySink

    for source in (KafkaSource, RabbitMQSource, LogSource, NotifySink):
        spark.dataSource.register(source)
    _registered.add(spark)


#: the worker launcher: Spark puts ``$SPARK_HOME/python/lib/*.zip`` (pyspark and py4j as
#: sources, no bytecode) first on its Python workers' ``PYTHONPATH``; this drops them so
#: that a worker imports the installed pyspark, compiled once (see ``worker_python``)
_LAUNCHER = """#!/bin/sh
set -f
kept=
if [ -n "$SPARK_HOME" ]; then
    IFS=:
    for entry in $PYTHONPATH; do
        case $entry in
            "$SPARK_HOME"/python/lib/*.zip) ;;
            *) kept=${kept:+$kept:}$entry ;;
        esac
    done
    unset IFS
    PYTHONPATH=$kept
    export PYTHONPATH
fi
exec %s "$@"
"""


def worker_python() -> str:
    """An executable that runs this interpreter for Spark's Python workers, without the
    source archives Spark puts first on their path: imported from those, pyspark is
    compiled again in every worker process (1.1 s of CPU instead of 0.25 s for a
    streaming source's runner, which Spark gives a fixed 10 s to connect back).  The
    installed pyspark is the same version: its wheel ships the archives.  A small shell
    script in the temporary directory, one per interpreter and user; the interpreter
    itself where there is no ``/bin/sh`` or the script cannot be written."""
    if not os.path.exists("/bin/sh"):
        return sys.executable
    script = _LAUNCHER % shlex.quote(sys.executable)
    digest = hashlib.sha256(f"{os.getuid()}:{script}".encode()).hexdigest()[:16]
    path = os.path.join(tempfile.gettempdir(), f"wsnmom-spark-python-{digest}")
    if _trusted(path, script):
        return path
    try:
        fd, partial = tempfile.mkstemp(prefix="wsnmom-spark-python-", dir=os.path.dirname(path))
        with os.fdopen(fd, "w") as out:
            out.write(script)
        os.chmod(partial, 0o755)
        os.replace(partial, path)  # whole or not at all, also with two sessions at once
    except OSError:
        # another user's file at that name in a sticky temporary directory: not ours to
        # replace, and never ours to run
        return sys.executable
    return path


def _trusted(path: str, script: str) -> bool:
    """Whether ``path`` is a launcher this user wrote: a regular file of this user that
    nobody else can write, holding ``script``.  The temporary directory is shared, so a
    file found at a predictable name is run only after these checks (and a sticky
    directory keeps others from replacing it afterwards)."""
    try:
        found = os.lstat(path)
        if not stat.S_ISREG(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o022:
            return False
        with open(path, encoding="utf-8") as held:
            return held.read() == script
    except (OSError, UnicodeDecodeError):
        return False


def local_session(
    app_name: str = "wsnmom", cores: int = 2, *, driver_memory: str = "1g"
) -> SparkSession:
    """A ``local[cores]`` SparkSession for development and tests: bound to loopback, no
    web UI, Python workers on this interpreter (``worker_python``: with the installed
    pyspark, which has its bytecode; the interpreter has the bridge and its clients),
    few shuffle partitions; the bridge's data sources registered."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", worker_python())
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
