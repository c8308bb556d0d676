"""The cursor engine's crash bound (adapters/logbase/engine.py): a cursor that keeps records
unsettled (a pull point nobody reads) no longer holds the head's commit back beyond
``pin_seconds``; it saves positions of its own instead, refreshes them as it settles, and
drops them once it has nothing unsettled.  On an in-memory log, with the commits and
saves recorded."""

from __future__ import annotations

import threading
from typing import Any

from wsnmom.adapters.logbase.engine import CursorEngine

from tests.adapters.test_logbase_engine import (
    _MemoryBackend,
    _MemoryLog,
    _MemoryReader,
    spec,
    wait,
)
from wsnmom.testing.conformance import Collector

STREAM = ("t", 0)


class _Recorded:
    """What the engine committed for the head and saved or deleted per cursor."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.head: dict[tuple[str, int], int] = {}
        self.saved: dict[str, dict[tuple[str, int], int]] = {}
        self.deleted: list[str] = []


class _RecordingHead(_MemoryReader):
    def __init__(self, log: _MemoryLog, recorded: _Recorded) -> None:
        super().__init__(log, follow=True)
        self.recorded = recorded

    def commit(self, positions: Any) -> None:
        with self.recorded.lock:
            self.recorded.head.update(positions)


class _RecordingStore:
    def __init__(self, recorded: _Recorded) -> None:
        self.recorded = recorded

    def load(self) -> dict[str, Any]:
        return {}

    def save(self, changes: Any) -> None:
        with self.recorded.lock:
            for name, positions in changes.items():
                self.recorded.saved[name] = dict(positions)

    def delete(self, names: Any) -> None:
        with self.recorded.lock:
            for name in names:
                self.recorded.saved.pop(name, None)
                self.recorded.deleted.append(name)


def test_an_unsettled_cursor_stops_holding_the_head_commit_back() -> None:
    log, recorded = _MemoryLog(), _Recorded()
    backend = _MemoryBackend(log)
    backend.head_reader = lambda: _RecordingHead(log, recorded)  # type: ignore[method-assign]
    backend.position_store = lambda: _RecordingStore(recorded)  # type: ignore[method-assign]
    engine = CursorEngine(
        backend,  # type: ignore[arg-type]
        catch_up_readers=1,
        commit_interval=0.05,
        pin_seconds=0.2,
        save_interval=0.1,
    )
    engine.start()
    try:
        prompt, holding = Collector(), Collector(ack=False)
        engine.subscription(spec("prompt", "t")).start(prompt, prefetch=100)
        engine.subscription(spec("holding", "t")).start(holding, prefetch=100)
        for i in range(10):
            log.append(STREAM, b"%d" % i)
        prompt.wait_for(10, 5)
        holding.wait_for(10, 5)
        # the holding cursor saves its first unsettled position and the head commits past it
        wait(lambda: recorded.saved.get("holding") == {STREAM: 0})
        wait(lambda: recorded.head.get(STREAM) == 10)
        assert engine.stats()["attached"] == 2  # nobody detached for it
        # settling moves its saved position, within save_interval
        for received in holding.received[:4]:
            received.ack()
        wait(lambda: recorded.saved.get("holding") == {STREAM: 4})
        assert recorded.head.get(STREAM) == 10
        # all settled: its own positions are dropped, the head's commit covers it again
        for received in holding.received[4:]:
            received.ack()
        wait(lambda: "holding" in recorded.deleted)
        assert "holding" not in recorded.saved
        assert "prompt" not in recorded.saved  # a cursor that settles promptly saves nothing
    finally:
        engine.close()


def test_the_head_commits_after_pin_records_even_within_commit_interval() -> None:
    log, recorded = _MemoryLog(), _Recorded()
    backend = _MemoryBackend(log)
    backend.head_reader = lambda: _RecordingHead(log, recorded)  # type: ignore[method-assign]
    backend.position_store = lambda: _RecordingStore(recorded)  # type: ignore[method-assign]
    # a commit interval far beyond the test: only the record count can trigger the commit
    engine = CursorEngine(
        backend,  # type: ignore[arg-type]
        catch_up_readers=1,
        commit_interval=3600,
        pin_records=50,
    )
    engine.start()
    try:
        got = Collector()
        engine.subscription(spec("s", "t")).start(got, prefetch=1000)
        engine._last_head_commit = float("inf")  # the first commit, too, by count only
        for i in range(120):
            log.append(STREAM, b"%d" % i)
        got.wait_for(120, 5)
        wait(lambda: recorded.head.get(STREAM, 0) >= 50)
    finally:
        engine.close()
