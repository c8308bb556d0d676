"""Test-only fault injection (never installed with wsnmom): a ``wsnmom serve`` process
whose ``PYTHONPATH`` starts with this directory, and whose environment has
``KILLPOINT_BEFORE_STORE=TEXT``, SIGKILLs itself when it is about to store the record of
a new subscription whose consumer address contains ``TEXT`` (or of a new pull point whose
name is ``TEXT``): after its durable subscription was made, before its record exists,
exactly where a crash leaves an orphan (``core.orphans``).  Python imports
``sitecustomize`` from ``sys.path`` at start; without the variable this does nothing."""

from __future__ import annotations

import os
import signal
from typing import Any

MARK = os.environ.get("KILLPOINT_BEFORE_STORE", "")


def _killing(cls: type, method: str) -> None:
    real = getattr(cls, method)

    def add(self: Any, record: Any) -> None:
        consumer = getattr(record, "consumer", None)
        named = getattr(consumer, "address", None) or getattr(record, "name", None) or ""
        if MARK in named:
            os.kill(os.getpid(), signal.SIGKILL)
        real(self, record)

    setattr(cls, method, add)


if MARK:
    from wsnmom.core.store import SqliteStore
    from wsnmom.core.store_postgres import PostgresStore

    for store in (SqliteStore, PostgresStore):
        _killing(store, "add_subscription")
        _killing(store, "add_pull_point")
