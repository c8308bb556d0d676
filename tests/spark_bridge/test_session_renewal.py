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
