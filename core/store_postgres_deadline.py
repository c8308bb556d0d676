"""Deadlines for the PostgreSQL store's calls: a server that stops answering with its
connections open must not hold a request for ever.

A PostgreSQL backend that hangs (stopped, stuck on its disk, or a host whose kernel still
acknowledges the packets) leaves psycopg waiting on the connection's socket with no
timeout of its own: ``statement_timeout`` is the server's to enforce, and TCP gives up
only when packets go unacknowledged.  Every WS-N request that needed the store then held
its worker thread until the server came back, and ``/readyz`` with it.

:class:`Deadlines` watches the calls under way with one thread: a call still running at
its deadline has its connection's socket shut down (a duplicate of psycopg's descriptor,
``PGconn.socket``), so psycopg's wait ends with an ``OperationalError`` that the store
turns into ``StoreUnavailable`` (HTTP 503); the pool then discards the connection.  Only
the call's own connection is cut: the server, when it answers again, sees a client that
went away.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["Deadlines"]

log = logging.getLogger("wsnmom.core.store")


class Deadlines:
    """The store calls under way and their deadlines (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        #: call token -> (connection, monotonic deadline)
        self._calls: dict[int, tuple[Any, float]] = {}
        self._next = 0
        self._thread: threading.Thread | None = None
        self._closed = False

    @contextmanager
    def bound(self, conn: Any, seconds: float | None) -> Iterator[list[bool]]:
        """Cut ``conn`` if the block has not ended within ``seconds`` (None: no bound).
        Yields a one-item list, True once the connection was cut (for the error's text)."""
        cut = [False]
        if seconds is None:
            yield cut
            return
        with self._lock:
            self._next += 1
            token = self._next
            self._calls[token] = (conn, time.monotonic() + seconds)
            self._start()
            self._lock.notify()
        try:
            yield cut
        finally:
            with self._lock:
                entry = self._calls.pop(token, None)
            if entry is None:  # the watcher took it: the connection was cut
                cut[0] = True

    def close(self) -> None:
        """Stop the watching thread (calls still under way are no longer bounded)."""
        with self._lock:
            self._closed = True
            self._calls.clear()
            self._lock.notify()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._watch, name="wsnmom-store-deadlines", daemon=True
            )
            self._thread.start()

    def _watch(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
                now = time.monotonic()
                late = [t for t, (_, until) in self._calls.items() if until <= now]
                conns = [self._calls.pop(t)[0] for t in late]
                if not conns:
                    soonest = min((u for _, u in self._calls.values()), default=None)
                    self._lock.wait(None if soonest is None else soonest - now)
                    continue
            for conn in conns:
                _cut(conn)


def _cut(conn: Any) -> None:
    """Shut the socket of ``conn`` (a psycopg connection) down: a wait on it ends."""
    try:
        fd = conn.pgconn.socket
        dup = socket.socket(fileno=os.dup(fd))
    except Exception:  # closed meanwhile: nothing waits on it
        return
    try:
        log.warning("a PostgreSQL store call got no answer in time: its connection is cut")
        dup.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        dup.close()
