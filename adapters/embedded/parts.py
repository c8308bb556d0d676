"""What the parts of the embedded engine share: :class:`EngineParts` declares the engine's
state and the methods one part calls on another, so each part (a module of one job:
:mod:`.storage`, :mod:`.subscriptions`, :mod:`.publish`, :mod:`.queues`, :mod:`.limits`,
:mod:`.dead_letters`, :mod:`.outbox`, :mod:`.dispatch`) type-checks on its own;
:class:`wsnmom.adapters.embedded.store.Engine` combines them and sets the state up."""

from __future__ import annotations

import collections
import sqlite3
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from wsnmom.core.adapter import OutboundMessage
from wsnmom.topic_mapping.index import TopicIndex
from wsnmom.topic_mapping.model import Topic

from .records import SubState

if TYPE_CHECKING:
    from wsnmom.adapters.dir_lock import DirectoryLock
    from wsnmom.adapters.embedded.adapter import EmbeddedHandle


class EngineParts:
    """The state of one engine (set up by ``Engine.__init__``) and the methods its parts
    call on each other (declared here for the type checker only)."""

    path: str
    memory: bool
    users: int
    #: the connection; used only under ``lock``
    lock: threading.RLock
    conn: sqlite3.Connection
    _closed: bool
    _db_file: str
    _dir_lock: DirectoryLock | None
    _stop_checkpoints: threading.Event
    _checkpointer: threading.Thread | None
    #: acked (sub, mid) rows not yet deleted (:mod:`.storage`)
    _pending_acks: list[tuple[int, int]]
    #: subscriptions (:mod:`.subscriptions`)
    index: TopicIndex[int]
    match_all: set[int]
    subs: dict[int, SubState]
    by_name: dict[str, int]
    started: collections.defaultdict[int, set[EmbeddedHandle]]
    #: publishing (:mod:`.publish`)
    keep_current: bool
    _next_mid: int | None
    _current_mids: dict[tuple[str, str], int]
    #: dead letters and the outbox (:mod:`.dead_letters`, :mod:`.outbox`)
    outbox: Callable[[Topic], bool] | None
    on_outbox: Callable[[], None] | None
    _outboxed: bool
    #: ``Outbox.outbox_park`` runs: dead letters go to the queues here, not the outbox
    _parking: bool
    _graves: list[OutboundMessage]
    _interred: bool
    #: the ``stranded`` table may hold rows (:mod:`.dead_letters`)
    _stranded: bool
    #: the dispatcher and pull waiters (:mod:`.dispatch`)
    _cv: threading.Condition
    _ready: collections.deque[EmbeddedHandle]
    _queued: set[EmbeddedHandle]
    _dispatcher: threading.Thread | None
    #: ``restoring`` calls not yet ended by ``restored`` (:mod:`.dispatch`)
    _holding: int
    #: new subscriptions inserted in the restore's open transaction (None: none open) and
    #: why the last such transaction failed (:mod:`.subscriptions`, :mod:`.storage`)
    _batch: list[SubState] | None
    _batch_error: BaseException | None
    _arrival: threading.Condition
    _arrivals: int

    if TYPE_CHECKING:

        def tx(self) -> AbstractContextManager[sqlite3.Connection]: ...
        def flush_acks(self) -> None: ...
        def end_batch(self) -> None: ...
        def _abort_batch(self) -> None: ...
        def _forget(self, batch: list[SubState]) -> None: ...
        def targets(self, topic: Topic) -> set[int]: ...
        def _count(self, st: SubState) -> None: ...
        def _wake(self, sids: Iterable[int]) -> None: ...
        def _kick(self) -> None: ...
        def waiting(self) -> set[int]: ...
        def _expire(self, st: SubState) -> None: ...
        def _head_expired(self, st: SubState, rows: Sequence[tuple[object, ...]]) -> bool: ...
        def _make_room(self, st: SubState, size: int) -> bool: ...
        def _enforce_limits(self, st: SubState) -> None: ...
        def _bury(
            self,
            st: SubState,
            mids: Sequence[int],
            reason: str,
            context: Mapping[str, str] | None = None,
        ) -> None: ...
        def _grave(
            self,
            st: SubState,
            m: OutboundMessage,
            headers: dict[str, str],
            reason: str,
            delivered: int = 0,
        ) -> None: ...
        def _inter(self, c: sqlite3.Connection, woken: set[int]) -> None: ...
        def _to_outbox(self, c: sqlite3.Connection, m: OutboundMessage) -> None: ...
        def _release_stranded(self) -> int: ...
