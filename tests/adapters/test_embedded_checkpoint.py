"""Embedded WAL checkpoints run on a thread of their own, not inside a commit: commits
never wait for a checkpoint's fsyncs (unless a burst outran the thread by 16 MiB), and the
WAL's pages still reach the database file."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from wsnmom.adapters.embedded import EmbeddedAdapter
from wsnmom.adapters.embedded import storage as store_module
from wsnmom.adapters.embedded.storage import DB_FILE
from wsnmom.core.adapter import OutboundMessage, QueueLimits, SubscriptionSpec
from wsnmom.topic_mapping.model import PathPattern, Topic

NS = "urn:wsnmom:test:checkpoint"


def test_commits_do_not_checkpoint_and_the_thread_does(
    adapter: EmbeddedAdapter, store: Path
) -> None:
    engine = adapter._require()
    # commits checkpoint only a WAL past the backstop (a burst the thread did not keep
    # up with); the 4 MB written here stay below it
    backstop = store_module._WAL_BACKSTOP_PAGES
    assert engine.conn.execute("PRAGMA wal_autocheckpoint").fetchone() == (backstop,)
    assert backstop * 4096 > 20 * 50 * 4000 * 2
    adapter.subscription(SubscriptionSpec("s", (PathPattern(NS, ("t",)),), QueueLimits()))
    body = b"<x>" + b"y" * 4000 + b"</x>"
    for _ in range(20):
        adapter.publish_many(
            [OutboundMessage(Topic(NS, ("t",)), body, uuid.uuid4().hex) for _ in range(50)]
        )
    # only the checkpoint thread moves pages into the database file (nothing here opens
    # another connection, and commits do not checkpoint)
    deadline = time.monotonic() + 3 * store_module._CHECKPOINT_INTERVAL + 5
    while time.monotonic() < deadline:
        if (store / DB_FILE).stat().st_size > 1000 * len(body):
            break
        time.sleep(0.1)
    assert (store / DB_FILE).stat().st_size > 1000 * len(body)


def test_memory_database_has_no_checkpoint_thread() -> None:
    a = EmbeddedAdapter("embedded://:memory:")
    a.open()
    try:
        assert a._require()._checkpointer is None
    finally:
        a.close()
