"""The embedded adapter's restore at start-up (``restoring`` .. ``restored``): handles
started meanwhile get no dispatch round of their own, and ``restored`` schedules those whose
queues hold messages (adapters/embedded/dispatch.py).  What must not change: a restored
backlog is delivered in order, what is published during the restore is delivered, an empty
queue delivers what arrives later, and a subscription that is not started keeps its queue."""

from __future__ import annotations

import sqlite3
import uuid
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
from wsnmom.adapters.embedded import EmbeddedAdapter
from wsnmom.core.adapter import AdapterError, OutboundMessage, Received, SubscriptionSpec
from wsnmom.topic_mapping.model import PathPattern, Topic

from tests.support.waiting import wait_until

NS = "urn:wsnmom:test:embedded-restore"
EMPTY = 1000
BACKLOG = 50


def _msg(path: str, body: bytes) -> OutboundMessage:
    return OutboundMessage(Topic(NS, (path,)), body, uuid.uuid4().hex)


def _spec(name: str, path: str) -> SubscriptionSpec:
    return SubscriptionSpec(name, (PathPattern(NS, (path,)),))


def test_backlog_among_a_thousand_empty_queues_is_delivered_and_an_unstarted_one_held(
    store: Path,
) -> None:
    url = f"embedded://{store}"
    first = EmbeddedAdapter(url)
    first.open()
    for i in range(EMPTY):
        first.subscription(_spec(f"e{i:04d}", "quiet"))
    first.subscription(_spec("backlog", "b"))
    first.subscription(_spec("paused", "b"))
    first.subscription(_spec("during", "d"))
    first.publish_many([_msg("b", b"%d" % i) for i in range(BACKLOG)])
    first.close()

    seen: dict[str, list[bytes]] = defaultdict(list)

    def collector(name: str) -> Callable[[Received], None]:
        def on_message(m: Received) -> None:
            seen[name].append(m.body)
            m.ack()

        return on_message

    a = EmbeddedAdapter(url)
    a.open()
    try:
        a.restoring()
        for i in range(EMPTY):
            a.subscription(_spec(f"e{i:04d}", "quiet")).start(collector(f"e{i:04d}"))
        a.subscription(_spec("backlog", "b")).start(collector("backlog"))
        a.subscription(_spec("during", "d")).start(collector("during"))
        # published while the restore runs, to a queue that was empty when it started
        a.publish_many([_msg("d", b"during")])
        paused = a.subscription(_spec("paused", "b"))  # attached, not started
        a.restored()

        want = [b"%d" % i for i in range(BACKLOG)]
        wait_until(lambda: len(seen["backlog"]) >= BACKLOG, 30, what="the backlog")
        assert seen["backlog"] == want
        wait_until(lambda: seen["during"], 30, what="the message published during it")
        assert seen["during"] == [b"during"]
        # the empty queues deliver what is published after the restore
        a.publish_many([_msg("quiet", b"sentinel")])
        wait_until(
            lambda: sum(len(seen[f"e{i:04d}"]) for i in range(EMPTY)) >= EMPTY,
            60,  # 1,000 deliveries: room for a loaded machine
            what="the sentinel on every empty queue",
        )
        assert all(seen[f"e{i:04d}"] == [b"sentinel"] for i in range(EMPTY))
        assert "paused" not in seen
        assert paused.depth() == BACKLOG
        assert seen["backlog"] == want
    finally:
        a.close()


def test_without_restoring_a_started_handle_delivers_its_backlog(store: Path) -> None:
    """The conformance kit and scripts never call ``restoring``: a start dispatches."""
    a = EmbeddedAdapter(f"embedded://{store}")
    a.open()
    try:
        h = a.subscription(_spec("s", "t"))
        a.publish_many([_msg("t", b"%d" % i) for i in range(5)])
        got: list[bytes] = []
        h.start(lambda m: (got.append(m.body), m.ack()))
        wait_until(lambda: len(got) >= 5, 30, what="the backlog")
        assert got == [b"%d" % i for i in range(5)]
    finally:
        a.close()


def _commits(a: EmbeddedAdapter) -> list[int]:
    """A counter of the engine's COMMITs from now on (SQLite's statement trace)."""
    engine = a._engine
    assert engine is not None
    n = [0]

    def trace(sql: str) -> None:
        if sql.strip().upper() == "COMMIT":
            n[0] += 1

    engine.conn.set_trace_callback(trace)
    return n


def test_a_first_start_makes_its_durable_subscriptions_in_few_transactions(
    store: Path,
) -> None:
    """A start on a new middleware directory makes every durable subscription: while
    restoring they share transactions (one per 1,000), yet what is published during the
    restore reaches them, and every one of them is kept (reopened after the close)."""
    url = f"embedded://{store}"
    a = EmbeddedAdapter(url)
    a.open()
    got: list[bytes] = []
    try:
        commits = _commits(a)
        a.restoring()
        for i in range(EMPTY):
            a.subscription(_spec(f"n{i:04d}", "quiet"))
        assert commits[0] <= 2  # a transaction each before: 1,000
        during = a.subscription(_spec("during", "d"))
        during.start(lambda m: (got.append(m.body), m.ack()))
        a.publish_many([_msg("d", b"during")])  # commits the shared transaction first
        a.subscription(_spec("after-publish", "d"))
        a.restored()
        wait_until(lambda: got, 30, what="the message published during the restore")
        assert got == [b"during"]
    finally:
        a.close()
    b = EmbeddedAdapter(url)
    b.open()
    try:
        names = set(b.subscription_names() or [])
        assert {f"n{i:04d}" for i in range(EMPTY)} | {"during", "after-publish"} <= names
    finally:
        b.close()


def test_subscriptions_made_while_restoring_are_kept_by_a_close_before_restored(
    store: Path,
) -> None:
    """A start that fails half way (no ``restored``): the close commits what was made."""
    url = f"embedded://{store}"
    a = EmbeddedAdapter(url)
    a.open()
    a.restoring()
    for i in range(10):
        a.subscription(_spec(f"h{i}", "t"))
    a.close()
    b = EmbeddedAdapter(url)
    b.open()
    try:
        assert {f"h{i}" for i in range(10)} <= set(b.subscription_names() or [])
        h = b.subscription(_spec("h3", "t"))
        b.publish_many([_msg("t", b"x")])
        assert h.depth() == 1
    finally:
        b.close()


class _FailingCommit:
    """The engine's connection, whose next COMMIT fails (as on a full disk)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.armed = True

    def execute(self, sql: str, *args: object) -> sqlite3.Cursor:
        if self.armed and sql == "COMMIT":
            self.armed = False
            raise sqlite3.OperationalError("database or disk is full")
        return self.conn.execute(sql, *args)

    def __getattr__(self, name: str) -> object:
        return getattr(self.conn, name)


def test_a_failed_shared_commit_fails_the_restore_and_forgets_its_subscriptions(
    store: Path,
) -> None:
    """Nothing is taken for made that is not committed: ``restored`` raises (the start
    fails), the rolled-back subscriptions are forgotten, and an attach makes them again."""
    url = f"embedded://{store}"
    a = EmbeddedAdapter(url)
    a.open()
    try:
        engine = a._engine
        assert engine is not None
        real = engine.conn
        a.restoring()
        for i in range(5):
            a.subscription(_spec(f"f{i}", "t"))
        engine.conn = _FailingCommit(real)  # type: ignore[assignment]
        with pytest.raises(AdapterError, match="not committed"):
            a.restored()
        engine.conn = real
        assert not {f"f{i}" for i in range(5)} & set(a.subscription_names() or [])
        h = a.subscription(_spec("f2", "t"))
        a.publish_many([_msg("t", b"x")])
        assert h.depth() == 1
    finally:
        a.close()
    b = EmbeddedAdapter(url)
    b.open()
    try:
        assert b.subscription_names() == ["f2"]
    finally:
        b.close()
