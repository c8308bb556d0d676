"""What a log-based middleware offers the cursor engine (``adapters.logbase.engine``).

A log-based middleware (Kafka, RabbitMQ streams, the local test log) stores messages in
append-only *streams* (a Kafka topic partition) and lets readers start anywhere.  The
cursor engine turns that into the adapter contract's durable subscriptions: every
subscription is a *cursor* (a position per stream), served by a bounded number of readers
whatever the number of subscriptions.  A backend implements the four protocols below;
the engine does the rest (dispatch, in-order settling, pause, catch-up, persistence).

Streams are named ``(log, partition)``: ``log`` is the middleware's name of the log (a
Kafka topic name), ``partition`` its partition number.  Offsets grow within a stream and
need not be contiguous (Kafka compaction and transaction markers leave gaps).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable

from wsnmom.core.adapter import SharedMessage
from wsnmom.topic_mapping.model import PathPattern, Topic

__all__ = [
    "EARLIEST",
    "HeadReader",
    "LogBackend",
    "LogReader",
    "LogRecord",
    "PositionStore",
    "RecordsLost",
    "SaveCut",
    "SelectiveHeadReader",
    "StreamId",
]

#: (log name, partition)
StreamId = tuple[str, int]

#: an offset meaning "the first record the stream still holds" (``LogReader.assign``)
EARLIEST = -2


#: what a lazily converted record loads on first use: body, headers, media type, timestamp
Details = tuple[bytes, Mapping[str, str], str, "datetime | None"]


class LogRecord:
    """One record of a stream, with the canonical topic the backend derived for it.

    The details (``body``, ``headers``, ``content_type``, ``timestamp``) are given at once
    or by a ``details`` function called on first use: a head reader reads every record the
    gateway follows, and a record no cursor wants is never looked at beyond its stream,
    offset and topic (converting every record was ~40 % of the gateway's Python time under
    100-message Notifies with nobody subscribed, on Kafka)."""

    __slots__ = (
        "_body",
        "_content_type",
        "_details",
        "_headers",
        "_shared",
        "_timestamp",
        "offset",
        "stream",
        "topic",
    )

    def __init__(
        self,
        stream: StreamId,
        offset: int,
        topic: Topic,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
        content_type: str = "application/xml",
        timestamp: datetime | None = None,
        *,
        details: Callable[[], Details] | None = None,
    ) -> None:
        self.stream = stream
        self.offset = offset
        self.topic = topic
        self._body = body
        self._headers: Mapping[str, str] = headers if headers is not None else {}
        self._content_type = content_type
        #: when the middleware stored it (UTC), None when unknown
        self._timestamp = timestamp
        self._details = details
        self._shared: SharedMessage | None = None

    @property
    def shared(self) -> SharedMessage:
        """What every cursor's copy of this record shares (``Received.shared``): the
        head and a catch-up reader hand one record object to every cursor it is for."""
        shared = self._shared
        if shared is None:  # two threads at once may make two: each still correct
            shared = self._shared = SharedMessage()
        return shared

    def _load(self) -> None:
        details, self._details = self._details, None
        if details is not None:
            self._body, self._headers, self._content_type, self._timestamp = details()

    @property
    def body(self) -> bytes:
        """The record's value."""
        if self._details is not None:
            self._load()
        return self._body

    @property
    def headers(self) -> Mapping[str, str]:
        """The record's headers (the media type's header taken out)."""
        if self._details is not None:
            self._load()
        return self._headers

    @property
    def content_type(self) -> str:
        """The body's media type."""
        if self._details is not None:
            self._load()
        return self._content_type

    @property
    def timestamp(self) -> datetime | None:
        """When the middleware stored it (UTC), None when unknown."""
        if self._details is not None:
            self._load()
        return self._timestamp

    def _key(self) -> tuple[object, ...]:
        return (
            self.stream,
            self.offset,
            self.topic,
            self.body,
            dict(self.headers),
            self.content_type,
            self.timestamp,
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LogRecord) and self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"LogRecord({self.stream}@{self.offset} {self.topic})"


@dataclass(frozen=True, slots=True)
class RecordsLost:
    """A reader asked for offsets the stream no longer holds (retention deleted them).

    ``first`` is the offset asked for, ``next`` the first offset the stream still holds;
    the reader continues from ``next``.
    """

    stream: StreamId
    first: int
    next: int


class LogReader(Protocol):
    """A reader the engine points at chosen positions (Kafka: a consumer with ``assign``,
    no group, auto commit off).  Used by one thread at a time."""

    def assign(self, positions: Mapping[StreamId, int]) -> None:
        """Read exactly these streams, each from the given offset (replaces the previous
        assignment; an empty mapping stops reading).  ``EARLIEST`` reads from the first
        record the stream still holds, without reporting ``RecordsLost``."""

    def poll(self, max_records: int, timeout: float) -> Sequence[LogRecord | RecordsLost]:
        """Up to ``max_records`` records, in offset order within each stream, waiting up to
        ``timeout`` seconds for the first; an empty result means nothing more now."""

    def close(self) -> None:
        """Release the reader."""


class HeadReader(Protocol):
    """The reader that follows the end of every stream the gateway maps (Kafka: one
    consumer in the gateway's own group, subscribed by pattern).  Used by one thread."""

    def poll(self, max_records: int, timeout: float) -> Sequence[LogRecord | RecordsLost]:
        """The next records at the end of the streams (see ``LogReader.poll``)."""

    def positions(self) -> dict[StreamId, int]:
        """The next offset (>= 0) this reader will return for each stream it follows now.

        A stream the reader starts following later (a log created after it started) is
        read from its beginning, so nothing published on it is missed; its position is
        then its first offset (0 for a new log)."""

    def commit(self, positions: Mapping[StreamId, int]) -> None:
        """Remember where following resumes after a restart (below every unsettled record
        of the cursors that ride on the head)."""

    def close(self) -> None:
        """Release the reader."""


@runtime_checkable
class SelectiveHeadReader(HeadReader, Protocol):
    """A head reader that can leave out records no cursor wants (Kafka: the gateway
    reads its own publishes back, and building a record for each one nobody subscribed
    to was the head's main cost under 100-message Notifies)."""

    def set_interest(self, wanted: Callable[[Topic], bool]) -> None:
        """From now on ``poll`` may leave out a record whose topic ``wanted`` says no to,
        except the newest of each topic and stream in each answer (the engine's head
        position advances with it, and the backend may look at it).  ``wanted`` is
        called from the polling thread, at most once per topic and answer."""

    def more_waiting(self) -> bool:
        """Whether the last ``poll`` took ``max_records`` records from the middleware
        (more may be waiting), whatever it left out: the engine's "the head reached the
        end" test, which the length of a filtered answer cannot give."""


class SaveCut(Exception):
    """A position save that the adapter's close cut short before the middleware answered.
    Not a failure of the save: the close saves every cursor's position again itself (and
    says so if that fails)."""


class PositionStore(Protocol):
    """Where cursors that left the head keep their positions (Kafka: one consumer group
    per cursor, so the usual tools show each subscription's lag).  Thread-safe."""

    def load(self) -> dict[str, dict[StreamId, int]]:
        """Every stored cursor's positions, by cursor name."""

    def load_one(self, name: str) -> dict[StreamId, int] | None:
        """One cursor's stored positions (None: none stored)."""

    def save(self, changes: Mapping[str, Mapping[StreamId, int]]) -> None:
        """Store these cursors' positions (replacing the streams named; others kept).
        Raises :class:`SaveCut` when the adapter's close ended the wait for the answer."""

    def delete(self, names: Iterable[str]) -> None:
        """Forget these cursors; unknown names are ignored."""


class LogBackend(Protocol):
    """A log-based middleware as the cursor engine sees it."""

    def head_reader(self) -> HeadReader:
        """A reader following every stream the gateway maps, from where the last
        ``HeadReader.commit`` left it (at first start: the current end of each stream)."""

    def reader(self) -> LogReader:
        """A new reader for catching up from chosen positions."""

    def position_store(self) -> PositionStore:
        """Where cursors keep their positions."""

    def end_positions(self) -> dict[StreamId, int] | None:
        """The exact current end (next offset) of every stream, or None when the
        middleware cannot tell cheaply and reliably (the engine then waits for its head
        reader to reach the end instead).  Used to start a new cursor exactly at the
        end, so it gets nothing published before it was created."""

    def may_carry(self, log: str, patterns: tuple[PathPattern, ...] | None) -> bool:
        """Whether log ``log`` can hold a record matching ``patterns`` (None: any
        non-internal topic), so a cursor needs to read it.  May say True too often (the
        engine matches each record's topic), never too rarely."""
