"""Stopping PostgreSQL backends in a test: a server that no longer answers one session
(a backend stuck, or a network that stops carrying its packets) while its other sessions
go on.  The backends are found by their ``application_name`` in the URL's own database
(each test has a database of its own on a server other workers share), stopped with
SIGSTOP and always continued; a server that is not a process of this host skips the
test."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from urllib.parse import urlsplit

import pytest

__all__ = ["backend_pids", "stopped_backends", "stopped_pids"]


def backend_pids(url: str, application_name: str) -> list[int]:
    """The server processes serving ``application_name``'s sessions in ``url``'s database."""
    import psycopg

    admin = url.rsplit("/", 1)[0] + "/postgres"
    database = urlsplit(url).path.lstrip("/")
    with psycopg.connect(admin, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND datname = %s",
            (application_name, database),
        ).fetchall()
    return [int(r[0]) for r in rows]


@contextmanager
def stopped_pids(pids: list[int]) -> Iterator[list[int]]:
    """SIGSTOP ``pids`` for the block, SIGCONT after it."""
    assert pids, "no backend to stop"
    try:
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
    except (ProcessLookupError, PermissionError):
        pytest.skip("the PostgreSQL server is not a process of this host")
    try:
        yield pids
    finally:
        for pid in pids:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


@contextmanager
def stopped_backends(url: str, application_name: str) -> Iterator[list[int]]:
    """SIGSTOP the backends of ``application_name``'s sessions for the block."""
    with stopped_pids(backend_pids(url, application_name)) as pids:
        yield pids
