"""What the parts of the cursor engine share: :class:`EngineParts` declares the engine's
state and the methods one part calls on another, so each part (a module of one job:
:mod:`.subscriptions`, :mod:`.head`, :mod:`.catch_up`, :mod:`.commits`, :mod:`.burial`,
:mod:`.backlog`, :mod:`.peeking`) type-checks on its own;
:class:`wsnmom.adapters.logbase.engine.CursorEngine` combines them, sets the state up and
starts, stops and settles cursors."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from wsnmom.topic_mapping.index import TopicIndex
from wsnmom.topic_mapping.model import Topic

from .backend import HeadReader, LogBackend, PositionStore, RecordsLost, StreamId

if TYPE_CHECKING:
    from .cursor import Cursor


class EngineParts:
    """The state of one cursor engine (set up by ``CursorEngine.__init__``, where each is
    described) and the methods its parts call on each other (declared here for the type
    checker only)."""

    backend: LogBackend
    catch_up_readers: int
    batch: int
    poll_timeout: float
    commit_interval: float
    pin_seconds: float
    pin_records: int
    save_interval: float
    bury_retry_first: float
    bury_retry_max: float
    catch_up_slice: int
    catch_up_group: int
    _drains: int
    shared: bool
    may_save: Callable[[str], bool] | None
    lock: threading.RLock
    _cursors: dict[str, Cursor]
    _index: TopicIndex[str]
    _match_all: set[str]
    _head: dict[StreamId, int]
    _stored: dict[str, dict[StreamId, int]]
    _to_delete: set[str]
    _catch_up: queue.SimpleQueue[Cursor | None]
    _store: PositionStore | None
    _head_reader: HeadReader | None
    _threads: list[threading.Thread]
    _running: bool
    _dispatching: bool
    _hold: bool
    _head_started: threading.Event
    _refused: set[Topic]
    _attached_meanwhile: set[str]
    _sync_asked: int
    _sync_done: int
    _sync_cv: threading.Condition
    #: notified after every position save (landed or not): ``purge`` waits on it
    _saved_cv: threading.Condition
    purge_timeout: float
    _wake_commit: threading.Event
    _last_head_commit: float
    _last_head_positions: dict[StreamId, int]
    _since_head_commit: int
    _own_save: set[str]
    _own_saved_at: dict[str, float]
    _pinning: set[str]
    _bury_retry: dict[str, float]
    _bury_failed: int

    if TYPE_CHECKING:

        def may_pin(self, name: str) -> None: ...
        def settle(
            self, cursor: Cursor, stream: StreamId, offset: int, gen: int, rewind: bool
        ) -> None: ...
        def _relevant(self, cursor: Cursor, stream: StreamId) -> bool: ...
        def stop_cursor(self, cursor: Cursor) -> None: ...
        def delete_subscription(self, name: str) -> None: ...
        def _queue_catch_up(self, cursor: Cursor, *, skipping: bool = False) -> None: ...
        def _detach_at(self, cursor: Cursor, stream: StreamId, offset: int) -> None: ...
        def _lost(self, cursor: Cursor, item: RecordsLost) -> None: ...
        def _retry_bury(self, cursor: Cursor) -> None: ...
        def _queue_due_buries(self) -> None: ...
        def _stream_restarted(self, stream: StreamId, start: int) -> None: ...
        def _maybe_commit_head(self, head: HeadReader) -> None: ...
        def _start_head(self) -> None: ...
        def _sync_head_locked(self, timeout: float) -> None: ...
        def _ends_at_least(self, exact: dict[StreamId, int] | None) -> dict[StreamId, int]: ...
        def _assignment(self, cursor: Cursor) -> dict[StreamId, int]: ...
