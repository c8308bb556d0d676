"""The cursor engine (adapters/logbase) dead-letters what ``discard`` skips, through the
file-log adapter: the oldest records and, with ``newest``, the newest ones are read and
published to the cursor's dead-letter topic (``SubscriptionSpec.dead_letters``) before
the cursor commits past them; a publish that fails leaves them held (no committed
position passes them) and is tried again later, backing off, while the cursor goes on
delivering what it keeps, once.  The conformance kit (``DroppedToDeadLetters``) checks the
oldest case on Kafka and the file log; these are the engine's own paths."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from wsnmom.adapters.filelog.adapter import FileLogAdapter
from wsnmom.core.adapter import (
    DROPPED_OVERFLOW_END,
    HEADER_DROPPED_FROM,
    HEADER_DROPPED_REASON,
    INTERNAL_NAMESPACE_PREFIX,
    AdapterUnavailable,
    OutboundMessage,
    PublishReceipt,
    QueueLimits,
    SubscriptionHandle,
    SubscriptionSpec,
)
from wsnmom.topic_mapping.model import PathPattern, Topic

from tests.support.waiting import wait_until
from wsnmom.testing.conformance import Collector

NS = "urn:test:logbase-dead-letters"
GRAVE = Topic(INTERNAL_NAMESPACE_PREFIX + "dead-letters", ("logbase",))


def msg(body: bytes) -> OutboundMessage:
    return OutboundMessage(topic=Topic(NS, ("t",)), body=body, message_id=uuid.uuid4().hex)


@pytest.fixture
def adapter(tmp_path: Path) -> Iterator[FileLogAdapter]:
    a = FileLogAdapter(f"filelog://{tmp_path / 'log'}?partitions=1")
    a.open()
    yield a
    a.close()


def paused(adapter: FileLogAdapter, name: str, count: int) -> SubscriptionHandle:
    """A paused subscription with a dead-letter topic, ``count`` messages waiting."""
    handle = adapter.subscription(
        SubscriptionSpec(name, (PathPattern(NS, ("t",)),), QueueLimits(), dead_letters=GRAVE)
    )
    handle.start(Collector())
    handle.stop()
    adapter.publish_many([msg(b"%d" % i) for i in range(count)])
    wait_until(lambda: handle.depth() == count, 5, what="the backlog")
    return handle


def grave(adapter: FileLogAdapter) -> Collector:
    box = adapter.subscription(
        SubscriptionSpec("box", (PathPattern(GRAVE.namespace, GRAVE.path),), QueueLimits())
    )
    got = Collector()
    box.start(got)
    return got


def bodies(collector: Collector) -> list[bytes]:
    return [m.body for m in collector.received]


class GraveRefusal:
    """The dead-letter topic refuses every publish while ``on`` (``adapter.publish_many``
    patched); ``tries``: when each publish to it came (``time.monotonic``)."""

    def __init__(self, adapter: FileLogAdapter) -> None:
        self.on = True
        self.tries: list[float] = []
        real = adapter.publish_many

        def refused(messages: Sequence[OutboundMessage], timeout: float = 10.0) -> Any:
            if any(m.topic == GRAVE for m in messages):
                self.tries.append(time.monotonic())
                if self.on:
                    raise RuntimeError("dead-letter topic refused")
            return real(messages, timeout)

        adapter.publish_many = refused  # type: ignore[method-assign]


def test_the_oldest_skipped_are_dead_lettered_in_order(adapter: FileLogAdapter) -> None:
    dead = grave(adapter)
    handle = paused(adapter, "old", 10)
    assert handle.discard(6) == 6
    dead.wait_for(6, 5)
    assert bodies(dead) == [b"%d" % i for i in range(6)]
    assert {m.headers[HEADER_DROPPED_REASON] for m in dead.received} == {"overflow"}
    assert {m.headers[HEADER_DROPPED_FROM] for m in dead.received} == {"old"}
    got = Collector()
    handle.start(got)
    got.wait_for(4, 5)
    adapter.publish(msg(b"sentinel"))
    got.wait_for(5, 5)
    assert bodies(got) == [b"6", b"7", b"8", b"9", b"sentinel"]


def test_the_newest_skipped_are_read_and_dead_lettered(adapter: FileLogAdapter) -> None:
    dead = grave(adapter)
    handle = paused(adapter, "new", 10)
    assert handle.discard(6, newest=True) == 6
    adapter.publish(msg(b"later"))  # arrives after the limit was applied: kept
    got = Collector()
    handle.start(got)
    got.wait_for(5, 5)
    dead.wait_for(6, 5)
    adapter.publish(msg(b"sentinel"))
    got.wait_for(6, 5)
    assert bodies(got) == [b"0", b"1", b"2", b"3", b"later", b"sentinel"]
    assert bodies(dead) == [b"%d" % i for i in range(4, 10)]
    assert {m.headers[HEADER_DROPPED_FROM] for m in dead.received} == {"new"}


def test_the_newest_skipped_are_dead_lettered_when_polls_come_back_empty(
    adapter: FileLogAdapter,
) -> None:
    """A catch-up read that finds nothing for a moment (Kafka's 20 ms poll while a fetch
    is in flight) does not make the cursor jump past the newest records it drops: each
    is still read and dead-lettered.  The file log's reader is wrapped to answer every
    second poll with nothing and the others with one record."""
    engine = adapter.cursor_engine()
    real_reader = engine.backend.reader

    class HalfEmpty:
        def __init__(self) -> None:
            self.reader = real_reader()
            self.polls = 0

        def poll(self, max_records: int, timeout: float) -> Any:
            self.polls += 1
            return [] if self.polls % 2 == 0 else self.reader.poll(1, timeout)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.reader, name)

    engine.backend.reader = HalfEmpty  # type: ignore[method-assign]
    dead = grave(adapter)
    handle = paused(adapter, "newest-empty-polls", 10)
    assert handle.discard(6, newest=True) == 6
    got = Collector()
    handle.start(got)
    dead.wait_for(6, 10)
    adapter.publish(msg(b"sentinel"))
    got.wait_for(5, 10)
    assert bodies(got) == [b"0", b"1", b"2", b"3", b"sentinel"]
    assert sorted(bodies(dead)) == [b"%d" % i for i in range(4, 10)]


def test_a_failed_publish_is_tried_again(adapter: FileLogAdapter) -> None:
    dead = grave(adapter)
    real = adapter.publish_many
    failures = [RuntimeError("the middleware refused")]
    calls: list[int] = []

    def flaky(messages: Sequence[OutboundMessage], timeout: float = 10.0) -> list[PublishReceipt]:
        if any(m.topic == GRAVE for m in messages):
            calls.append(len(messages))
            if failures:
                raise failures.pop()
        return real(messages, timeout)

    adapter.publish_many = flaky  # type: ignore[method-assign]
    handle = paused(adapter, "flaky", 5)
    assert handle.discard(3) == 3
    dead.wait_for(3, 10)
    assert len(calls) >= 2  # refused once, then published
    assert bodies(dead) == [b"0", b"1", b"2"]
    got = Collector()
    handle.start(got)
    got.wait_for(2, 5)
    adapter.publish(msg(b"sentinel"))
    got.wait_for(3, 5)
    assert bodies(got) == [b"3", b"4", b"sentinel"]


def test_a_lasting_refusal_holds_them_and_backs_off_without_redelivering(
    adapter: FileLogAdapter,
) -> None:
    """The dead-letter topic refuses every publish (an ACL, a record too large) for a
    while: the cursor does not go back to the records it dropped, so each record it keeps
    is delivered once; its committed position stays below the dropped ones; the publish is
    tried again after growing delays.  Once the topic takes them they are dead-lettered
    and the position passes them."""
    engine = adapter.cursor_engine()
    engine.bury_retry_first, engine.bury_retry_max = 0.3, 1.2
    dead = grave(adapter)
    refusal = GraveRefusal(adapter)
    handle = paused(adapter, "stuck", 10)
    assert handle.discard(3) == 3
    got = Collector()
    handle.start(got)
    got.wait_for(7, 5)
    wait_until(lambda: len(refusal.tries) >= 4, 10, what="four refused publishes")
    # each delay at least doubles the one before: 0.3, 0.6, 1.2 (the maximum)
    gaps = [b - a for a, b in itertools.pairwise(refusal.tries)]
    assert gaps[0] >= 0.3 and gaps[1] >= 0.6 and gaps[2] >= 1.2, gaps
    adapter.publish(msg(b"sentinel"))
    got.wait_for(8, 5)
    assert bodies(got) == [b"%d" % i for i in range(3, 10)] + [b"sentinel"]
    cursor = engine._cursors["stuck"]

    def resumes_from(stream: Any) -> int:
        """Where the cursor would resume after a crash: its own saved positions once it
        held the head's commit back too long, else the head's commit."""
        with engine.lock:
            if cursor.own_positions:
                return engine._stored["stuck"][stream]
            return engine._head_commit_positions()[stream]

    with engine.lock:
        [stream] = list(cursor.inflight)
        held = [offset for offset, settled in cursor.inflight[stream].items() if not settled]
        first = held[0]
        assert held == [first, first + 1, first + 2]  # the three dropped, unsettled
        assert cursor.committed(stream, engine._head[stream]) == first
        assert engine.stats()["dead_letters_unpublished"] == 3
    assert resumes_from(stream) <= first
    assert dead.received == []
    refusal.on = False
    dead.wait_for(3, 10)
    assert bodies(dead) == [b"0", b"1", b"2"]
    wait_until(lambda: not cursor.inflight, 5, what="the dead letters settled")
    assert engine.stats()["dead_letters_unpublished"] == 0
    wait_until(lambda: resumes_from(stream) >= first + 3, 5, what="the commit past them")
    adapter.publish(msg(b"after"))
    got.wait_for(9, 5)
    assert bodies(got)[-1] == b"after" and len(got.received) == 9


def test_a_lasting_refusal_does_not_stall_delivery_nor_drop_more(
    adapter: FileLogAdapter,
) -> None:
    """More records held for a refused dead-letter publish than the cursor's window
    (prefetch 2, 6 held): they do not count in it, so the records it keeps are delivered;
    while the refusal lasts a ``discard`` skips nothing; once the topic takes them, the
    held ones are dead-lettered and ``discard`` drops again."""
    engine = adapter.cursor_engine()
    engine.bury_retry_first, engine.bury_retry_max = 0.2, 0.4
    dead = grave(adapter)
    refusal = GraveRefusal(adapter)
    handle = paused(adapter, "window", 10)
    cursor = engine._cursors["window"]
    assert handle.discard(6) == 6
    wait_until(lambda: cursor.bury_failures, 5, what="a refused publish")
    wait_until(lambda: handle.depth() == 4, 5, what="six skipped")
    assert handle.discard(1) == 0  # refused meanwhile: nothing more is dropped
    got = Collector()
    handle.start(got, prefetch=2)
    got.wait_for(4, 5)
    adapter.publish_many([msg(b"a"), msg(b"b"), msg(b"c")])
    got.wait_for(7, 5)
    assert bodies(got) == [b"6", b"7", b"8", b"9", b"a", b"b", b"c"]
    with engine.lock:
        assert cursor.held_drops == 6 and cursor.unsettled == 6
    refusal.on = False
    dead.wait_for(6, 10)
    assert bodies(dead) == [b"%d" % i for i in range(6)]
    wait_until(lambda: not cursor.unsettled, 5, what="the held records settled")
    assert cursor.held_drops == 0
    handle.stop()
    adapter.publish_many([msg(b"f"), msg(b"g")])
    wait_until(lambda: handle.depth() == 2, 5, what="two waiting")
    assert handle.discard(1) == 1
    dead.wait_for(7, 5)
    assert bodies(dead)[6:] == [b"f"]
    assert bodies(got) == [b"6", b"7", b"8", b"9", b"a", b"b", b"c"]


def test_an_end_whose_publish_is_refused_keeps_the_cursor_and_succeeds_later(
    adapter: FileLogAdapter,
) -> None:
    """``delete_into_dead_letters`` while the dead-letter topic refuses: it raises and the
    cursor stays (core then goes on delivering it and tries again at the next sweep);
    tried again once the topic takes them, every record reaches the dead letters once and
    the cursor is gone."""
    engine = adapter.cursor_engine()
    engine.bury_retry_first, engine.bury_retry_max = 0.2, 0.4
    dead = grave(adapter)
    refusal = GraveRefusal(adapter)
    handle = paused(adapter, "ending", 4)
    with pytest.raises(AdapterUnavailable, match="not published"):
        handle.delete_into_dead_letters(DROPPED_OVERFLOW_END, {}, timeout=5)
    assert "ending" in engine.names()
    refusal.on = False
    # 0 when the retry of what the first end held (0.2 s later) buried all four before
    # this call, as under load in a full run; the dead letters below show the outcome
    assert 0 <= handle.delete_into_dead_letters(DROPPED_OVERFLOW_END, {}, timeout=5) <= 4
    assert "ending" not in engine.names()
    dead.wait_for(4, 5)
    adapter.publish_many([OutboundMessage(topic=GRAVE, body=b"sentinel", message_id="s")])
    dead.wait_for_body(b"sentinel", 5)
    assert sorted(bodies(dead)) == [b"0", b"1", b"2", b"3", b"sentinel"]
    # buried by the second end, or by the retry of what the first one held
    reasons = {m.headers[HEADER_DROPPED_REASON] for m in dead.received if m.body != b"sentinel"}
    assert reasons <= {DROPPED_OVERFLOW_END, "overflow"}


def test_a_stop_while_they_are_held_skips_them_again(adapter: FileLogAdapter) -> None:
    """Stopped while its dead letters are not published: what was in flight comes again
    (redelivered) and the held records are skipped again, not delivered; they are
    dead-lettered once the topic takes them."""
    engine = adapter.cursor_engine()
    engine.bury_retry_first, engine.bury_retry_max = 0.2, 0.4
    dead = grave(adapter)
    refusal = GraveRefusal(adapter)
    handle = paused(adapter, "stopped", 5)
    assert handle.discard(2) == 2
    first = Collector()
    handle.start(first)
    first.wait_for(3, 5)
    wait_until(lambda: len(refusal.tries) >= 1, 5, what="a refused publish")
    handle.stop()
    again = Collector()
    handle.start(again)
    again.wait_for(3, 5)
    wait_until(lambda: len(refusal.tries) >= 2, 5, what="the publish tried again")
    refusal.on = False
    dead.wait_for(2, 5)
    adapter.publish(msg(b"sentinel"))
    again.wait_for(4, 5)
    assert bodies(first) == [b"2", b"3", b"4"]
    assert bodies(again) == [b"2", b"3", b"4", b"sentinel"]
    assert [m.redelivered for m in again.received] == [True, True, True, False]
    assert sorted(bodies(dead)) == [b"0", b"1"]


def test_no_position_passes_them_before_the_publish_is_confirmed(
    adapter: FileLogAdapter,
) -> None:
    release = threading.Event()
    entered = threading.Event()
    real = adapter.publish_many

    def slow(messages: Sequence[OutboundMessage], timeout: float = 10.0) -> Any:
        if any(m.topic == GRAVE for m in messages):
            entered.set()
            release.wait(10)
        return real(messages, timeout)

    adapter.publish_many = slow  # type: ignore[method-assign]
    grave(adapter)
    handle = paused(adapter, "held", 4)
    engine = adapter._require().engine
    cursor = engine._cursors["held"]
    handle.discard(2)
    assert entered.wait(5)
    # read past them, but what it may commit stays at the first one until it is buried
    with engine.lock:
        [stream] = list(cursor.inflight)
        first = next(iter(cursor.inflight[stream]))
        assert cursor.positions[stream] == first + 2
        assert cursor.committed(stream, cursor.positions[stream]) == first
    release.set()
    wait_until(
        lambda: cursor.committed(stream, cursor.positions[stream]) == first + 2,
        5,
        what="the commit past the dead letters",
    )


def test_without_a_topic_they_are_skipped_unread(adapter: FileLogAdapter) -> None:
    dead = grave(adapter)
    handle = adapter.subscription(SubscriptionSpec("plain", (PathPattern(NS, ("t",)),)))
    handle.start(Collector())
    handle.stop()
    adapter.publish_many([msg(b"%d" % i) for i in range(4)])
    wait_until(lambda: handle.depth() == 4, 5, what="the backlog")
    handle.discard(3)
    got = Collector()
    handle.start(got)
    got.wait_for(1, 5)
    adapter.publish(msg(b"sentinel"))
    got.wait_for(2, 5)
    assert bodies(got) == [b"3", b"sentinel"]
    # nothing reached the dead letters before a sentinel published there now
    adapter.publish(OutboundMessage(topic=GRAVE, body=b"sentinel", message_id="s"))
    dead.wait_for_body(b"sentinel", 5)
    assert bodies(dead) == [b"sentinel"]


def test_an_end_right_after_a_publish_buries_what_the_head_has_not_read_yet(
    adapter: FileLogAdapter,
) -> None:
    """``delete_into_dead_letters`` called as soon as a publish is confirmed: every record
    published before the call is the subscription's backlog, the ones the head reader has
    not polled yet too, so each reaches the dead letters (none lost when the cursor is
    deleted)."""
    dead = grave(adapter)
    handle = adapter.subscription(
        SubscriptionSpec("racing", (PathPattern(NS, ("t",)),), QueueLimits(), dead_letters=GRAVE)
    )
    handle.start(Collector())
    handle.stop()
    for round_ in range(5):
        adapter.publish_many([msg(b"%d:%d" % (round_, i)) for i in range(200)])
    sent = handle.delete_into_dead_letters(DROPPED_OVERFLOW_END, {}, timeout=10)
    adapter.publish_many([OutboundMessage(topic=GRAVE, body=b"sentinel", message_id="s")])
    dead.wait_for_body(b"sentinel", 10)
    assert sent == 1000
    assert len(bodies(dead)) == 1001
