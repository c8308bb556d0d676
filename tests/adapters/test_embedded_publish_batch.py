"""``Engine.publish_many`` writes a batch with one route lookup per topic and
``executemany``, assigning message ids itself (docs/performance.md, the 100-message
ingress).  What is stored, queued, dropped and retained must be what per-message
processing gave, bounded queues and id order included."""

from __future__ import annotations

import json
import sqlite3
import uuid
from pathlib import Path

import pytest
from wsnmom.adapters.embedded import EmbeddedAdapter
from wsnmom.adapters.embedded.adapter import EmbeddedReceived
from wsnmom.adapters.embedded.records import _HeadersJson
from wsnmom.adapters.embedded.storage import DB_FILE
from wsnmom.core.adapter import (
    HEADER_MESSAGE_ID,
    INTERNAL_NAMESPACE_PREFIX,
    OutboundMessage,
    Overflow,
    QueueLimits,
    SubscriptionSpec,
)
from wsnmom.topic_mapping.model import ANY, PathPattern, Topic

NS = "urn:wsnmom:test:embedded-batch"
INTERNAL = INTERNAL_NAMESPACE_PREFIX + "test"


def msg(
    path: str, body: bytes, ns: str = NS, headers: dict[str, str] | None = None
) -> OutboundMessage:
    return OutboundMessage(Topic(ns, tuple(path.split("/"))), body, uuid.uuid4().hex, headers or {})


def rows(store: Path, sql: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(store / DB_FILE) as c:
        return list(c.execute(sql).fetchall())


def mids(received: list[object]) -> list[int]:
    return [r._mid for r in received if isinstance(r, EmbeddedReceived)]


def sub(adapter: EmbeddedAdapter, name: str, *paths: str, limits: QueueLimits | None = None):  # type: ignore[no-untyped-def]
    patterns = tuple(
        PathPattern(NS, tuple(ANY if s == "*" else s for s in p.split("/"))) for p in paths
    )
    return adapter.subscription(SubscriptionSpec(name, patterns, limits or QueueLimits()))


@pytest.mark.parametrize(
    ("limits", "kept"),
    [
        (QueueLimits(max_messages=2, overflow=Overflow.DROP_OLDEST), [b"3", b"4"]),
        (QueueLimits(max_messages=2, overflow=Overflow.DROP_NEWEST), [b"0", b"1"]),
        (QueueLimits(max_bytes=3, overflow=Overflow.DROP_OLDEST), [b"2", b"3", b"4"]),
        (QueueLimits(max_messages=1, overflow=Overflow.DROP_OLDEST), [b"4"]),
    ],
)
def test_bounded_queue_sees_the_earlier_messages_of_its_batch(
    adapter: EmbeddedAdapter, store: Path, limits: QueueLimits, kept: list[bytes]
) -> None:
    bounded = sub(adapter, "bounded", "t", limits=limits)
    free = sub(adapter, "free", "t")
    receipts = adapter.publish_many([msg("t", b"%d" % i) for i in range(5)])
    assert all(r.routed for r in receipts)
    assert [m.body for m in bounded.pull(10)] == kept
    assert [m.body for m in free.pull(10)] == [b"%d" % i for i in range(5)]
    # every stored message is referenced: queue entries plus the current slot
    refs = rows(store, "SELECT id, refs FROM messages ORDER BY id")
    entries = rows(store, "SELECT mid, count(*) FROM queue_entries GROUP BY mid ORDER BY mid")
    current = {r[0] for r in rows(store, "SELECT mid FROM current")}
    assert [(mid, n + (mid in current)) for mid, n in entries] == refs


def test_bounded_queue_counts_survive_several_batches(adapter: EmbeddedAdapter) -> None:
    h = sub(adapter, "s", "t", limits=QueueLimits(max_messages=3, overflow=Overflow.DROP_OLDEST))
    for batch in range(4):
        adapter.publish_many([msg("t", b"%d.%d" % (batch, i)) for i in range(2)])
    assert [m.body for m in h.pull(10)] == [b"2.1", b"3.0", b"3.1"]


def test_interleaved_topics_fan_out_in_publish_order(adapter: EmbeddedAdapter) -> None:
    ab = sub(adapter, "ab", "a", "b")
    a_only = sub(adapter, "a", "a")
    wild = sub(adapter, "wild", "*")
    nobody = sub(adapter, "x", "x")
    batch = [msg("a", b"a0"), msg("b", b"b0"), msg("c", b"c0"), msg("a", b"a1"), msg("b", b"b1")]
    receipts = adapter.publish_many(batch)
    assert [r.routed for r in receipts] == [True] * 5
    assert [m.body for m in ab.pull(10)] == [b"a0", b"b0", b"a1", b"b1"]
    assert [m.body for m in a_only.pull(10)] == [b"a0", b"a1"]
    got = wild.pull(10)
    assert [m.body for m in got] == [m.body for m in batch]
    assert mids(got) == sorted(mids(got))
    assert nobody.pull(10) == []
    for topic, body in (("a", b"a1"), ("b", b"b1"), ("c", b"c0")):
        cur = adapter.current_message(Topic(NS, (topic,)))
        assert cur is not None and cur.body == body


def test_routing_flags_per_message(adapter: EmbeddedAdapter) -> None:
    sub(adapter, "s", "yes")
    receipts = adapter.publish_many([msg("yes", b"1"), msg("no", b"2"), msg("yes", b"3")])
    assert [r.routed for r in receipts] == [True, False, True]


def test_internal_topics_keep_no_current_message(adapter: EmbeddedAdapter, store: Path) -> None:
    inbox = adapter.subscription(
        SubscriptionSpec("inbox", (PathPattern(INTERNAL, ("p1",)),), QueueLimits())
    )
    adapter.publish_many([msg("p1", b"1", INTERNAL), msg("p2", b"lost", INTERNAL)])
    assert [m.body for m in inbox.pull(10)] == [b"1"]
    assert rows(store, "SELECT count(*) FROM current") == [(0,)]
    assert rows(store, "SELECT body FROM messages") == [(b"1",)]


def test_message_ids_keep_growing_after_everything_was_deleted(
    adapter: EmbeddedAdapter, store: Path
) -> None:
    h = adapter.subscription(
        SubscriptionSpec("inbox", (PathPattern(INTERNAL, ("p",)),), QueueLimits())
    )
    adapter.publish_many([msg("p", b"%d" % i, INTERNAL) for i in range(3)])
    first = h.pull(10)
    for m in first:
        m.ack()
    adapter.publish_many([])  # nothing
    adapter.publish_many([msg("other", b"x", INTERNAL)])  # applies the acks, stores nothing
    assert rows(store, "SELECT count(*) FROM messages") == [(0,)]
    adapter.publish_many([msg("p", b"%d" % i, INTERNAL) for i in range(3, 5)])
    second = h.pull(10)
    assert [m.body for m in second] == [b"3", b"4"]
    assert min(mids(second)) > max(mids(first))
    assert mids(first) == list(range(mids(first)[0], mids(first)[0] + 3))


def test_ids_follow_single_publishes_and_batches(adapter: EmbeddedAdapter) -> None:
    h = sub(adapter, "s", "t")
    adapter.publish(msg("t", b"0"))
    adapter.publish_many([msg("t", b"1"), msg("t", b"2")])
    adapter.publish(msg("t", b"3"))
    got = h.pull(10)
    assert [m.body for m in got] == [b"0", b"1", b"2", b"3"]
    assert mids(got) == sorted(set(mids(got)))


def test_headers_are_stored_with_the_message_id(adapter: EmbeddedAdapter) -> None:
    h = sub(adapter, "s", "t")
    plain = msg("t", b"1", headers={"k": "v"})
    explicit = msg("t", b"2", headers={HEADER_MESSAGE_ID: "given", "k": "w"})
    adapter.publish_many([plain, explicit])
    first, second = h.pull(10)
    assert first.headers == {"k": "v", HEADER_MESSAGE_ID: plain.message_id}
    assert second.headers == {HEADER_MESSAGE_ID: "given", "k": "w"}
    cur = adapter.current_message(Topic(NS, ("t",)))
    assert cur is not None and cur.headers == second.headers


def test_wildcard_subscriber_and_retained_topics_in_one_batch(
    adapter: EmbeddedAdapter, store: Path
) -> None:
    h = adapter.subscription(SubscriptionSpec("s", (PathPattern(NS, ("r", ANY)),), QueueLimits()))
    batch = [msg(f"r/{i % 3}", b"%d" % i) for i in range(9)] + [msg("q", b"q")]
    adapter.publish_many(batch)
    assert [m.body for m in h.pull(20)] == [b"%d" % i for i in range(9)]
    # nine queued (three of them also current); q is only current, held inline
    assert rows(store, "SELECT count(*) FROM messages") == [(9,)]
    assert sorted(rows(store, "SELECT path, mid = 0 FROM current")) == [
        ("q", 1),
        ("r/0", 0),
        ("r/1", 0),
        ("r/2", 0),
    ]
    cur = adapter.current_message(Topic(NS, ("q",)))
    assert cur is not None and cur.body == b"q"


def test_headers_json_equals_json_dumps_of_the_headers() -> None:
    from types import MappingProxyType

    dumps = _HeadersJson()
    base = {"k": "v", "é": 'quote " and \\ and \u2028', "n": "1"}
    cases: list[OutboundMessage] = []
    for i in range(3):  # the shape core's encode gives: id first, then shared headers
        cases.append(msg("t", b"", headers={HEADER_MESSAGE_ID: f"id-{i}", **base}))
    cases += [
        msg("t", b"", headers={HEADER_MESSAGE_ID: "x", **base, "extra": "e"}),
        msg("t", b"", headers={HEADER_MESSAGE_ID: 'odd "id"\n', "k": "other"}),
        msg("t", b"", headers={"k": "v", HEADER_MESSAGE_ID: "not first"}),
        msg("t", b"", headers={"k": "no id"}),
        msg("t", b"", headers={HEADER_MESSAGE_ID: "only"}),
        msg("t", b"", headers={}),
        msg("t", b"", headers=MappingProxyType({HEADER_MESSAGE_ID: "proxy", "k": "v"})),  # type: ignore[arg-type]
        msg("t", b"", headers={HEADER_MESSAGE_ID: "again", **base}),
    ]
    for m in cases:
        expected = dict(m.headers)
        expected.setdefault(HEADER_MESSAGE_ID, m.message_id)
        assert dumps(m) == json.dumps(expected)
