"""The cursor engine (adapters/logbase) through the file-log adapter: the paths the
conformance kit does not reach (window-full detach and re-attach, streams that appear
while a cursor is behind, rewinds, in-order commits, limits by discard, retention losses,
the restore hold, crash recovery of attached and detached cursors, bounded threads)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from wsnmom.adapters.filelog.adapter import FileLogAdapter
from wsnmom.core.adapter import (
    OutboundMessage,
    QueueLimits,
    Received,
    SubscriptionHandle,
    SubscriptionSpec,
)
from wsnmom.topic_mapping.model import DEEP, PathPattern, Topic

from tests.support.waiting import wait_until
from wsnmom.testing.conformance import Collector

NS = "urn:test:logbase"


def topic(path: str, ns: str = NS) -> Topic:
    return Topic(ns, tuple(path.split("/")))


def msg(path: str, body: bytes, ns: str = NS) -> OutboundMessage:
    return OutboundMessage(topic=topic(path, ns), body=body, message_id=uuid.uuid4().hex)


def spec(name: str, *paths: str, ns: str = NS) -> SubscriptionSpec:
    patterns = tuple(PathPattern(ns, tuple(p.split("/"))) for p in paths) or None
    return SubscriptionSpec(name=name, patterns=patterns, limits=QueueLimits())


def wait(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    wait_until(cond, timeout, what="the engine's state")


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., FileLogAdapter]]:
    made: list[FileLogAdapter] = []

    def factory(**options: object) -> FileLogAdapter:
        query = "&".join(f"{k}={v}" for k, v in options.items())
        adapter = FileLogAdapter(f"filelog://{tmp_path / 'log'}" + (f"?{query}" if query else ""))
        adapter.open()
        made.append(adapter)
        return adapter

    yield factory
    for adapter in reversed(made):
        adapter.close()


def bodies(got: list[Received]) -> list[bytes]:
    return [m.body for m in got]


def test_window_full_detaches_and_catches_up_in_order(make: Callable[..., FileLogAdapter]) -> None:
    adapter = make(partitions=1)
    handle = adapter.subscription(spec("s", "t"))
    got = Collector(ack=False)
    handle.start(got, prefetch=3)
    witness = adapter.subscription(spec("witness", "t"))  # the barrier
    seen = Collector()
    witness.start(seen)
    adapter.publish_many([msg("t", b"%d" % i) for i in range(20)])
    adapter.publish(msg("t", b"sentinel"))
    seen.wait_for(21, 5)  # the head has passed every message
    assert len(got.received) == 3  # the window holds
    delivered = 0
    while delivered < 21:
        batch = got.wait_for(delivered + 1, 5)[delivered:]
        assert batch, f"stalled after {delivered}"
        for m in batch:
            m.ack()
        delivered += len(batch)
    assert bodies(got.received) == [b"%d" % i for i in range(20)] + [b"sentinel"]
    wait(lambda: adapter.stats()["attached"] == 2)  # back on the head, beside the witness


def test_stream_created_while_behind_is_read_from_its_start(
    make: Callable[..., FileLogAdapter],
) -> None:
    adapter = make()
    handle = adapter.subscription(SubscriptionSpec("all", None, QueueLimits()))
    got = Collector()
    handle.start(got)
    handle.stop()  # detached, behind
    other = f"{NS}:later"
    adapter.publish(msg("x", b"old-ns"))
    adapter.publish(msg("y", b"new-ns", ns=other))
    handle.start(got)
    got.wait_for(2, 5)
    assert sorted(bodies(got.received)) == [b"new-ns", b"old-ns"]


def test_acks_commit_a_contiguous_prefix_only(make: Callable[..., FileLogAdapter]) -> None:
    first = make(partitions=1)
    handle = first.subscription(spec("p", "t"))
    got = Collector(ack=False)
    handle.start(got)
    first.publish_many([msg("t", b"%d" % i) for i in range(4)])
    got.wait_for(4, 5)
    got.received[1].ack()
    got.received[3].ack()  # 0 and 2 unsettled: nothing past 0 may be committed
    first.close()
    second = make(partitions=1)
    again = Collector()
    second.subscription(spec("p", "t")).start(again)
    again.wait_for(4, 5)
    second.publish(msg("t", b"sentinel"))  # the barrier: nothing more before it
    again.wait_for(5, 5)
    # at-least-once: everything from the first unsettled record comes again, in order
    assert bodies(again.received) == [b"0", b"1", b"2", b"3", b"sentinel"]


def test_nack_requeue_rewinds_and_later_ones_come_again(
    make: Callable[..., FileLogAdapter],
) -> None:
    adapter = make(partitions=1)
    handle = adapter.subscription(spec("r", "t"))
    got = Collector(ack=False)
    handle.start(got)
    adapter.publish_many([msg("t", b"%d" % i) for i in range(3)])
    got.wait_for(3, 5)
    got.received[0].ack()
    got.received[1].nack(requeue=True)
    got.wait_for(5, 5)
    again = got.received[3:5]
    assert bodies(again) == [b"1", b"2"]
    assert all(m.redelivered for m in again)


def test_discard_oldest_and_newest_while_paused(make: Callable[..., FileLogAdapter]) -> None:
    adapter = make(partitions=1)
    oldest = adapter.subscription(spec("old", "t"))
    newest = adapter.subscription(spec("new", "t"))
    for h in (oldest, newest):
        h.start(Collector())
        h.stop()
    adapter.publish_many([msg("t", b"%d" % i) for i in range(10)])
    # the depth follows the head reader, which reads what was just published
    wait(lambda: oldest.depth() == 10 and newest.depth() == 10)
    assert oldest.discard(6) == 6
    assert newest.discard(6, newest=True) == 6
    assert oldest.depth() == 4 and newest.depth() == 4
    adapter.publish(msg("t", b"later"))  # arrives after the limit was applied: kept
    got_old, got_new = Collector(), Collector()
    oldest.start(got_old)
    newest.start(got_new)
    got_old.wait_for(5, 5)
    got_new.wait_for(5, 5)
    adapter.publish(msg("t", b"sentinel"))  # the barrier: nothing more before it
    got_old.wait_for(6, 5)
    got_new.wait_for(6, 5)
    assert bodies(got_old.received) == [b"6", b"7", b"8", b"9", b"later", b"sentinel"]
    assert bodies(got_new.received) == [b"0", b"1", b"2", b"3", b"later", b"sentinel"]


def test_peek_reads_what_waits_and_moves_nothing(make: Callable[..., FileLogAdapter]) -> None:
    """``peek`` of a paused cursor: only its topic's records of a shared stream, the oldest
    ``discard`` will skip left out; the cursor's depth and what it delivers afterwards are
    as if nobody had looked.  A cursor riding on the head has nothing waiting."""
    adapter = make(partitions=1)
    handle = adapter.subscription(spec("paused", "t"))
    rider = adapter.subscription(spec("rider", "t"))
    handle.start(Collector())
    handle.stop()
    seen = Collector()
    rider.start(seen)
    adapter.publish_many([msg("t" if i % 2 else "other", b"%d" % i) for i in range(10)])
    seen.wait_for(5, 5)
    wait(lambda: handle.depth() == 10)  # an estimate: the stream carries "other" too
    assert [m.body for m in handle.peek(10)] == [b"1", b"3", b"5", b"7", b"9"]
    assert all(m.topic == topic("t") and m.timestamp is not None for m in handle.peek(10))
    assert [m.body for m in handle.peek(2)] == [b"1", b"3"]
    assert handle.depth() == 10
    assert handle.discard(2) == 2
    assert [m.body for m in handle.peek(10)] == [b"5", b"7", b"9"]
    assert rider.peek(10) == []
    got = Collector()
    handle.start(got)
    got.wait_for(3, 5)
    adapter.publish(msg("t", b"sentinel"))  # the barrier: nothing more before it
    got.wait_for(4, 5)
    assert bodies(got.received) == [b"5", b"7", b"9", b"sentinel"]


def test_retention_losses_are_counted(make: Callable[..., FileLogAdapter]) -> None:
    adapter = make(partitions=1, retention=5)
    handle = adapter.subscription(spec("slow", "t"))
    handle.start(Collector())
    handle.stop()
    adapter.publish_many([msg("t", b"%d" % i) for i in range(12)])
    got = Collector()
    handle.start(got)
    got.wait_for(5, 5)
    adapter.publish(msg("t", b"sentinel"))  # the barrier: nothing more before it
    got.wait_for(6, 5)
    assert bodies(got.received) == [b"%d" % i for i in range(7, 12)] + [b"sentinel"]
    assert handle.lost() == 7


def test_restore_hold_keeps_the_head_until_restored(make: Callable[..., FileLogAdapter]) -> None:
    adapter = make(partitions=1)
    adapter.restoring()
    adapter.publish(msg("t", b"while-restoring"))
    handle = adapter.subscription(spec("rider", "t"))  # no stored positions: rides the head
    got = Collector()
    handle.start(got)
    assert got.received == []  # held: no head loop runs while restoring
    adapter.restored()
    # the barrier: a head that had moved on would have put the rider after the first message
    adapter.publish(msg("t", b"sentinel"))
    got.wait_for(2, 5)
    assert bodies(got.received) == [b"while-restoring", b"sentinel"]


def test_many_cursors_bounded_threads(make: Callable[..., FileLogAdapter]) -> None:
    adapter = make(partitions=2)
    before = threading.active_count()
    handles: list[SubscriptionHandle] = []
    collectors = []
    for i in range(2000):
        h = adapter.subscription(
            SubscriptionSpec(f"c{i}", (PathPattern(NS, ("t", DEEP)),), QueueLimits())
        )
        c = Collector()
        h.start(c)
        handles.append(h)
        collectors.append(c)
    adapter.publish(msg("t/x", b"fan"))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not all(c.received for c in collectors):
        time.sleep(0.05)
    assert all(bodies(c.received) == [b"fan"] for c in collectors)
    # head + catch-up readers + committer, whatever the number of cursors
    assert threading.active_count() - before <= 8
    assert adapter.stats()["attached"] == 2000
    # settled and riding on the head: the commit passes (every 0.2 s) stop looking at them
    wait(lambda: adapter.stats()["pinning"] == 0, 5.0)


_CRASH_SCRIPT = textwrap.dedent(
    """
    import os, sys, time, uuid
    from wsnmom.adapters.filelog.adapter import FileLogAdapter
    from wsnmom.core.adapter import OutboundMessage, QueueLimits, SubscriptionSpec
    from wsnmom.testing.conformance import Collector
    from wsnmom.topic_mapping.model import PathPattern, Topic
    NS = "urn:test:logbase"
    a = FileLogAdapter("filelog://" + sys.argv[1] + "?partitions=1")
    a.open()
    a.restoring()
    rider = a.subscription(SubscriptionSpec("rider", (PathPattern(NS, ("t",)),), QueueLimits()))
    paused = a.subscription(SubscriptionSpec("paused", (PathPattern(NS, ("t",)),), QueueLimits()))
    a.restored()
    got = Collector(ack=False)
    rider.start(got)
    paused.start(Collector())
    paused.stop()
    time.sleep(0.5)  # the paused cursor's positions are saved
    for i in range(6):
        a.publish(OutboundMessage(Topic(NS, ("t",)), b"%d" % i, uuid.uuid4().hex))
    got.wait_for(6, 5)
    for m in got.received[:3]:
        m.ack()
    time.sleep(0.5)  # the head commit moves past the acked ones
    print("ready", flush=True)
    os.kill(os.getpid(), 9)
    """
)


def test_crash_recovery_of_riders_and_paused_cursors(tmp_path: Path) -> None:
    log_dir = tmp_path / "log"
    proc = subprocess.run(
        [sys.executable, "-c", _CRASH_SCRIPT, str(log_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "ready" in proc.stdout, proc.stderr
    adapter = FileLogAdapter(f"filelog://{log_dir}?partitions=1")
    adapter.open()
    try:
        adapter.restoring()
        rider = adapter.subscription(spec("rider", "t"))
        paused = adapter.subscription(spec("paused", "t"))
        adapter.restored()
        got_rider, got_paused = Collector(), Collector()
        rider.start(got_rider)
        paused.start(got_paused)
        got_rider.wait_for(3, 5)
        got_paused.wait_for(6, 5)
        adapter.publish(msg("t", b"sentinel"))  # the barrier: nothing more before it
        got_rider.wait_for(4, 5)
        got_paused.wait_for(7, 5)
        # the rider resumes after its acked prefix; the paused cursor from its saved place
        assert bodies(got_rider.received) == [b"3", b"4", b"5", b"sentinel"]
        assert bodies(got_paused.received) == [b"%d" % i for i in range(6)] + [b"sentinel"]
    finally:
        adapter.close()


# --------------------------------------------------------------------------- a log re-created


class _MemoryLog:
    """An in-memory log whose streams can be re-created (emptied, offsets from 0).  A
    stream carries the topic its log is named after: ``("u", 0)`` carries topic ``u``."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.records: dict[tuple[str, int], list[Any]] = {}
        self.epoch: dict[tuple[str, int], int] = {}

    def append(self, stream: tuple[str, int], body: bytes) -> None:
        from wsnmom.adapters.logbase.backend import LogRecord

        with self.cond:
            records = self.records.setdefault(stream, [])
            records.append(
                LogRecord(stream, len(records), topic(stream[0]), body, {}, "application/xml", None)
            )
            self.cond.notify_all()

    def recreate(self, stream: tuple[str, int]) -> None:
        with self.cond:
            self.records[stream] = []
            self.epoch[stream] = self.epoch.get(stream, 0) + 1
            self.cond.notify_all()


class _MemoryReader:
    def __init__(self, log: _MemoryLog, follow: bool) -> None:
        self.log = log
        self.follow = follow
        self.pos: dict[tuple[str, int], int] = {}
        self.seen_epoch: dict[tuple[str, int], int] = {}
        if follow:
            with log.cond:
                self.pos = {s: len(r) for s, r in log.records.items()}
                self.seen_epoch = dict(log.epoch)

    def assign(self, positions: Any) -> None:
        self.pos = {s: max(0, o) for s, o in positions.items()}
        self.seen_epoch = dict(self.log.epoch)

    def poll(self, max_records: int, timeout: float) -> list[Any]:
        from wsnmom.adapters.logbase.backend import RecordsLost

        with self.log.cond:
            if self.follow:
                for s in self.log.records:
                    self.pos.setdefault(s, 0)
            out: list[Any] = []
            for s, p in list(self.pos.items()):
                records = self.log.records.get(s, [])
                if self.log.epoch.get(s, 0) != self.seen_epoch.get(s, 0):
                    self.seen_epoch[s] = self.log.epoch.get(s, 0)
                    out.append(RecordsLost(s, p, 0))  # the log starts again below us
                    self.pos[s] = p = 0
                out.extend(records[p : p + max_records])
                self.pos[s] = p + len(records[p : p + max_records])
            if not out:
                self.log.cond.wait(timeout)
            return out

    def positions(self) -> dict[tuple[str, int], int]:
        return dict(self.pos)

    def commit(self, positions: Any) -> None:
        return None

    def close(self) -> None:
        return None


class _MemoryStore:
    def load(self) -> dict[str, Any]:
        return {}

    def save(self, changes: Any) -> None:
        return None

    def delete(self, names: Any) -> None:
        return None


class _MemoryBackend:
    def __init__(self, log: _MemoryLog) -> None:
        self.log = log

    def head_reader(self) -> _MemoryReader:
        return _MemoryReader(self.log, follow=True)

    def reader(self) -> _MemoryReader:
        return _MemoryReader(self.log, follow=False)

    def position_store(self) -> _MemoryStore:
        return _MemoryStore()

    def end_positions(self) -> None:
        return None

    def may_carry(self, log: str, patterns: Any) -> bool:
        return True


def test_a_recreated_log_is_read_again_from_its_start() -> None:
    from wsnmom.adapters.logbase.engine import CursorEngine

    log = _MemoryLog()
    stream = ("t", 0)
    engine = CursorEngine(_MemoryBackend(log), catch_up_readers=1)  # type: ignore[arg-type]
    engine.start()
    try:
        riding = engine.subscription(spec("riding", "t"))
        paused = engine.subscription(spec("paused", "t"))
        got, got_paused = Collector(), Collector()
        riding.start(got)
        paused.start(got_paused)
        for i in range(5):
            log.append(stream, b"old%d" % i)
        got.wait_for(5, 5)
        got_paused.wait_for(5, 5)
        riding.stop()  # back on the head through a catch-up: it now has a floor at 5
        riding.start(got)
        wait(lambda: engine.stats()["attached"] == 2)
        paused.stop()  # behind, at position 5
        log.recreate(stream)
        time.sleep(0.3)
        log.append(stream, b"new0")
        log.append(stream, b"new1")
        got.wait_for(7, 5)
        paused.start(got_paused)
        got_paused.wait_for(7, 5)
        assert bodies(got.received)[5:] == [b"new0", b"new1"]
        assert bodies(got_paused.received)[5:] == [b"new0", b"new1"]
    finally:
        engine.close()


def test_an_unsettled_record_of_an_attached_cursor_holds_the_heads_commit() -> None:
    """Not shared, an attached cursor has no positions of its own: the head's commit (where
    the head resumes after a crash) stays at its first unsettled record, when it attached
    at once and when it attached again after a stop."""
    from wsnmom.adapters.logbase.engine import CursorEngine

    log = _MemoryLog()
    stream = ("t", 0)
    engine = CursorEngine(_MemoryBackend(log), catch_up_readers=1)  # type: ignore[arg-type]
    engine.start()

    def head_commit() -> int:
        with engine.lock:
            return engine._head_commit_positions()[stream]

    try:
        riding = engine.subscription(spec("riding", "t"))
        got = Collector(ack=False)
        riding.start(got)
        log.append(stream, b"0")
        log.append(stream, b"1")
        got.wait_for(2, 5)
        assert engine.stats()["attached"] == 1
        assert head_commit() == 0
        for m in got.received:
            m.ack()
        wait(lambda: head_commit() == 2)
        riding.stop()  # detached
        again = Collector(ack=False)
        riding.start(again)
        wait(lambda: engine.stats()["attached"] == 1)  # back on the head
        log.append(stream, b"2")
        again.wait_for(1, 5)
        assert head_commit() == 2
    finally:
        engine.close()


class _SelectiveReader(_MemoryReader):
    """A head reader that asks the engine which topics a cursor wants."""

    def __init__(self, log: _MemoryLog) -> None:
        super().__init__(log, follow=True)
        self.wanted: Callable[[Topic], bool] | None = None

    def set_interest(self, wanted: Callable[[Topic], bool]) -> None:
        self.wanted = wanted

    def more_waiting(self) -> bool:
        return False


def test_the_engine_tells_a_selective_head_which_topics_cursors_want() -> None:
    from wsnmom.adapters.logbase.engine import CursorEngine

    head = _SelectiveReader(_MemoryLog())
    backend = _MemoryBackend(head.log)
    backend.head_reader = lambda: head  # type: ignore[method-assign]
    engine = CursorEngine(backend, catch_up_readers=1)  # type: ignore[arg-type]
    engine.start()
    try:
        wanted = head.wanted
        assert wanted is not None
        assert not wanted(topic("t"))
        engine.subscription(spec("a", "t"))
        assert wanted(topic("t")) and not wanted(topic("u"))
        engine.delete_subscription("a")
        assert not wanted(topic("t"))
        engine.subscription(spec("all"))  # no topic filter: every topic is wanted
        assert wanted(topic("u"))
    finally:
        engine.close()
