"""The embedded store's records: the SQL schema and statements, how subscriptions' patterns and
limits are stored, and the rows and routes the engine's parts pass each other (see
:mod:`wsnmom.adapters.embedded.store`)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from wsnmom.core.adapter import (
    HEADER_MESSAGE_ID,
    OutboundMessage,
    Overflow,
    QueueLimits,
)
from wsnmom.topic_mapping.model import ANY, DEEP, PathPattern, Segment, Topic

MEMORY = ":memory:"

#: mark one ready entry handed out
_HAND_OUT = (
    "UPDATE queue_entries SET state = 1, delivered = delivered + 1 WHERE sub = ? AND mid = ?"
)
#: a subscription's ready messages, oldest first (``fetch``; see ``_rows``)
_READY = (
    "SELECT e.mid, e.delivered, m.ns, m.path, m.body, m.headers, m.ctype, m.published "
    "FROM queue_entries e JOIN messages m ON m.id = e.mid "
    "WHERE e.sub = ? AND e.state = 0 ORDER BY e.mid LIMIT ?"
)
#: the same, after a message id (``take``: above the messages whose removal is pending)
_READY_AFTER = _READY.replace("e.state = 0", "e.state = 0 AND e.mid > ?")
_PUBLISHED = 7
_REMOVE = "DELETE FROM queue_entries WHERE sub = ? AND mid = ?"
#: a subscription's oldest ready entries after a message id, with size and publish time
_OLDEST_READY = (
    "SELECT e.mid, m.size, m.published FROM queue_entries e JOIN messages m ON m.id = e.mid "
    "WHERE e.sub = ? AND e.state = 0 AND e.mid > ? ORDER BY e.mid LIMIT ?"
)
#: every queue's ready count and the publish time of its oldest ready message (``depths``)
_HEADS = (
    "SELECT q.sub, q.n, m.published FROM (SELECT sub, count(*) AS n, min(mid) AS head "
    "FROM queue_entries WHERE state = 0 GROUP BY sub) q JOIN messages m ON m.id = q.head"
)
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS messages(
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ns TEXT NOT NULL,
    path TEXT NOT NULL,
    body BLOB NOT NULL,
    headers TEXT NOT NULL,
    ctype TEXT NOT NULL,
    msgid TEXT NOT NULL,
    size INTEGER NOT NULL,
    published REAL NOT NULL,
    refs INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS subscriptions(
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL UNIQUE,
    patterns TEXT,
    limits TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS queue_entries(
    sub INTEGER NOT NULL,
    mid INTEGER NOT NULL,
    state INTEGER NOT NULL DEFAULT 0,
    delivered INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (sub, mid)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS current(
    ns TEXT NOT NULL,
    path TEXT NOT NULL,
    mid INTEGER NOT NULL,
    body BLOB,
    headers TEXT,
    ctype TEXT,
    PRIMARY KEY (ns, path)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS outbox(
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ns TEXT NOT NULL,
    path TEXT NOT NULL,
    body BLOB NOT NULL,
    headers TEXT NOT NULL,
    ctype TEXT NOT NULL,
    msgid TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS stranded(
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ns TEXT NOT NULL,
    path TEXT NOT NULL,
    body BLOB NOT NULL,
    headers TEXT NOT NULL,
    ctype TEXT NOT NULL,
    msgid TEXT NOT NULL,
    since REAL NOT NULL
);
"""

#: 2: ``current`` can hold its message inline (``mid`` 0); a version 1 database gets the
#: three columns on open (its rows all reference ``messages`` and stay valid).
#: 3: the ``stranded`` table (dead letters whose topic had no queue), made on open
_SCHEMA_VERSION = "3"
#: the ``current.mid`` of a message held inline in its ``current`` row
_INLINE = 0


# --------------------------------------------------------------------------- encoding


def encode_patterns(patterns: tuple[PathPattern, ...] | None) -> str | None:
    """Patterns as JSON: ``[[ns, [seg, ...]], ...]``; wildcards as ``"*"`` / ``"**"``."""
    if patterns is None:
        return None
    return json.dumps([[p.namespace, [_seg(s) for s in p.segments]] for p in patterns])


def _seg(s: Segment) -> str:
    return s if isinstance(s, str) else s.value


def decode_patterns(text: str | None) -> tuple[PathPattern, ...] | None:
    """Inverse of :func:`encode_patterns` (NCNames are never ``*`` or ``**``)."""
    if text is None:
        return None
    out: list[PathPattern] = []
    for ns, segs in json.loads(text):
        decoded: list[Segment] = []
        for s in segs:
            decoded.append(ANY if s == ANY.value else DEEP if s == DEEP.value else s)
        out.append(PathPattern(ns, tuple(decoded)))
    return tuple(out)


def encode_limits(limits: QueueLimits, dead_letters: Topic | None = None) -> str:
    """QueueLimits as JSON (max_age in seconds), with the subscription's dead-letter topic
    (``SubscriptionSpec.dead_letters``) when it has one."""
    return json.dumps(
        {
            **(
                {"dead_letters": [dead_letters.namespace, list(dead_letters.path)]}
                if dead_letters is not None
                else {}
            ),
            "max_messages": limits.max_messages,
            "max_bytes": limits.max_bytes,
            "overflow": limits.overflow.value,
            "max_age": limits.max_age.total_seconds() if limits.max_age is not None else None,
        }
    )


def decode_limits(text: str) -> QueueLimits:
    """Inverse of :func:`encode_limits`."""
    raw = json.loads(text)
    age = raw.get("max_age")
    return QueueLimits(
        max_messages=raw.get("max_messages"),
        max_bytes=raw.get("max_bytes"),
        overflow=Overflow(raw.get("overflow", Overflow.DROP_OLDEST.value)),
        max_age=timedelta(seconds=age) if age is not None else None,
    )


def decode_dead_letters(text: str) -> Topic | None:
    """The dead-letter topic :func:`encode_limits` stored with the limits, if any."""
    raw = json.loads(text).get("dead_letters")
    return Topic(raw[0], tuple(raw[1])) if raw else None


def _topic_key(topic: Topic) -> str:
    return "/".join(topic.path)


#: the columns of a dead letter waiting outside the queues (the ``outbox`` and
#: ``stranded`` tables): :func:`letter_values` writes them, :func:`letter_of` reads them
LETTER_COLUMNS = "ns, path, body, headers, ctype, msgid"


def letter_values(m: OutboundMessage) -> tuple[str, str, bytes, str, str, str]:
    """The :data:`LETTER_COLUMNS` of dead letter ``m``."""
    return (
        m.topic.namespace,
        _topic_key(m.topic),
        m.body,
        json.dumps(dict(m.headers)),
        m.content_type,
        m.message_id,
    )


def letter_of(
    ns: str, path: str, body: bytes, headers: str, ctype: str, msgid: str
) -> OutboundMessage:
    """The dead letter of a row's :data:`LETTER_COLUMNS`."""
    return OutboundMessage(
        topic=Topic(ns, tuple(path.split("/"))),
        body=bytes(body),
        message_id=msgid,
        headers=json.loads(headers),
        content_type=ctype,
    )


# --------------------------------------------------------------------------- records


@dataclass(slots=True)
class SubState:
    """In-memory view of one durable subscription."""

    id: int
    name: str
    patterns: tuple[PathPattern, ...] | None
    limits: QueueLimits
    #: entries and bytes held (ready + handed out); tracked only when a count/byte bound
    #: exists, otherwise None
    count: int | None = None
    bytes: int | None = None
    #: the highest message id handed out by ``take``: removals up to it may still be
    #: pending, so the next take starts above it
    taken_upto: int = 0
    #: where what its limits drop goes (``SubscriptionSpec.dead_letters``); None: nowhere
    dead_letters: Topic | None = None

    @property
    def bounded(self) -> bool:
        return self.limits.max_messages is not None or self.limits.max_bytes is not None


@dataclass(frozen=True, slots=True)
class Row:
    """One message handed out from a subscription."""

    sub: int
    mid: int
    topic: Topic
    body: bytes
    headers: dict[str, str]
    content_type: str
    redelivered: bool


def _rows(sid: int, selected: Sequence[tuple[Any, ...]]) -> list[Row]:
    """:class:`Row` objects of ``selected`` rows of the ``_READY`` query."""
    return [
        Row(
            sub=sid,
            mid=mid,
            topic=Topic(ns, tuple(path.split("/"))),
            body=bytes(body),
            headers=json.loads(headers),
            content_type=ctype,
            redelivered=delivered > 0,
        )
        for mid, delivered, ns, path, body, headers, ctype, _published in selected
    ]


@dataclass(frozen=True, slots=True)
class _Route:
    """Where the messages of one topic go in one ``publish_many`` batch."""

    namespace: str
    #: the topic path as stored (``_topic_key``)
    key: str
    #: the current-message slot ``(namespace, key)``; None for internal topics
    slot: tuple[str, str] | None
    #: receiving subscription ids, in the order they are served
    targets: list[int]
    fanout: int


class _HeadersJson:
    """The stored JSON of a message's headers (the message id added when missing), for the
    messages of one ``publish_many`` batch.

    Core's messages carry the message id first and then headers that are the same for
    every message of a Notify (``core.codec.encode``); the JSON of that common part is
    made once and the id put in front of it, which gives the same text as
    ``json.dumps`` of the whole headers.  Anything else is dumped as it is.
    """

    __slots__ = ("rest", "tail")

    def __init__(self) -> None:
        #: the headers after the message id of the last message, and their JSON after "{"
        self.rest: list[tuple[str, str]] | None = None
        self.tail = ""

    def __call__(self, m: OutboundMessage) -> str:
        headers = m.headers
        if type(headers) is dict and len(headers) > 1:
            items = list(headers.items())
            if items[0][0] == HEADER_MESSAGE_ID:
                rest = items[1:]
                if rest != self.rest:
                    self.rest = rest
                    self.tail = json.dumps(dict(rest))[1:]
                return _ID_JSON + json.dumps(items[0][1]) + ", " + self.tail
        full = dict(headers)
        full.setdefault(HEADER_MESSAGE_ID, m.message_id)
        return json.dumps(full)


_ID_JSON = "{" + json.dumps(HEADER_MESSAGE_ID) + ": "


_SET_CURRENT = (
    "INSERT OR REPLACE INTO current(ns, path, mid, body, headers, ctype) VALUES (?, ?, ?, ?, ?, ?)"
)

_INSERT_MESSAGE = (
    "INSERT INTO messages(id, ns, path, body, headers, ctype, msgid, size, published, refs) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def _execute_rows(c: sqlite3.Connection, sql: str, rows: Sequence[tuple[Any, ...]]) -> None:
    """``executemany``, or ``execute`` for a single row (cheaper: no iterator protocol)."""
    if len(rows) == 1:
        c.execute(sql, rows[0])
    else:
        c.executemany(sql, rows)


def next_message_id(c: sqlite3.Connection) -> int:
    """The id the next inserted message would get (AUTOINCREMENT: above every id ever
    used); only the engine's connection writes, under ``Engine.lock``."""
    row = c.execute(
        "SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'messages'), 0), "
        "coalesce((SELECT max(id) FROM messages), 0))"
    ).fetchone()
    return int(row[0]) + 1


def write_rows(
    c: sqlite3.Connection,
    message_rows: list[tuple[Any, ...]],
    entry_rows: list[tuple[int, int]],
) -> None:
    """Insert the pending ``messages`` and ``queue_entries`` rows and clear the lists."""
    if message_rows:
        _execute_rows(c, _INSERT_MESSAGE, message_rows)
        message_rows.clear()
    if entry_rows:
        _execute_rows(c, "INSERT INTO queue_entries(sub, mid) VALUES (?, ?)", entry_rows)
        entry_rows.clear()


def release(c: sqlite3.Connection, mid: int) -> None:
    """``decref`` of one message: the same outcome, and one statement instead of two
    when this was its last reference (the usual case of a replaced current message)."""
    if not c.execute("DELETE FROM messages WHERE id = ? AND refs <= 1", (mid,)).rowcount:
        c.execute("UPDATE messages SET refs = refs - 1 WHERE id = ?", (mid,))


def decref(c: sqlite3.Connection, mids: Iterable[int]) -> None:
    """Drop one reference to each of the messages ``mids``; delete those left with none."""
    params = [(m,) for m in mids]
    if not params:
        return
    _execute_rows(c, "UPDATE messages SET refs = refs - 1 WHERE id = ?", params)
    _execute_rows(c, "DELETE FROM messages WHERE id = ? AND refs <= 0", params)
