"""A cursor that attaches while the selective head reads a stream for the first time
(adapters/logbase/head.py, catch_up.py ``_at_head``): its stored positions name no
position in that stream, meaning "read it from its start", and it must get every record
of it, including those the head left out because no cursor wanted their topic when it
asked."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from wsnmom.adapters.logbase.backend import LogRecord
from wsnmom.adapters.logbase.engine import CursorEngine
from wsnmom.topic_mapping.model import Topic

from tests.adapters.test_logbase_engine import _MemoryBackend, _MemoryLog, _MemoryReader, spec
from wsnmom.testing.conformance import Collector

STREAM = ("t", 0)
WAIT = 10.0


class _FilteringHead(_MemoryReader):
    """A selective head that leaves out what no cursor wants (all but the newest record
    of each topic and stream in an answer), and can be held after it asked, before it
    answers (``hold``): the moment a cursor may be made and started in between."""

    def __init__(self, log: _MemoryLog) -> None:
        super().__init__(log, follow=True)
        self.wanted: Callable[[Topic], bool] | None = None
        self.hold = threading.Event()
        self.asked = threading.Event()
        self.go = threading.Event()

    def set_interest(self, wanted: Callable[[Topic], bool]) -> None:
        self.wanted = wanted

    def more_waiting(self) -> bool:
        return False

    def poll(self, max_records: int, timeout: float) -> list[Any]:
        out = super().poll(max_records, timeout)
        wanted = self.wanted
        assert wanted is not None
        newest: dict[tuple[Topic, Any], int] = {}
        for index, item in enumerate(out):
            if isinstance(item, LogRecord):
                newest[(item.topic, item.stream)] = index
        kept = [
            item
            for index, item in enumerate(out)
            if not isinstance(item, LogRecord)
            or wanted(item.topic)
            or newest[(item.topic, item.stream)] == index
        ]
        if out and self.hold.is_set():
            self.hold.clear()
            self.asked.set()
            assert self.go.wait(WAIT)
        return kept


class _StoredStore:
    """A position store holding one cursor, ``s``, with no position in any stream."""

    def load(self) -> dict[str, Any]:
        return {"s": {}}

    def load_one(self, name: str) -> dict[Any, int] | None:
        return {} if name == "s" else None

    def save(self, changes: Any) -> None:
        return None

    def delete(self, names: Any) -> None:
        return None


def test_a_cursor_attaching_while_the_head_first_reads_a_stream_gets_all_of_it() -> None:
    log = _MemoryLog()
    head = _FilteringHead(log)
    backend = _MemoryBackend(log)
    backend.head_reader = lambda: head  # type: ignore[method-assign]
    backend.position_store = lambda: _StoredStore()  # type: ignore[method-assign,assignment,return-value]
    engine = CursorEngine(backend, catch_up_readers=1)  # type: ignore[arg-type]
    engine.start()
    try:
        witness = Collector()
        engine.subscription(spec("w", "w")).start(witness)  # the head runs
        head.hold.set()
        for i in range(3):
            log.append(STREAM, b"r%d" % i)
        assert head.asked.wait(WAIT)  # the head asked: nobody wants "t" yet
        got = Collector()
        engine.subscription(spec("s", "t")).start(got)  # stored: no position in STREAM
        head.go.set()
        log.append(STREAM, b"sentinel")
        received = got.wait_for_body(b"sentinel", WAIT)
        assert [m.body for m in received] == [b"r0", b"r1", b"r2", b"sentinel"]
    finally:
        head.go.set()
        engine.close()
