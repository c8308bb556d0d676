"""``Engine.publish_many`` remembers the next message id and each topic's current message
id between committed publishes instead of asking SQLite again.  What is stored must be
what asking gives: ids in AUTOINCREMENT order, one reference per current slot, nothing
left behind; a failed transaction must not leave a stale memory behind."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest
from wsnmom.adapters.embedded import EmbeddedAdapter
from wsnmom.adapters.embedded import store as store_module
from wsnmom.adapters.embedded.store import DB_FILE, Engine
from wsnmom.core.adapter import OutboundMessage
from wsnmom.topic_mapping.model import Topic

NS = "urn:wsnmom:test:publish-cache"


def msg(path: str, body: bytes = b"<x/>") -> OutboundMessage:
    return OutboundMessage(Topic(NS, tuple(path.split("/"))), body, uuid.uuid4().hex, {})


def rows(store: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(store / DB_FILE) as c:
        return list(c.execute(sql).fetchall())


def engine(adapter: EmbeddedAdapter) -> Engine:
    e: Engine = adapter._engine  # type: ignore[attr-defined]
    return e


def check_consistent(store: Path) -> None:
    """Every stored message is exactly the current message of one topic (no subscriptions)."""
    current = rows(store, "SELECT path, mid FROM current ORDER BY path")
    stored = rows(store, "SELECT id, refs FROM messages ORDER BY id")
    assert sorted((mid, 1) for _, mid in current) == stored


def test_ids_and_current_slots_match_the_database(adapter: EmbeddedAdapter, store: Path) -> None:
    e = engine(adapter)
    for i in range(5):
        adapter.publish_many([msg("a"), msg("b")] if i % 2 else [msg("a")])
        with e.lock:
            assert e._next_mid == Engine._next_message_id(e.conn)
            expected = {
                (ns, path): mid for ns, path, mid in e.conn.execute("SELECT * FROM current")
            }
            assert e._current_mids == expected
    check_consistent(store)
    # ids 1..7 in publish order (a, a b, a, a b, a): the current ones are the last per topic
    assert rows(store, "SELECT path, mid FROM current ORDER BY path") == [("a", 7), ("b", 6)]


def test_ids_continue_after_reopening(store: Path) -> None:
    for expected in ((1,), (2,)):
        a = EmbeddedAdapter(f"embedded://{store}")
        a.open()
        try:
            a.publish_many([msg("a")])
        finally:
            a.close()
        assert rows(store, "SELECT id FROM messages") == [expected]


def test_failed_transaction_forgets_and_recovers(
    adapter: EmbeddedAdapter, store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    e = engine(adapter)
    adapter.publish_many([msg("a")])
    assert e._next_mid == 2 and e._current_mids

    def fail(*args: Any) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(store_module, "_execute_rows", fail)
    with pytest.raises(Exception):  # noqa: B017 - the adapter's own wrapping of the error
        adapter.publish_many([msg("a")])
    assert e._next_mid is None and e._current_mids == {}
    monkeypatch.undo()
    adapter.publish_many([msg("a"), msg("b")])
    assert rows(store, "SELECT path, mid FROM current ORDER BY path") == [("a", 2), ("b", 3)]
    check_consistent(store)


def test_memory_of_current_slots_is_bounded(
    adapter: EmbeddedAdapter, store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "_CURRENT_MIDS_MAX", 3)
    e = engine(adapter)
    for i in range(8):
        adapter.publish_many([msg(f"t{i % 5}")])
        assert len(e._current_mids) <= 3
    check_consistent(store)
    assert len(rows(store, "SELECT * FROM current")) == 5


def test_batch_storing_nothing_keeps_the_known_id(adapter: EmbeddedAdapter) -> None:
    from wsnmom.core.adapter import INTERNAL_NAMESPACE_PREFIX

    e = engine(adapter)
    adapter.publish_many([msg("a")])
    internal = OutboundMessage(Topic(INTERNAL_NAMESPACE_PREFIX + "x", ("y",)), b"<x/>", "id", {})
    adapter.publish_many([internal])  # no subscription, no current slot: nothing stored
    assert e._next_mid == 2
    adapter.publish_many([msg("a")])
    assert rows(store_path(adapter), "SELECT id FROM messages") == [(2,)]


def store_path(adapter: EmbeddedAdapter) -> Path:
    return Path(engine(adapter).path)


def test_replaced_current_message_still_queued_is_kept(
    adapter: EmbeddedAdapter, store: Path
) -> None:
    from wsnmom.core.adapter import QueueLimits, SubscriptionSpec
    from wsnmom.topic_mapping.model import PathPattern

    handle = adapter.subscription(SubscriptionSpec("s", (PathPattern(NS, ("a",)),), QueueLimits()))
    adapter.publish_many([msg("a", b"<one/>")])
    assert rows(store, "SELECT id, refs FROM messages") == [(1, 2)]  # queued + current
    adapter.publish_many([msg("a", b"<two/>")])
    # the first one left the current slot but is still queued; the second is in both
    assert rows(store, "SELECT id, refs FROM messages ORDER BY id") == [(1, 1), (2, 2)]
    received = handle.pull(10)
    assert [r.body for r in received] == [b"<one/>", b"<two/>"]
    for r in received:
        r.ack()
    engine(adapter).flush_acks()
    assert rows(store, "SELECT id, refs FROM messages") == [(2, 1)]
    adapter.publish_many([msg("a", b"<three/>")])
    assert rows(store, "SELECT id, refs FROM messages ORDER BY id") == [(3, 2)]
