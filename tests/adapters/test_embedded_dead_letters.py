"""Embedded store: what a subscription's limits drop goes to its dead-letter topic
(``SubscriptionSpec.dead_letters``) in the transaction that drops it.

The conformance kit (``DroppedToDeadLetters``) checks the contract on every adapter; these
are the store's own edge cases: drops inside one ``publish_many`` batch (the batch's
message ids are assigned ahead, and the dead letters must not take them), ``drop_newest``
(the arriving message is the one dropped), a dead-letter topic that survives a restart, a
transaction that fails (nothing half dead-lettered), and many expired at once.
"""

from __future__ import annotations

import sqlite3
import uuid
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from wsnmom.adapters.embedded import EmbeddedAdapter
from wsnmom.core.adapter import (
    HEADER_DROPPED_AT,
    HEADER_DROPPED_ATTEMPTS,
    HEADER_DROPPED_FROM,
    HEADER_DROPPED_REASON,
    HEADER_TOPIC_PATH,
    INTERNAL_NAMESPACE_PREFIX,
    OutboundMessage,
    Overflow,
    QueueLimits,
    SubscriptionHandle,
    SubscriptionSpec,
)
from wsnmom.topic_mapping.model import PathPattern, Topic

from tests.support.clock import EMBEDDED_ENGINE, later

NS = "urn:wsnmom:test:embedded-dead-letters"
PATTERNS = (PathPattern(NS, ("t",)),)
GRAVE = Topic(INTERNAL_NAMESPACE_PREFIX + "dead-letters", ("test",))


def msg(body: bytes) -> OutboundMessage:
    return OutboundMessage(Topic(NS, ("t",)), body, uuid.uuid4().hex)


def box(adapter: EmbeddedAdapter) -> SubscriptionHandle:
    return adapter.subscription(
        SubscriptionSpec("box", (PathPattern(GRAVE.namespace, GRAVE.path),))
    )


def bounded(adapter: EmbeddedAdapter, limits: QueueLimits, name: str = "sub") -> SubscriptionHandle:
    return adapter.subscription(SubscriptionSpec(name, PATTERNS, limits, dead_letters=GRAVE))


def test_drops_within_one_batch_keep_every_message(adapter: EmbeddedAdapter) -> None:
    graves = box(adapter)
    sub = bounded(adapter, QueueLimits(max_messages=2))
    adapter.publish_many([msg(b"%d" % i) for i in range(6)])
    adapter.publish_many([msg(b"6"), msg(b"7")])  # ids assigned after the dead letters
    assert [m.body for m in sub.pull(10)] == [b"6", b"7"]
    dropped = graves.pull(10)
    assert [m.body for m in dropped] == [b"%d" % i for i in range(6)]
    assert {m.headers[HEADER_DROPPED_REASON] for m in dropped} == {"overflow"}
    assert {m.headers[HEADER_DROPPED_FROM] for m in dropped} == {"sub"}
    assert {m.headers[HEADER_TOPIC_PATH] for m in dropped} == {"t"}
    assert all(m.topic == GRAVE for m in dropped)


def test_drop_newest_dead_letters_the_arriving_message(adapter: EmbeddedAdapter) -> None:
    graves = box(adapter)
    sub = bounded(adapter, QueueLimits(max_messages=1, overflow=Overflow.DROP_NEWEST))
    adapter.publish_many([msg(b"kept"), msg(b"refused-1")])
    adapter.publish(msg(b"refused-2"))
    assert [m.body for m in sub.pull(10)] == [b"kept"]
    assert [m.body for m in graves.pull(10)] == [b"refused-1", b"refused-2"]


def test_many_expired_at_once_are_all_dead_lettered(
    adapter: EmbeddedAdapter, monkeypatch: pytest.MonkeyPatch
) -> None:
    graves = box(adapter)
    # the clock moves 10 s on below; 5 s, not 0.3 s, of real time keeps what is published
    # after it fresh until it is taken, on a loaded machine too
    sub = bounded(adapter, QueueLimits(max_age=timedelta(seconds=5)))
    adapter.publish_many([msg(b"old-%d" % i) for i in range(600)])  # > 2 expiry chunks
    later(monkeypatch, EMBEDDED_ENGINE, 10)
    adapter.publish(msg(b"new"))
    assert [m.body for m in sub.pull(10)] == [b"new"]
    assert graves.depth() == 600
    first = graves.pull(1)[0]
    assert first.body == b"old-0" and first.headers[HEADER_DROPPED_REASON] == "max-age"


def test_without_a_topic_nothing_is_kept(adapter: EmbeddedAdapter) -> None:
    graves = box(adapter)
    sub = adapter.subscription(SubscriptionSpec("plain", PATTERNS, QueueLimits(max_messages=1)))
    adapter.publish_many([msg(b"a"), msg(b"b")])
    assert [m.body for m in sub.pull(10)] == [b"b"]
    assert graves.depth() == 0


def test_the_dead_letter_topic_survives_a_restart(store: Path) -> None:
    first = EmbeddedAdapter(f"embedded://{store}")
    first.open()
    box(first)
    bounded(first, QueueLimits(max_messages=1))
    first.close()
    again = EmbeddedAdapter(f"embedded://{store}")
    again.open()
    try:
        # nothing re-attached the subscription yet: its topic came from the store
        again.publish_many([msg(b"a"), msg(b"b")])
        assert [m.body for m in box(again).pull(10)] == [b"a"]
    finally:
        again.close()


def test_a_failed_transaction_dead_letters_nothing(
    adapter: EmbeddedAdapter, monkeypatch: pytest.MonkeyPatch
) -> None:
    graves = box(adapter)
    sub = bounded(adapter, QueueLimits(max_messages=1))
    adapter.publish(msg(b"a"))
    engine = adapter._require()
    real = engine._inter

    def broken(c: sqlite3.Connection, woken: set[int]) -> None:
        real(c, woken)
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(engine, "_inter", broken)
    with pytest.raises(Exception, match="disk I/O"):
        adapter.publish(msg(b"b"))
    monkeypatch.setattr(engine, "_inter", real)
    assert graves.depth() == 0  # rolled back with the drop
    adapter.publish(msg(b"c"))  # and nothing left over is written by the next one
    assert [m.body for m in sub.pull(10)] == [b"c"]
    assert [m.body for m in graves.pull(10)] == [b"a"]


def test_a_message_handed_out_before_counts_its_attempts(
    adapter: EmbeddedAdapter, monkeypatch: pytest.MonkeyPatch
) -> None:
    graves = box(adapter)
    sub = bounded(adapter, QueueLimits(max_age=timedelta(seconds=5)))
    adapter.publish_many([msg(b"tried"), msg(b"untried")])
    [first] = sub.pull(1)
    first.nack(requeue=True)  # handed out once, back in the queue
    later(monkeypatch, EMBEDDED_ENGINE, 10)
    assert sub.pull(10) == []  # both expired on the way
    dropped = {m.body: m.headers for m in graves.pull(10)}
    assert dropped[b"tried"][HEADER_DROPPED_ATTEMPTS] == "1"
    assert HEADER_DROPPED_ATTEMPTS not in dropped[b"untried"]
    at = datetime.fromisoformat(dropped[b"tried"][HEADER_DROPPED_AT])
    assert at.tzinfo is not None
