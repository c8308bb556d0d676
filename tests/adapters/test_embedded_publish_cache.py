"""``Engine.publish_many`` remembers the next message id and each topic's current message
id between committed publishes instead of asking SQLite again.  What is stored must be
what asking gives: ids in AUTOINCREMENT order, one reference per current slot, nothing
left behind; a failed transaction must not leave a stale memory behind.  A current message
that no subscription received is held inline in its ``current`` row (``mid`` 0), and a
database of schema version 1 is upgraded on open.

Most tests here keep one subscription on every one-level topic of ``NS`` (``catch_all``), so
that every message is stored in ``messages`` and has an id."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest
from wsnmom.adapters.embedded import EmbeddedAdapter, publish, records
from wsnmom.adapters.embedded.storage import DB_FILE
from wsnmom.adapters.embedded.store import Engine
from wsnmom.core.adapter import OutboundMessage, QueueLimits, SubscriptionSpec
from wsnmom.topic_mapping.model import ANY, PathPattern, Topic

NS = "urn:wsnmom:test:publish-cache"


def msg(path: str, body: bytes = b"<x/>") -> OutboundMessage:
    return OutboundMessage(Topic(NS, tuple(path.split("/"))), body, uuid.uuid4().hex, {})


def rows(store: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(store / DB_FILE) as c:
        return list(c.execute(sql).fetchall())


def engine(adapter: EmbeddedAdapter) -> Engine:
    e: Engine = adapter._engine  # type: ignore[attr-defined]
    return e


def catch_all(adapter: EmbeddedAdapter) -> None:
    """A subscription on every one-level topic of NS (re-attached when it exists)."""
    adapter.subscription(SubscriptionSpec("all", (PathPattern(NS, (ANY,)),), QueueLimits()))


def current_slots(store: Path) -> dict[str, int]:
    return dict(rows(store, "SELECT path, mid FROM current ORDER BY path"))


def check_consistent(store: Path) -> None:
    """Every stored message is referenced exactly by its queue entries plus, when it is
    current, its current slot; an inline current row references nothing."""
    queued = dict(rows(store, "SELECT mid, count(*) FROM queue_entries GROUP BY mid"))
    current = [mid for mid in current_slots(store).values() if mid]
    stored = rows(store, "SELECT id, refs FROM messages ORDER BY id")
    expected = sorted(
        (mid, queued.get(mid, 0) + current.count(mid)) for mid in set(queued) | set(current)
    )
    assert stored == expected


def test_ids_and_current_slots_match_the_database(adapter: EmbeddedAdapter, store: Path) -> None:
    catch_all(adapter)
    e = engine(adapter)
    for i in range(5):
        adapter.publish_many([msg("a"), msg("b")] if i % 2 else [msg("a")])
        with e.lock:
            assert e._next_mid == records.next_message_id(e.conn)
            expected = {
                (ns, path): mid
                for ns, path, mid in e.conn.execute("SELECT ns, path, mid FROM current")
            }
            assert e._current_mids == expected
    check_consistent(store)
    # ids 1..7 in publish order (a, a b, a, a b, a): the current ones are the last per topic
    assert current_slots(store) == {"a": 7, "b": 6}


def test_ids_continue_after_reopening(store: Path) -> None:
    for expected in ([(1,)], [(1,), (2,)]):
        a = EmbeddedAdapter(f"embedded://{store}")
        a.open()
        try:
            catch_all(a)
            a.publish_many([msg("a")])
        finally:
            a.close()
        assert rows(store, "SELECT id FROM messages ORDER BY id") == expected


def test_failed_transaction_forgets_and_recovers(
    adapter: EmbeddedAdapter, store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    catch_all(adapter)
    e = engine(adapter)
    adapter.publish_many([msg("a")])
    assert e._next_mid == 2 and e._current_mids

    def fail(*args: Any) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(records, "_execute_rows", fail)
    with pytest.raises(Exception):  # noqa: B017 - the adapter's own wrapping of the error
        adapter.publish_many([msg("a")])
    assert e._next_mid is None and e._current_mids == {}
    monkeypatch.undo()
    adapter.publish_many([msg("a"), msg("b")])
    assert current_slots(store) == {"a": 2, "b": 3}
    check_consistent(store)


def test_memory_of_current_slots_is_bounded(
    adapter: EmbeddedAdapter, store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(publish, "_CURRENT_MIDS_MAX", 3)
    catch_all(adapter)
    e = engine(adapter)
    for i in range(8):
        adapter.publish_many([msg(f"t{i % 5}")])
        assert len(e._current_mids) <= 3
    check_consistent(store)
    assert len(rows(store, "SELECT * FROM current")) == 5


def test_batch_storing_nothing_keeps_the_known_id(adapter: EmbeddedAdapter) -> None:
    from wsnmom.core.adapter import INTERNAL_NAMESPACE_PREFIX

    catch_all(adapter)
    e = engine(adapter)
    adapter.publish_many([msg("a")])
    internal = OutboundMessage(Topic(INTERNAL_NAMESPACE_PREFIX + "x", ("y",)), b"<x/>", "id", {})
    adapter.publish_many([internal])  # no subscription, no current slot: nothing stored
    assert e._next_mid == 2
    adapter.publish_many([msg("a")])
    assert rows(store_path(adapter), "SELECT id FROM messages ORDER BY id") == [(1,), (2,)]


def store_path(adapter: EmbeddedAdapter) -> Path:
    return Path(engine(adapter).path)


def test_replaced_current_message_still_queued_is_kept(
    adapter: EmbeddedAdapter, store: Path
) -> None:
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


def test_current_without_subscribers_is_inline_and_replaces_a_stored_one(
    adapter: EmbeddedAdapter, store: Path
) -> None:
    handle = adapter.subscription(SubscriptionSpec("s", (PathPattern(NS, ("a",)),), QueueLimits()))
    adapter.publish_many([msg("a", b"<queued/>")])
    assert current_slots(store) == {"a": 1}
    handle.delete()
    # nobody receives the next one: it replaces the stored current message inline, and
    # the stored one, referenced by nothing now, is gone
    adapter.publish_many([msg("a", b"<inline/>")])
    assert current_slots(store) == {"a": 0}
    assert engine(adapter)._current_mids == {(NS, "a"): 0}
    assert rows(store, "SELECT count(*) FROM messages") == [(0,)]
    cur = adapter.current_message(Topic(NS, ("a",)))
    assert cur is not None and cur.body == b"<inline/>"
    # and a stored one replaces the inline one again
    catch_all(adapter)
    adapter.publish_many([msg("a", b"<stored/>")])
    assert list(current_slots(store).values()) == [2]
    cur = adapter.current_message(Topic(NS, ("a",)))
    assert cur is not None and cur.body == b"<stored/>"
    check_consistent(store)


def test_inline_current_message_survives_reopening(store: Path) -> None:
    a = EmbeddedAdapter(f"embedded://{store}")
    a.open()
    try:
        a.publish_many([msg("a", b"<kept/>")])
    finally:
        a.close()
    b = EmbeddedAdapter(f"embedded://{store}")
    b.open()
    try:
        cur = b.current_message(Topic(NS, ("a",)))
        assert cur is not None and cur.body == b"<kept/>"
        assert cur.headers == {"wsnmom-message-id": cur.headers["wsnmom-message-id"]}
    finally:
        b.close()


_VERSION_1 = """
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO meta VALUES ('schema', '1');
CREATE TABLE messages(
    id INTEGER PRIMARY KEY AUTOINCREMENT, ns TEXT NOT NULL, path TEXT NOT NULL,
    body BLOB NOT NULL, headers TEXT NOT NULL, ctype TEXT NOT NULL, msgid TEXT NOT NULL,
    size INTEGER NOT NULL, published REAL NOT NULL, refs INTEGER NOT NULL);
CREATE TABLE subscriptions(
    id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL UNIQUE, patterns TEXT,
    limits TEXT NOT NULL);
CREATE TABLE queue_entries(
    sub INTEGER NOT NULL, mid INTEGER NOT NULL, state INTEGER NOT NULL DEFAULT 0,
    delivered INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (sub, mid)) WITHOUT ROWID;
CREATE TABLE current(
    ns TEXT NOT NULL, path TEXT NOT NULL, mid INTEGER NOT NULL,
    PRIMARY KEY (ns, path)) WITHOUT ROWID;
"""


def test_version_1_database_is_upgraded_on_open(store: Path) -> None:
    store.mkdir(parents=True)
    with sqlite3.connect(store / DB_FILE) as c:
        c.executescript(_VERSION_1)
        c.execute(
            "INSERT INTO messages VALUES (1, ?, 'a', X'3C6F6C642F3E', '{}', 'application/xml', "
            "'m1', 6, 0, 1)",
            (NS,),
        )
        c.execute("INSERT INTO current VALUES (?, 'a', 1)", (NS,))
    a = EmbeddedAdapter(f"embedded://{store}")
    a.open()
    try:
        cur = a.current_message(Topic(NS, ("a",)))
        assert cur is not None and cur.body == b"<old/>"
        a.publish_many([msg("a", b"<new/>")])  # inline now; the old row is released
        cur = a.current_message(Topic(NS, ("a",)))
        assert cur is not None and cur.body == b"<new/>"
        assert rows(store, "SELECT count(*) FROM messages") == [(0,)]
        assert rows(store, "SELECT value FROM meta WHERE key = 'schema'") == [("3",)]
    finally:
        a.close()
