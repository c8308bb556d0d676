"""Embedded ``max_age`` expiry: it removes every expired message however many there are,
frees room for new ones before a bound refuses them, and reading a subscription costs the
same whatever its backlog (a scan of all ready entries on every fetch once made draining a
backlog quadratic)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta

import pytest
from wsnmom.adapters.embedded import EmbeddedAdapter
from wsnmom.core.adapter import (
    OutboundMessage,
    Overflow,
    QueueLimits,
    SubscriptionHandle,
    SubscriptionSpec,
)
from wsnmom.topic_mapping.model import PathPattern, Topic

from tests.support.clock import EMBEDDED_ENGINE, later

NS = "urn:wsnmom:test:embedded-expiry"
PATTERNS = (PathPattern(NS, ("t",)),)


def msg(body: bytes) -> OutboundMessage:
    return OutboundMessage(Topic(NS, ("t",)), body, uuid.uuid4().hex)


def test_expiry_removes_more_than_one_chunk(
    adapter: EmbeddedAdapter, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the clock moves 10 s on below; 5 s, not 0.3 s, of real time keeps what is published
    # after it fresh until it is taken, on a loaded machine too
    h = adapter.subscription(
        SubscriptionSpec("aged", PATTERNS, QueueLimits(max_age=timedelta(seconds=5)))
    )
    adapter.publish_many([msg(b"old-%d" % i) for i in range(700)])  # > 2 chunks of 256
    later(monkeypatch, EMBEDDED_ENGINE, 10)  # they are 10 s old now
    adapter.publish(msg(b"new"))
    assert h.depth() == 1
    (only,) = h.pull(10)
    assert only.body == b"new"


def test_expired_messages_make_room_before_drop_newest_refuses(
    adapter: EmbeddedAdapter, monkeypatch: pytest.MonkeyPatch
) -> None:
    limits = QueueLimits(
        max_messages=3, overflow=Overflow.DROP_NEWEST, max_age=timedelta(seconds=5)
    )
    h = adapter.subscription(SubscriptionSpec("bounded", PATTERNS, limits))
    adapter.publish_many([msg(b"old-%d" % i) for i in range(3)])
    adapter.publish(msg(b"refused"))  # full, nothing expired yet: the newest is dropped
    later(monkeypatch, EMBEDDED_ENGINE, 10)
    adapter.publish_many([msg(b"new-1"), msg(b"new-2")])
    assert [m.body for m in h.pull(10)] == [b"new-1", b"new-2"]


def test_depths_expire_each_queue_by_its_own_max_age(
    adapter: EmbeddedAdapter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One ``depths`` call over queues whose ages differ: each drops what its own
    ``max_age`` expired, a queue without one keeps everything, a queue whose oldest message
    is young keeps it, and a message taken (removal still pending) is not counted."""

    def sub(name: str, max_age: timedelta | None) -> SubscriptionHandle:
        limits = QueueLimits(max_age=max_age)
        return adapter.subscription(SubscriptionSpec(name, PATTERNS, limits))

    short = sub("short", timedelta(seconds=1))
    long = sub("long", timedelta(hours=1))
    unaged = sub("unaged", None)
    taken = sub("taken", None)
    adapter.publish_many([msg(b"old-%d" % i) for i in range(3)])
    later(monkeypatch, EMBEDDED_ENGINE, 10)  # the three are 10 s old now
    fresh = sub("fresh", timedelta(seconds=1))  # its queue starts with the young message
    adapter.publish(msg(b"new"))
    assert [m.body for m in taken.take(1)] == [b"old-0"]
    handles = [short, long, unaged, taken, fresh]
    assert adapter.depths(handles) == [1, 4, 4, 3, 1]
    assert adapter.depths(handles) == [1, 4, 4, 3, 1]  # nothing more expires on a re-read
    assert [h.depth() for h in handles] == [1, 4, 4, 3, 1]
    assert [m.body for m in short.pull(10)] == [b"new"]


def _statements(adapter: EmbeddedAdapter, action: Callable[[], object]) -> list[str]:
    """The SQL statements that ``action`` runs on the engine's connection."""
    conn = adapter._require().conn
    ran: list[str] = []
    conn.set_trace_callback(ran.append)
    try:
        action()
    finally:
        conn.set_trace_callback(None)
    return ran


def test_depths_expires_only_the_queues_whose_oldest_message_is_too_old(
    adapter: EmbeddedAdapter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``depths`` over many queues with a ``max_age`` (the admin overview's poll): the one
    whose oldest message is past its ``max_age`` is expired and counted again, the young
    ones are counted from the one grouped read, without an expiry query each; a second
    call, with nothing left to expire, writes nothing."""
    young = [
        adapter.subscription(
            SubscriptionSpec(f"young-{i}", PATTERNS, QueueLimits(max_age=timedelta(hours=1)))
        )
        for i in range(40)
    ]
    stale = adapter.subscription(
        SubscriptionSpec("stale", PATTERNS, QueueLimits(max_age=timedelta(seconds=1)))
    )
    adapter.publish_many([msg(b"a"), msg(b"b")])
    later(monkeypatch, EMBEDDED_ENGINE, 10)  # 10 s old: past ``stale``'s age only
    handles = [*young, stale]
    depths: list[int | None] = []
    ran = _statements(adapter, lambda: depths.extend(adapter.depths(handles)))
    assert depths == [2] * 40 + [0]
    expiries = [sql for sql in ran if "ORDER BY e.mid" in sql]  # ``_OLDEST_READY``
    assert len(expiries) == 1, ran  # integ's code: one per queue with a max_age (41)
    again = _statements(adapter, lambda: adapter.depths(handles))
    assert not [sql for sql in again if sql.startswith("BEGIN")], again
    assert len(again) == 1, again
    assert adapter.depths(handles) == [2] * 40 + [0]


def _vm_steps(adapter: EmbeddedAdapter, action: Callable[[], object]) -> int:
    """SQLite virtual-machine steps (in units of 10) that ``action`` costs."""
    conn = adapter._require().conn
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    conn.set_progress_handler(count, 10)
    try:
        action()
    finally:
        conn.set_progress_handler(None, 10)
    return steps


def test_reading_costs_the_same_whatever_the_backlog(adapter: EmbeddedAdapter) -> None:
    limits = QueueLimits(max_age=timedelta(days=7))  # the service's default bound
    long = adapter.subscription(SubscriptionSpec("long", PATTERNS, limits))
    for start in range(0, 20_000, 2_000):
        adapter.publish_many([msg(b"%d" % i) for i in range(start, start + 2_000)])
    short = adapter.subscription(SubscriptionSpec("short", PATTERNS, limits))
    adapter.publish_many([msg(b"x%d" % i) for i in range(200)])
    for handle in (long, short):  # warm the statement cache
        handle.pull(1)[0].ack()
    cost_short = _vm_steps(adapter, lambda: short.pull(1))
    cost_long = _vm_steps(adapter, lambda: long.pull(1))
    cost_take = _vm_steps(adapter, lambda: long.take(1))
    assert cost_short > 0
    # 20,200 queued against 200: a scan of the backlog would cost ~100 times as much
    assert max(cost_long, cost_take) < 3 * cost_short
