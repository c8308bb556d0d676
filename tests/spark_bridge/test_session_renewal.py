"""The shared SparkSession is renewed for the next test when a test left it unusable
(tests/support/spark_session.py): stopped, or with the main thread's Py4J connection out
of step, as a test stopped by its timeout leaves it (before, every later Spark test of
the worker failed with "... does not exist in the JVM")."""

from __future__ import annotations

import signal
import threading
from typing import Any

import pytest

from tests.support.spark_session import SparkHolder, usable
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.spark]


class Interrupted(BaseException):
    """What pytest-timeout raises, as a BaseException: no ``except Exception`` stops it."""


def test_a_stopped_session_is_renewed_for_the_next_test(
    spark: Any, spark_holder: SparkHolder
) -> None:
    spark.stop()
    assert not usable(spark)
    renewals = spark_holder.renewals
    after = spark_holder.get()  # what the next test's ``spark`` fixture does
    assert usable(after) and after.range(5).count() == 5
    assert after is not spark and spark_holder.renewals == renewals + 1


def test_a_session_out_of_step_after_an_interrupted_call_is_renewed(
    spark: Any, spark_holder: SparkHolder
) -> None:
    # kept, as pytest keeps a failed test's traceback; until the job ends, a call on
    # this thread's connection waits, and then reads the job's answer
    kept = _interrupt_a_long_job(spark)
    renewals = spark_holder.renewals
    after = spark_holder.get()
    assert usable(after) and after.range(5).count() == 5
    assert spark_holder.renewals == renewals + 1
    # the interrupted job was cancelled, not left running on the worker's cores
    tracker = after.sparkContext.statusTracker()
    wait_until(lambda: not tracker.getActiveJobsIds(), 60, what="the interrupted job cancelled")
    del kept


def _interrupt_a_long_job(spark: Any) -> Interrupted:
    """Interrupt the main thread's Py4J call of a long Spark job, once the job runs, with
    an exception raised by a signal handler (pytest-timeout's way); return it."""
    main = threading.get_ident()
    tracker = spark.sparkContext.statusTracker()

    def interrupt() -> None:
        # this thread's Py4J calls go through a connection of its own
        wait_until(lambda: tracker.getActiveJobsIds(), 60, what="the long job running")
        signal.pthread_kill(main, signal.SIGUSR1)

    def handler(signum: int, frame: Any) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGUSR1, handler)
    helper = threading.Thread(target=interrupt, daemon=True)
    try:
        helper.start()
        try:
            spark.range(3 * 10**9).selectExpr("id * id AS x").where("x < 0").count()
        except Interrupted as interrupted:
            return interrupted
        raise AssertionError("the job ended before it was interrupted")
    finally:
        helper.join(60)
        signal.signal(signal.SIGUSR1, previous)


def _finds_the_bridge_sources(session: Any) -> bool:
    """Whether ``session`` knows the bridge's formats (reading a schema runs no job)."""
    try:
        schema = session.read.format("wsn_log").load().schema
    except Exception as exc:  # Spark reports an unknown format as a JVM exception
        assert "DATA_SOURCE_NOT_FOUND" in str(exc), exc
        return False
    return bool(schema.fields)


def test_a_new_session_where_a_stopped_one_was_gets_the_sources_registered(
    spark: Any, spark_holder: SparkHolder
) -> None:
    """``register`` once remembered sessions by ``id``: a session made after another was
    stopped and freed can take its address, and was then taken for registered (every
    ``wsn_*`` format unknown to it).  Sessions of a size class of their own make CPython
    hand the freed address to the next one (checked below, so that the test shows it)."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession
    from wsnmom.spark_bridge.session import register

    class Padded(SparkSession):
        __slots__ = tuple(f"pad{i}" for i in range(40))  # a pymalloc size class of its own

    conf = spark.sparkContext.getConf()
    spark_holder.stop()  # the next test's ``spark`` is a new session
    del spark
    first = Padded(SparkContext.getOrCreate(conf))
    register(first)
    assert _finds_the_bridge_sources(first)
    freed = id(first)
    first.stop()
    del first
    context = SparkContext.getOrCreate(conf)
    # the newest session is kept by PySpark until the next one is made: this one frees
    # ``first``, the one after takes its address
    kept = [Padded(context)]
    try:
        while len(kept) < 20 and id(kept[-1]) != freed:
            kept.append(Padded(context))
        again = kept[-1]
        assert id(again) == freed, "no session took the stopped one's address"
        register(again)
        assert _finds_the_bridge_sources(again)
    finally:
        context.stop()
