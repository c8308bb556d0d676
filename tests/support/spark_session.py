"""The Spark tests' one SparkSession per worker, renewed when a test left it unusable.

A JVM start costs tens of seconds of CPU, so a worker keeps one session for every Spark
test. A test can leave it unusable: stopped, or with the main thread's Py4J connection
out of step. The second is what a test stopped by its timeout leaves: pytest-timeout
raises in the middle of a Py4J call, the JVM's answer to it stays unread on the
thread's connection, pytest keeps the failure's traceback (and through it the
connection), and every later call reads the answer to the call before ("... does not
exist in the JVM" for every Spark test after it). :meth:`SparkHolder.get`, before each
test, gives the thread a new Py4J connection if a call on its connection never ended,
checks the session with a token round trip (two Py4J calls, no Spark job), starts a new
session when that fails (it was stopped), and cancels the jobs and streaming queries a
test left running.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

__all__ = ["SparkHolder", "usable"]

#: the local property the check writes and reads back
PROBE = "wsnmom.tests.probe"


def usable(session: Any) -> bool:
    """Whether ``session`` answers in step: a fresh token set as a local property of its
    context comes back (a stopped context raises; a connection out of step returns the
    answer to the call before)."""
    token = uuid.uuid4().hex
    try:
        context = session.sparkContext
        context.setLocalProperty(PROBE, token)
        return bool(context.getLocalProperty(PROBE) == token)
    except Exception:
        return False


class SparkHolder:
    """Hands out the worker's SparkSession (:meth:`get`), renewing an unusable one."""

    def __init__(self, app_name: str = "wsnmom-tests", cores: int = 2) -> None:
        self.app_name = app_name
        self.cores = cores
        self.session: Any = None
        #: how often :meth:`get` found the session unusable or with work left running
        self.renewals = 0

    def get(self) -> Any:
        """A usable session: the current one, or a renewed one."""
        if self.session is not None:
            renewed = self._reconnect_if_interrupted()
            if usable(self.session):
                if self._cancel_leftovers() or renewed:
                    self.renewals += 1
                return self.session
            self.renewals += 1
            with contextlib.suppress(Exception):
                self.session.stop()
        from wsnmom.spark_bridge.session import local_session

        self.session = local_session(self.app_name, cores=self.cores)
        self.session.sparkContext.setLogLevel("ERROR")
        return self.session

    def stop(self) -> None:
        """Stop the session (at the end of the worker's run)."""
        if self.session is not None:
            with contextlib.suppress(Exception):
                self.session.stop()
            self.session = None

    def _reconnect_if_interrupted(self) -> bool:
        """Close this thread's Py4J connection if a call on it never ended (the client
        takes it out of its idle connections for a call and puts it back after the
        answer): the next call opens a new one, in step, without waiting for the old
        call's answer.  Whether it did.  Neither PySpark nor Py4J offers this publicly:
        the gateway's client is reached through two private names (a test fixture's,
        never the product's)."""
        client = self.session.sparkContext._gateway._gateway_client
        connection = client.get_thread_connection()
        if connection is None or connection.socket is None or connection in client.deque:
            return False
        connection.close()
        # the new connection is served by another JVM thread: make the session the
        # active one there, as its creation did on the old one (Spark looks the bridge's
        # Python data sources up in the active session)
        with contextlib.suppress(Exception):
            self.session.createDataFrame([], "x int")
        return True

    def _cancel_leftovers(self) -> bool:
        """End what an interrupted test left running (its jobs, its streaming queries);
        whether there was any."""
        jobs = self.session.sparkContext.statusTracker().getActiveJobsIds()
        queries = list(self.session.streams.active)
        if jobs:
            self.session.sparkContext.cancelAllJobs()
        for query in queries:
            with contextlib.suppress(Exception):
                query.stop()
        return bool(jobs or queries)
