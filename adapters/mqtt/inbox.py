"""What the MQTT session's network callbacks and its worker share: the records the
callbacks put in the worker's FIFO besides messages, the session's counters, and
:class:`SessionParts`, the state both sides read (see :mod:`.session`)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from wsnmom.adapters.embedded.store import Engine

from .config import MqttSettings
from .filters import FilterSet
from .link import Link
from .mapping import MqttMapping
from .state import SessionState
from .taps import Taps


@dataclass(frozen=True, slots=True)
class _Retire:
    """Unsubscribe these (filter, identifier) pairs now, unless effective again (worker)."""

    items: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class _Acked:
    """The broker acknowledged a filter (state update, worker)."""

    filter: str
    sid: int


@dataclass(frozen=True, slots=True)
class _Removed:
    """The broker acknowledged an UNSUBSCRIBE (state update, worker)."""

    filter: str
    sid: int


@dataclass(frozen=True, slots=True)
class _Connected:
    """A CONNACK: resubscribe what the broker does not have (worker)."""

    session_present: bool
    first: bool


@dataclass(frozen=True, slots=True)
class _SentinelRefused:
    """The broker refused the sentinel topic (a SUBACK or PUBACK failure): fall back to
    UNSUBACK barriers (worker)."""

    reason: str


@dataclass(eq=False)
class _Barrier:
    """An action the worker runs when everything the broker queued for the session
    before the barrier's sentinel has been stored."""

    action: Callable[[], Any]
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None


@dataclass(eq=False)
class _After:
    """Filters to retire once every filter in ``waiting`` is acknowledged."""

    waiting: set[tuple[str, int]]
    retire: tuple[tuple[str, int], ...]


@dataclass
class SessionStats:
    """Counters for tests and metrics."""

    received: int = 0
    committed: int = 0
    dropped_retained: int = 0
    dropped_twins: int = 0
    dropped_qos0: int = 0
    batches: int = 0
    refused_filters: dict[str, str] = field(default_factory=dict)


_STOP = object()


def _nothing() -> None:
    return None


class SessionParts:
    """The state of one :class:`~wsnmom.adapters.mqtt.session.Session` (set up by its
    ``__init__``, where each is described) and the methods its worker calls on the
    subscribing side (declared here for the type checker only)."""

    settings: MqttSettings
    engine: Engine | None
    taps: Taps
    mapping: MqttMapping
    state: SessionState
    filters: FilterSet
    link: Link
    stats: SessionStats
    _stored: dict[str, int]
    _lock: threading.Lock
    _cv: threading.Condition
    _inbox: queue.SimpleQueue[Any]
    _generation: int
    _sub_mids: dict[int, tuple[str, int]]
    _unsub_mids: dict[int, tuple[str, int]]
    _pending_sub: dict[str, int]
    _pending_unsub: dict[str, int]
    _after: list[_After]
    sentinel_topic: str
    _barriers: dict[bytes, _Barrier]
    _unacked_barriers: list[_Barrier]
    _previous: tuple[frozenset[int], tuple[Any, ...]] | None
    _ids: bool
    _last_warning: float
    _worker: threading.Thread | None
    _stopping: bool
    _first: bool
    _reconciled: bool
    _resubscribed: bool

    if TYPE_CHECKING:

        def _send_subscribe(self, f: str, sid: int) -> None: ...
        def _send_unsubscribe(self, f: str, sid: int) -> None: ...
        def _send_barrier(self, barrier: _Barrier) -> None: ...
        def _sentinel_refused(self, reason: str) -> None: ...
