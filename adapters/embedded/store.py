"""The embedded middleware engine: SQLite storage, topic routing and push dispatch.

One :class:`Engine` exists per database (per directory) and per process; every
``EmbeddedAdapter`` opened on the same directory shares it.  A second *process* opening the
same directory is refused (an advisory ``flock`` on ``PATH/wsnmom.lock``), because routing
state — the subscription index — lives in the owning process.

Storage layout (one SQLite database, ``PATH/embedded.sqlite3``)::

    messages(id, ns, path, body, headers, ctype, msgid, size, published, refs)
    subscriptions(id, name UNIQUE, patterns, limits)
    queue_entries(sub, mid, state, delivered)   PRIMARY KEY (sub, mid), WITHOUT ROWID
    current(ns, path, mid, body, headers, ctype) the retained message per topic (not internal ones)
    outbox(id, ns, path, body, headers, ctype, msgid) dead letters another middleware is to get

The ``outbox`` is empty unless the engine is made with ``outbox``: the MQTT adapter's queue
store writes there the dead letters its limits drop (in the transaction that drops them),
publishes them to the broker and deletes them once the broker confirmed them.

A published message is stored once; fan-out adds one narrow ``queue_entries`` row per
receiving subscription.  ``messages.refs`` counts the rows (plus the ``current`` row) that
reference a message and the message is deleted when it drops to zero.  A message that no
subscription receives is not put in ``messages`` at all: its ``current`` row holds it
(``mid`` 0, body, headers and content type inline), so publishing on a topic without
subscribers writes one row instead of inserting a message and deleting the one it
replaces.  ``mid`` grows
monotonically (AUTOINCREMENT), so ordering a subscription's rows by ``mid`` is FIFO and a
requeued message goes back to its original place.  ``state`` is 0 (ready) or 1 (handed
out, unsettled); ``delivered`` counts hand-outs and drives ``redelivered``.  On open every
handed-out row returns to ready: that is how unacked messages survive a crash.

Durability: WAL journal.  ``synchronous=NORMAL`` (default) makes every commit survive a
crash of the process (SIGKILL included) but the last commits may be lost on power failure
or an OS crash; ``synchronous=FULL`` fsyncs every commit and survives those too.  WAL
checkpoints run on a thread and connection of their own every half second
(``Engine._checkpoint_loop``), never inside a commit.

Concurrency: one connection, used only under ``Engine.lock``; each operation is one
transaction (``publish_many`` writes its whole batch in one transaction).  Push delivery
runs on one dispatcher thread per engine that serves started handles round-robin and
never holds the database lock while it calls ``on_message``.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from wsnmom.core.adapter import (
    DROPPED_MAX_AGE,
    DROPPED_OVERFLOW,
    HEADER_DROPPED_AT,
    HEADER_DROPPED_ATTEMPTS,
    HEADER_DROPPED_FROM,
    HEADER_DROPPED_REASON,
    HEADER_MESSAGE_ID,
    HEADER_TOPIC_NAMESPACE,
    HEADER_TOPIC_PATH,
    AdapterError,
    AdapterUnavailable,
    OutboundMessage,
    Overflow,
    QueueLimits,
    StoredMessage,
    is_internal_namespace,
)
from wsnmom.core.sqlite_space import JOURNAL_LIMIT, reclaimable, vacuum_step
from wsnmom.topic_mapping.index import TopicIndex
from wsnmom.topic_mapping.model import ANY, DEEP, PathPattern, Segment, Topic

try:  # pragma: no cover - platform dependent
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from wsnmom.adapters.embedded.adapter import EmbeddedHandle

log = logging.getLogger(__name__)

DB_FILE = "embedded.sqlite3"
LOCK_FILE = "wsnmom.lock"
MEMORY = ":memory:"

#: largest batch the dispatcher fetches for one handle in one transaction
_FETCH_BATCH = 256
#: pending acks that force an immediate commit
_ACK_BATCH = 512
#: seconds acks may wait for others to share their commit
_ACK_DELAY = 0.002
#: seconds between WAL checkpoints (``Engine._checkpoint_loop``)
_CHECKPOINT_INTERVAL = 0.5
#: incremental-vacuum steps per checkpoint interval at most (of VACUUM_STEP pages each)
_VACUUM_STEPS = 16
#: WAL pages (4 KiB) after which a commit checkpoints itself
_WAL_BACKSTOP_PAGES = 4096

#: topics whose current message id ``Engine`` remembers (beyond: forget them all)
_CURRENT_MIDS_MAX = 4096

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
#: entries ``_expire`` reads per query
_EXPIRE_CHUNK = 256

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
"""

#: 2: ``current`` can hold its message inline (``mid`` 0); a version 1 database gets the
#: three columns on open (its rows all reference ``messages`` and stay valid)
_SCHEMA_VERSION = "2"
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


# --------------------------------------------------------------------------- engine


class Engine:
    """Shared state of one embedded database; see the module docstring."""

    def __init__(
        self,
        path: str,
        *,
        synchronous: str = "NORMAL",
        keep_current: bool = True,
        outbox: Callable[[Topic], bool] | None = None,
    ) -> None:
        self.path = path
        #: which dead-letter topics go to the ``outbox`` table instead of the queues (the
        #: MQTT adapter: those it publishes to the broker, :meth:`outbox_batch`); None: none
        self.outbox = outbox
        #: called after a transaction that wrote to the outbox committed
        self.on_outbox: Callable[[], None] | None = None
        self._outboxed = False
        #: :meth:`outbox_park` runs: dead letters go to the queues here, not the outbox
        self._parking = False
        #: keep the current message per topic (``current`` table); False for a queue store
        #: whose middleware keeps it elsewhere (the MQTT adapter: the broker's retained
        #: messages)
        self.keep_current = keep_current
        self.memory = path == MEMORY
        self.lock = threading.RLock()
        #: messages a limit dropped in the current transaction, for their subscriptions'
        #: dead-letter topics (:meth:`_bury`, written by :meth:`_inter` before the commit)
        self._graves: list[OutboundMessage] = []
        #: dead letters were written since ``publish_many`` last learnt the next message id
        self._interred = False
        self.users = 0
        self._lock_fd: int | None = None
        #: acked (sub, mid) rows not yet deleted: applied at the start of the next
        #: transaction (group commit); a crash before that redelivers them
        self._pending_acks: list[tuple[int, int]] = []
        #: what ``_next_message_id`` would answer, known after a publish committed (only
        #: ``publish_many`` inserts messages); None = ask the database
        self._next_mid: int | None = None
        #: the ``current`` table's mid per (namespace, path) as read or written by
        #: committed publishes (only ``publish_many`` writes that table); _INLINE when the
        #: row holds the message itself
        self._current_mids: dict[tuple[str, str], int] = {}
        self._closed = False
        if self.memory:
            db = MEMORY
        else:
            os.makedirs(path, exist_ok=True)
            self._acquire_process_lock()
            db = os.path.join(path, DB_FILE)
        try:
            self.conn = sqlite3.connect(db, check_same_thread=False, isolation_level=None)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute(f"PRAGMA synchronous={_synchronous(synchronous)}")
            self.conn.execute("PRAGMA temp_store=MEMORY")
            self.conn.execute("PRAGMA cache_size=-32000")
            if not self.memory:
                # checkpoints run on their own thread (_checkpoint_loop), not inside a
                # commit; only a burst that outruns it pays one in a commit (a WAL that
                # grew without bound filled a small disk)
                self.conn.execute(f"PRAGMA wal_autocheckpoint={_WAL_BACKSTOP_PAGES}")
            reclaimable(self.conn, db)
            self.conn.executescript(_SCHEMA)
            self._upgrade_schema()
        except sqlite3.Error as exc:
            self._release_process_lock()
            # not AdapterUnavailable: waiting would not help (a gateway does not retry)
            raise AdapterError(f"cannot open embedded store {path!r}: {exc}") from exc
        self._db_file = db
        self._stop_checkpoints = threading.Event()
        self._checkpointer: threading.Thread | None = None
        if not self.memory:
            self._checkpointer = threading.Thread(
                target=self._checkpoint_loop, name=f"wsnmom-checkpoint-{path}", daemon=True
            )
            self._checkpointer.start()
        self.index: TopicIndex[int] = TopicIndex()
        self.match_all: set[int] = set()
        self.subs: dict[int, SubState] = {}
        self.by_name: dict[str, int] = {}
        #: started push handles per subscription id
        self.started: dict[int, set[EmbeddedHandle]] = collections.defaultdict(set)
        self._recover()
        # dispatcher
        self._cv = threading.Condition()
        self._ready: collections.deque[EmbeddedHandle] = collections.deque()
        self._queued: set[EmbeddedHandle] = set()
        self._dispatcher: threading.Thread | None = None
        # pull waiters
        self._arrival = threading.Condition()
        self._arrivals = 0

    # ------------------------------------------------------------------ lifecycle

    def _upgrade_schema(self) -> None:
        """Bring a database made by an earlier version up to :data:`_SCHEMA_VERSION`."""
        conn = self.conn
        columns = {row[1] for row in conn.execute("PRAGMA table_info(current)")}
        if "body" not in columns:  # version 1
            conn.execute("BEGIN IMMEDIATE")
            try:
                for column in ("body BLOB", "headers TEXT", "ctype TEXT"):
                    conn.execute(f"ALTER TABLE current ADD COLUMN {column}")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        conn.execute(
            "INSERT OR REPLACE INTO meta(key, value) VALUES ('schema', ?)", (_SCHEMA_VERSION,)
        )

    def _acquire_process_lock(self) -> None:
        if fcntl is None:  # pragma: no cover - Windows: no cross-process guard
            return
        fd = os.open(os.path.join(self.path, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            raise AdapterError(  # another gateway owns it: waiting would not help
                f"embedded store {self.path!r} is in use by another process"
            ) from exc
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd

    def _release_process_lock(self) -> None:
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)  # closing releases the flock
            self._lock_fd = None

    def _recover(self) -> None:
        """Return handed-out rows to the queue and load subscriptions into the index."""
        with self.lock, self.tx():
            self.conn.execute("UPDATE queue_entries SET state = 0 WHERE state = 1")
            # one grouped count for all subscriptions, not one query each (start-up time
            # grows with the number of subscriptions)
            held = {
                sid: (int(n), int(b))
                for sid, n, b in self.conn.execute(
                    "SELECT e.sub, count(*), coalesce(sum(m.size), 0) FROM queue_entries e "
                    "JOIN messages m ON m.id = e.mid GROUP BY e.sub"
                )
            }
            rows = self.conn.execute("SELECT id, name, patterns, limits FROM subscriptions")
            for sid, name, patterns, limits in rows.fetchall():
                st = SubState(sid, name, decode_patterns(patterns), decode_limits(limits))
                st.dead_letters = decode_dead_letters(limits)
                self._install(st, held=held.get(sid, (0, 0)))

    def _checkpoint_loop(self) -> None:
        """Copy committed WAL pages into the database file every
        :data:`_CHECKPOINT_INTERVAL` seconds, on a connection of its own.

        SQLite's automatic checkpoint runs inside the commit that crosses its threshold:
        that commit then waits for two fsyncs while holding the engine lock, and every
        publish, fetch and acknowledgement waits with it (8 ms at the 99.9th percentile of
        commits here, up to ~80 ms, and the delivery latency scenario measured a p99 of
        115 ms once).  A PASSIVE checkpoint from another connection takes no write lock, so
        commits go on meanwhile; the WAL is reused from its start by the first commit after
        a complete checkpoint, so it does not grow while this keeps up."""
        try:
            conn = sqlite3.connect(self._db_file, isolation_level=None)
        except sqlite3.Error:  # pragma: no cover - the main connection opened the same file
            log.exception("embedded store: no checkpoint connection; the WAL will grow")
            return
        try:
            while not self._stop_checkpoints.wait(_CHECKPOINT_INTERVAL):
                try:
                    self._vacuum_step()
                    row = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                    self._truncate_wal(row)
                except sqlite3.Error:
                    log.warning("embedded store: checkpoint failed", exc_info=True)
        finally:
            conn.close()

    def _truncate_wal(self, checkpoint: tuple[int, int, int] | None) -> None:
        """Cut the WAL back to nothing once a checkpoint copied all of it, when it grew
        past :data:`JOURNAL_LIMIT` (a burst of writes): SQLite reuses the WAL from its
        start but keeps its size, which a full disk needs back."""
        if checkpoint is None or checkpoint[1] != checkpoint[2] or checkpoint[1] <= 0:
            return
        try:
            size = os.path.getsize(self._db_file + "-wal")
        except OSError:
            return
        if size > JOURNAL_LIMIT:
            with self.lock:
                if not self._closed:
                    self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

    def _vacuum_step(self) -> None:
        """Give the pages of deleted messages back to the filesystem, a step at a time
        (``wsnmom.core.sqlite_space``; the checkpoint that follows shrinks the file)."""
        for _ in range(_VACUUM_STEPS):
            with self.lock:  # released between steps: publishes and takes go on
                if self._closed or not vacuum_step(self.conn):
                    return

    def close(self) -> None:
        """Stop the dispatcher and close the database (the last user closes)."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._stop_checkpoints.set()
        if self._checkpointer is not None:
            self._checkpointer.join(timeout=30)
        if self._dispatcher is not None and self._dispatcher is not threading.current_thread():
            self._dispatcher.join(timeout=5)
        with self._arrival:
            self._arrival.notify_all()
        with self.lock:
            if self._pending_acks:
                with contextlib.suppress(sqlite3.Error):
                    self.conn.execute("BEGIN IMMEDIATE")
                    self._apply_acks(self.conn, self._pending_acks)
                    self.conn.execute("COMMIT")
                self._pending_acks = []
            with contextlib.suppress(sqlite3.Error):
                if not self.memory:
                    self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                self.conn.close()
            self._release_process_lock()

    @property
    def closed(self) -> bool:
        return self._closed

    @contextlib.contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; call with ``self.lock`` held."""
        if self._closed:
            raise AdapterUnavailable("the embedded adapter is closed")
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        acks, self._pending_acks = self._pending_acks, []
        woken: set[int] = set()
        try:
            if acks:
                self._apply_acks(conn, acks)
            yield conn
            if self._graves:
                self._inter(conn, woken)
            conn.execute("COMMIT")
            self._wake(woken)
            if self._outboxed:
                self._outboxed = False
                if self.on_outbox is not None:
                    self.on_outbox()
        except BaseException:
            self._graves.clear()
            self._outboxed = False
            # also after a COMMIT that failed (a full disk): a transaction left open would
            # refuse every later one until a restart
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            self._pending_acks[:0] = acks
            if acks:
                self._kick()  # settle only wakes the dispatcher for a first pending ack
            raise

    def _apply_acks(self, c: sqlite3.Connection, acks: list[tuple[int, int]]) -> None:
        """Delete acked rows (inside the current transaction) and release their messages."""
        gone: list[tuple[int, int]] = []
        for sid, mid in acks:
            if c.execute(_REMOVE, (sid, mid)).rowcount:
                gone.append((sid, mid))
        for sid, mid in gone:
            st = self.subs.get(sid)
            if st is not None and st.count is not None and st.bytes is not None:
                row = c.execute("SELECT size FROM messages WHERE id = ?", (mid,)).fetchone()
                st.count -= 1
                st.bytes -= int(row[0]) if row else 0
        self._decref(c, [mid for _, mid in gone])

    def flush_acks(self) -> None:
        """Commit pending acks now."""
        with self.lock:
            if self._pending_acks and not self._closed:
                with self.tx():
                    pass

    def ping(self) -> bool:
        if self._closed:
            return False
        try:
            with self.lock:
                self.conn.execute("SELECT 1").fetchone()
        except sqlite3.Error:
            return False
        return True

    # ------------------------------------------------------------------ subscriptions

    def _install(self, st: SubState, held: tuple[int, int] | None = None) -> None:
        """Register ``st`` in the maps and index; ``held`` = (entries, bytes) when already
        known, else counted now."""
        self.subs[st.id] = st
        self.by_name[st.name] = st.id
        if st.patterns is None:
            self.index.remove(st.id)
            self.match_all.add(st.id)
        else:
            self.match_all.discard(st.id)
            self.index.add(st.id, st.patterns)
        if held is not None and st.bounded:
            st.count, st.bytes = held
        else:
            self._count(st)

    def _count(self, st: SubState) -> None:
        if not st.bounded:
            st.count = st.bytes = None
            return
        n, b = self.conn.execute(
            "SELECT count(*), coalesce(sum(m.size), 0) FROM queue_entries e "
            "JOIN messages m ON m.id = e.mid WHERE e.sub = ?",
            (st.id,),
        ).fetchone()
        st.count, st.bytes = int(n), int(b)

    def attach(
        self,
        name: str,
        patterns: tuple[PathPattern, ...] | None,
        limits: QueueLimits,
        dead_letters: Topic | None = None,
    ) -> SubState:
        """Create the durable subscription ``name`` or re-bind it to new patterns, limits
        or dead-letter topic (where what its limits drop goes: :meth:`_bury`)."""
        with self.lock:
            sid = self.by_name.get(name)
            known = self.subs[sid] if sid is not None else None
            if (
                known is not None
                and known.patterns == patterns
                and known.limits == limits
                and known.dead_letters == dead_letters
            ):
                return known  # the usual re-attach at start-up: nothing to encode or write
            enc_p, enc_l = encode_patterns(patterns), encode_limits(limits, dead_letters)
            if known is not None:
                with self.tx() as c:
                    c.execute(
                        "UPDATE subscriptions SET patterns = ?, limits = ? WHERE id = ?",
                        (enc_p, enc_l, known.id),
                    )
                known.patterns, known.limits = patterns, limits
                known.dead_letters = dead_letters
                self._install(known)
                if known.bounded:
                    with self.tx():
                        self._enforce_limits(known)
                return known
            with self.tx() as c:
                cur = c.execute(
                    "INSERT INTO subscriptions(name, patterns, limits) VALUES (?, ?, ?)",
                    (name, enc_p, enc_l),
                )
                sid = cur.lastrowid
            assert sid is not None
            st = SubState(sid, name, patterns, limits, dead_letters=dead_letters)
            self._install(st)
            return st

    def delete_subscription(self, name: str) -> int | None:
        """Destroy ``name`` and its queue; returns its id (None when unknown)."""
        with self.lock:
            sid = self.by_name.pop(name, None)
            if sid is None:
                return None
            self.subs.pop(sid, None)
            self.index.remove(sid)
            self.match_all.discard(sid)
            with self.tx() as c:
                self._delete_rows(c, sid)
        self._detach_handles(sid)
        return sid

    @staticmethod
    def _delete_rows(c: sqlite3.Connection, sid: int) -> None:
        """Delete subscription ``sid``'s rows and its queue (in a transaction)."""
        c.execute(
            "UPDATE messages SET refs = refs - 1 "
            "WHERE id IN (SELECT mid FROM queue_entries WHERE sub = ?)",
            (sid,),
        )
        c.execute(
            "DELETE FROM messages WHERE refs <= 0 "
            "AND id IN (SELECT mid FROM queue_entries WHERE sub = ?)",
            (sid,),
        )
        c.execute("DELETE FROM queue_entries WHERE sub = ?", (sid,))
        c.execute("DELETE FROM subscriptions WHERE id = ?", (sid,))

    def _detach_handles(self, sid: int) -> None:
        handles = self.started.pop(sid, set())
        for h in list(handles):
            h.detach()

    def delete_into_dead_letters(
        self, name: str, reason: str, context: Mapping[str, str]
    ) -> int | None:
        """Destroy ``name`` as :meth:`delete_subscription` does, in one transaction with
        sending every message of its queue (handed out or not) to its dead-letter topic
        (:meth:`_bury`, ``reason``, the headers ``context`` added); returns how many
        (None: unknown subscription).  A failed transaction leaves it as it was."""
        with self.lock:
            sid = self.by_name.get(name)
            st = self.subs.get(sid) if sid is not None else None
            if sid is None or st is None:
                return None
            with self.tx() as c:
                mids = [
                    int(r[0])
                    for r in c.execute(
                        "SELECT mid FROM queue_entries WHERE sub = ? ORDER BY mid", (sid,)
                    )
                ]
                for at in range(0, len(mids), 500):
                    self._bury(st, mids[at : at + 500], reason, context)
                self._delete_rows(c, sid)
            del self.by_name[name]
            self.subs.pop(sid, None)
            self.index.remove(sid)
            self.match_all.discard(sid)
        self._detach_handles(sid)
        return len(mids) if st.dead_letters is not None else 0

    def subscription_names(self) -> list[str]:
        with self.lock:
            return sorted(self.by_name)

    # ------------------------------------------------------------------ publish

    def targets(self, topic: Topic) -> set[int]:
        """Subscription ids that receive ``topic`` (one entry each, whatever the patterns).

        Match-all subscriptions (``patterns=None``) get every topic except those of internal
        namespaces (adapter contract, ``core.adapter.is_internal_namespace``)."""
        found: set[int] = self.index.match(topic)
        if self.match_all and not is_internal_namespace(topic.namespace):
            found |= self.match_all
        return found

    def publish_many(self, messages: Sequence[OutboundMessage]) -> list[int]:
        """Store and route ``messages`` in one transaction; returns the fan-out of each.

        Routing is worked out once per distinct topic of the batch (:meth:`_routes`).  A
        message is stored once, with one ``queue_entries`` row per subscription that accepts
        it; the batch's last message on a topic that is not internal becomes the topic's
        current message (the others would be replaced within the same transaction); one
        that no subscription receives is held inline in its ``current`` row, and a message
        with neither a queue nor the current slot to go to is not stored at all.
        Rows are written with ``executemany`` when the batch is done, with message ids
        assigned here in AUTOINCREMENT order (:meth:`_next_message_id`); a bounded
        subscription's overflow policy sees every earlier message of the batch (the rows
        are written before it runs).
        """
        now = time.time()
        fanouts: list[int] = [0] * len(messages)
        touched: set[int] = set()
        with self.lock:
            known_mid = self._next_mid
            # forgotten until this transaction commits: a failed one leaves them unknown
            self._next_mid = None
            current_mids, self._current_mids = self._current_mids, {}
            self._publish_tx(messages, now, fanouts, touched, known_mid, current_mids)
            self._current_mids = current_mids
        self._wake(touched)
        return fanouts

    def _publish_tx(
        self,
        messages: Sequence[OutboundMessage],
        now: float,
        fanouts: list[int],
        touched: set[int],
        known_mid: int | None,
        current_mids: dict[tuple[str, str], int],
    ) -> None:
        """The transaction of :meth:`publish_many` (``self.lock`` held); on success sets
        ``self._next_mid`` and brings ``current_mids`` up to date."""
        with self.tx() as c:
            routes, last_in_slot = self._routes(messages)
            subs = self.subs
            message_rows: list[tuple[Any, ...]] = []
            entry_rows: list[tuple[int, int]] = []
            #: (ns, path, mid, body, headers, ctype): a stored message by id, or _INLINE
            #: and the message itself when no subscription received it
            current: list[tuple[str, str, int, bytes | None, str | None, str | None]] = []
            mid = 0  # the id of the next stored message, once known
            headers_json = _HeadersJson()
            for i, m in enumerate(messages):
                route = routes[i]
                fanouts[i] = route.fanout
                retain = route.slot is not None and last_in_slot.get(route.slot) == i
                if not route.targets and not retain:
                    continue
                size = len(m.body)
                accepted: list[SubState] = []
                for sid in route.targets:
                    st = subs.get(sid)
                    if st is None:
                        continue
                    if st.bounded:
                        self._write_rows(c, message_rows, entry_rows)
                        if not self._make_room(st, size):
                            self._grave(st, m, dict(m.headers), DROPPED_OVERFLOW)
                            continue
                    accepted.append(st)
                if not accepted:
                    if retain:
                        current.append(
                            (
                                route.namespace,
                                route.key,
                                _INLINE,
                                m.body,
                                headers_json(m),
                                m.content_type,
                            )
                        )
                    continue
                if not mid:
                    mid = known_mid or self._next_message_id(c)
                message_rows.append(
                    (
                        mid,
                        route.namespace,
                        route.key,
                        m.body,
                        headers_json(m),
                        m.content_type,
                        m.message_id,
                        size,
                        now,
                        len(accepted) + int(retain),
                    )
                )
                if retain:
                    current.append((route.namespace, route.key, mid, None, None, None))
                for st in accepted:
                    entry_rows.append((st.id, mid))
                    if st.count is not None and st.bytes is not None:
                        st.count += 1
                        st.bytes += size
                    touched.add(st.id)
                mid += 1
            self._write_rows(c, message_rows, entry_rows)
            for slot in current:
                ns, key = slot[0], slot[1]
                old = current_mids.get((ns, key))
                if old is None:
                    row = c.execute(
                        "SELECT mid FROM current WHERE ns = ? AND path = ?", (ns, key)
                    ).fetchone()
                    old = row[0] if row is not None else None
                c.execute(_SET_CURRENT, slot)
                if old:  # neither unknown (None) nor inline (_INLINE)
                    self._release(c, old)
        if len(current_mids) + len(current) > _CURRENT_MIDS_MAX:
            current_mids.clear()
        for slot in current:
            current_mids[(slot[0], slot[1])] = slot[2]
        # dead letters written by this transaction took ids after ``mid``
        self._next_mid = None if self._interred else mid or known_mid
        self._interred = False

    def _routes(
        self, messages: Sequence[OutboundMessage]
    ) -> tuple[list[_Route], dict[tuple[str, str], int]]:
        """The route of each message (one per distinct topic, looked up once) and, per
        current-message slot ``(namespace, path)``, the index of the batch's last message
        in it (internal topics keep no current message).  Call with ``self.lock`` held."""
        routes: list[_Route] = []
        last_in_slot: dict[tuple[str, str], int] = {}
        by_topic: dict[Topic, _Route] = {}
        topic: Topic | None = None
        route: _Route | None = None
        for i, m in enumerate(messages):
            if m.topic is not topic or route is None:
                topic = m.topic
                route = by_topic.get(topic)
                if route is None:
                    found = self.targets(topic)
                    key = _topic_key(topic)
                    keeps = self.keep_current and not is_internal_namespace(topic.namespace)
                    route = by_topic[topic] = _Route(
                        topic.namespace,
                        key,
                        (topic.namespace, key) if keeps else None,
                        sorted(found),
                        len(found),
                    )
            if route.slot is not None:
                last_in_slot[route.slot] = i
            routes.append(route)
        return routes, last_in_slot

    @staticmethod
    def _next_message_id(c: sqlite3.Connection) -> int:
        """The id the next inserted message would get (AUTOINCREMENT: above every id ever
        used); only this connection writes, under ``self.lock``."""
        row = c.execute(
            "SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'messages'), 0), "
            "coalesce((SELECT max(id) FROM messages), 0))"
        ).fetchone()
        return int(row[0]) + 1

    @staticmethod
    def _write_rows(
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

    def _make_room(self, st: SubState, size: int) -> bool:
        """Apply the overflow policy before one more ``size``-byte message; False = drop it."""
        lim = st.limits
        assert st.count is not None and st.bytes is not None

        def full() -> bool:
            assert st.count is not None and st.bytes is not None
            if lim.max_messages is not None and st.count + 1 > lim.max_messages:
                return True
            return lim.max_bytes is not None and st.bytes + size > lim.max_bytes

        if not full():
            return True
        if lim.max_age is not None:  # expired messages make room before any live one goes
            self._expire(st)
            if not full():
                return True
        if lim.overflow is Overflow.DROP_NEWEST:
            return False
        if lim.max_bytes is not None and size > lim.max_bytes:
            return False
        if lim.max_messages is not None and lim.max_messages <= 0:
            return False
        while full():
            if not self._drop_one(st):
                return False  # everything left is handed out: nothing to drop
        return True

    def _drop_one(self, st: SubState) -> bool:
        """Discard the oldest ready message of ``st``; False when none is ready."""
        row = self.conn.execute(
            "SELECT e.mid, m.size FROM queue_entries e JOIN messages m ON m.id = e.mid "
            "WHERE e.sub = ? AND e.state = 0 ORDER BY e.mid LIMIT 1",
            (st.id,),
        ).fetchone()
        if row is None:
            return False
        self._bury(st, [row[0]], DROPPED_OVERFLOW)
        self.conn.execute(_REMOVE, (st.id, row[0]))
        self._decref(self.conn, [row[0]])
        if st.count is not None and st.bytes is not None:
            st.count -= 1
            st.bytes -= int(row[1])
        return True

    def _enforce_limits(self, st: SubState) -> None:
        """Trim an existing queue to new, tighter limits (drops the oldest)."""
        lim = st.limits
        while (
            st.count is not None
            and st.bytes is not None
            and (
                (lim.max_messages is not None and st.count > lim.max_messages)
                or (lim.max_bytes is not None and st.bytes > lim.max_bytes)
            )
        ):
            if not self._drop_one(st):
                return

    def _bury(
        self,
        st: SubState,
        mids: Sequence[int],
        reason: str,
        context: Mapping[str, str] | None = None,
    ) -> None:
        """Keep the messages ``mids`` that ``st``'s limits drop for its dead-letter topic
        (inside the transaction that drops them, before their rows go): they are written
        with ``HEADER_DROPPED_REASON`` and ``HEADER_DROPPED_FROM`` and routed like any
        message on that topic when the transaction commits (:meth:`_inter`), so they are
        dead-lettered exactly when they are dropped.  Nothing without a topic."""
        if st.dead_letters is None or not mids:
            return
        marks = ",".join("?" * len(mids))
        rows = self.conn.execute(
            f"SELECT m.id, m.ns, m.path, m.body, m.headers, m.ctype, m.msgid, e.delivered "
            f"FROM messages m JOIN queue_entries e ON e.mid = m.id AND e.sub = ? "
            f"WHERE m.id IN ({marks}) ORDER BY m.id",
            (st.id, *mids),
        ).fetchall()
        for _mid, ns, path, body, headers, ctype, msgid, delivered in rows:
            message = OutboundMessage(
                topic=Topic(ns, tuple(path.split("/"))),
                body=bytes(body),
                message_id=msgid,
                content_type=ctype,
            )
            stored = json.loads(headers)
            if context:
                stored.update(context)
            self._grave(st, message, stored, reason, delivered)

    def _grave(
        self,
        st: SubState,
        m: OutboundMessage,
        headers: dict[str, str],
        reason: str,
        delivered: int = 0,
    ) -> None:
        """Keep ``m`` (its stored ``headers``), dropped from ``st`` for ``reason`` after
        being handed out ``delivered`` times, for ``st``'s dead-letter topic (see
        :meth:`_bury`)."""
        if st.dead_letters is None:
            return
        headers.setdefault(HEADER_MESSAGE_ID, m.message_id)
        headers.setdefault(HEADER_TOPIC_NAMESPACE, m.topic.namespace)
        headers.setdefault(HEADER_TOPIC_PATH, _topic_key(m.topic))
        headers[HEADER_DROPPED_REASON] = reason
        headers[HEADER_DROPPED_FROM] = st.name
        headers[HEADER_DROPPED_AT] = datetime.fromtimestamp(time.time(), UTC).isoformat()
        if delivered:
            headers[HEADER_DROPPED_ATTEMPTS] = str(delivered)
        self._graves.append(
            OutboundMessage(
                topic=st.dead_letters,
                body=m.body,
                message_id=m.message_id,
                headers=headers,
                content_type=m.content_type,
            )
        )

    def _inter(self, c: sqlite3.Connection, woken: set[int]) -> None:
        """Write the messages :meth:`_bury` kept, each with one queue entry per
        subscription of its dead-letter topic (no limits applied: dead letters are not
        dropped again); ``woken`` gets those subscriptions."""
        graves, self._graves = self._graves, []
        now = time.time()
        mid = self._next_message_id(c)
        for m in graves:
            if self.outbox is not None and not self._parking and self.outbox(m.topic):
                c.execute(
                    "INSERT INTO outbox(ns, path, body, headers, ctype, msgid) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        m.topic.namespace,
                        _topic_key(m.topic),
                        m.body,
                        json.dumps(dict(m.headers)),
                        m.content_type,
                        m.message_id,
                    ),
                )
                self._outboxed = True
                continue
            targets = [sid for sid in sorted(self.targets(m.topic)) if sid in self.subs]
            if not targets:
                log.warning(
                    "embedded store: a dropped message has no dead-letter queue on %s", m.topic
                )
                continue
            size = len(m.body)
            c.execute(
                _INSERT_MESSAGE,
                (
                    mid,
                    m.topic.namespace,
                    _topic_key(m.topic),
                    m.body,
                    json.dumps(dict(m.headers)),
                    m.content_type,
                    m.message_id,
                    size,
                    now,
                    len(targets),
                ),
            )
            _execute_rows(
                c, "INSERT INTO queue_entries(sub, mid) VALUES (?, ?)", [(s, mid) for s in targets]
            )
            for sid in targets:
                st = self.subs[sid]
                if st.count is not None and st.bytes is not None:
                    st.count += 1
                    st.bytes += size
            woken.update(targets)
            mid += 1
        self._next_mid = None
        self._interred = True

    def outbox_batch(self, limit: int) -> list[tuple[int, OutboundMessage]]:
        """The oldest ``limit`` dead letters waiting in the outbox (see ``outbox``), with
        their row ids for :meth:`outbox_remove`."""
        with self.lock:
            if self._closed:
                raise AdapterUnavailable("the embedded adapter is closed")
            rows = self.conn.execute(
                "SELECT id, ns, path, body, headers, ctype, msgid FROM outbox ORDER BY id LIMIT ?",
                (limit,),
            ).fetchall()
        return [
            (
                rid,
                OutboundMessage(
                    topic=Topic(ns, tuple(path.split("/"))),
                    body=bytes(body),
                    message_id=msgid,
                    headers=json.loads(headers),
                    content_type=ctype,
                ),
            )
            for rid, ns, path, body, headers, ctype, msgid in rows
        ]

    def outbox_park(self, parked: Sequence[tuple[int, OutboundMessage]]) -> None:
        """Move outbox rows (id, the dead letter :meth:`outbox_batch` gave) that the other
        middleware refuses for good into the queues here of their topic's subscriptions
        (the gateway's dead-letter boxes), in one transaction, as if there were no
        outbox: they stay listed and counted, and wait here until replayed or purged."""
        with self.lock:
            self._parking = True
            try:
                with self.tx() as c:
                    c.executemany("DELETE FROM outbox WHERE id = ?", [(i,) for i, _ in parked])
                    self._graves.extend(m for _, m in parked)
            finally:
                self._parking = False

    def outbox_remove(self, ids: Sequence[int]) -> None:
        """Forget outbox rows ``ids`` (their dead letters were delivered elsewhere)."""
        with self.lock, self.tx() as c:
            c.executemany("DELETE FROM outbox WHERE id = ?", [(i,) for i in ids])

    @staticmethod
    def _release(c: sqlite3.Connection, mid: int) -> None:
        """``_decref`` of one message: the same outcome, and one statement instead of two
        when this was its last reference (the usual case of a replaced current message)."""
        if not c.execute("DELETE FROM messages WHERE id = ? AND refs <= 1", (mid,)).rowcount:
            c.execute("UPDATE messages SET refs = refs - 1 WHERE id = ?", (mid,))

    @staticmethod
    def _decref(c: sqlite3.Connection, mids: Iterable[int]) -> None:
        params = [(m,) for m in mids]
        if not params:
            return
        _execute_rows(c, "UPDATE messages SET refs = refs - 1 WHERE id = ?", params)
        _execute_rows(c, "DELETE FROM messages WHERE id = ? AND refs <= 0", params)

    # ------------------------------------------------------------------ consume

    def _expire(self, st: SubState) -> None:
        """Remove the ready messages of ``st`` older than its ``max_age`` (inside a
        transaction).  Ids follow publish order, so this walks from the oldest entry and
        stops at the first one that is still young: the cost is the count expired, not the
        backlog (a full scan on every fetch made draining a backlog quadratic)."""
        if st.limits.max_age is None:
            return
        cutoff = time.time() - st.limits.max_age.total_seconds()
        after = 0
        while True:
            rows = self.conn.execute(_OLDEST_READY, (st.id, after, _EXPIRE_CHUNK)).fetchall()
            expired = list(itertools.takewhile(lambda r: r[2] < cutoff, rows))
            if expired:
                self._bury(st, [r[0] for r in expired], DROPPED_MAX_AGE)
                self.conn.executemany(_REMOVE, [(st.id, r[0]) for r in expired])
                self._decref(self.conn, [r[0] for r in expired])
                if st.count is not None and st.bytes is not None:
                    st.count -= len(expired)
                    st.bytes -= sum(r[1] for r in expired)
            if len(expired) < _EXPIRE_CHUNK:
                return
            after = expired[-1][0]

    def _head_expired(self, st: SubState, rows: Sequence[tuple[Any, ...]]) -> bool:
        """True when the oldest of these ``_READY`` rows is past the subscription's
        ``max_age`` (ids follow publish order: if it is not, none of them is)."""
        max_age = st.limits.max_age
        if not rows or max_age is None:
            return False
        return bool(rows[0][_PUBLISHED] < time.time() - max_age.total_seconds())

    def fetch(self, sid: int, n: int) -> list[Row]:
        """Hand out up to ``n`` ready messages of ``sid``, oldest first."""
        if n <= 0:
            return []
        with self.lock:
            st = self.subs.get(sid)
            if st is None or self._closed:
                return []
            with self.tx() as c:
                rows = c.execute(_READY, (sid, n)).fetchall()
                if self._head_expired(st, rows):
                    self._expire(st)
                    rows = c.execute(_READY, (sid, n)).fetchall()
                if len(rows) == 1:  # GetMessages' usual MaximumNumber=1: no executemany
                    c.execute(_HAND_OUT, (sid, rows[0][0]))
                elif rows:
                    c.executemany(_HAND_OUT, [(sid, r[0]) for r in rows])
        return _rows(sid, rows)

    def take(self, sid: int, n: int) -> list[Row]:
        """Hand out up to ``n`` ready messages of ``sid``, oldest first, as consumed: their
        removal joins the pending acks (group commit), so a take is a read, not a
        transaction of its own.

        ``SubState.taken_upto`` keeps later takes from returning a message whose removal
        is still pending: messages are taken in id order and new ones get higher ids.  A
        crash before the removal is committed hands those messages out again after the
        restart (a duplicate, never a loss).  When the oldest selected message is older
        than the subscription's ``max_age``, expired messages are removed first, as
        :meth:`fetch` does on every call.
        """
        if n <= 0:
            return []
        kick = False
        with self.lock:
            st = self.subs.get(sid)
            if st is None or self._closed:
                return []
            rows = self.conn.execute(_READY_AFTER, (sid, st.taken_upto, n)).fetchall()
            if self._head_expired(st, rows):
                with self.tx():
                    self._expire(st)
                rows = self.conn.execute(_READY_AFTER, (sid, st.taken_upto, n)).fetchall()
            if rows:
                st.taken_upto = rows[-1][0]
                kick = not self._pending_acks
                self._pending_acks.extend((sid, r[0]) for r in rows)
                if len(self._pending_acks) >= _ACK_BATCH:
                    self.flush_acks()
                    kick = False
        if kick:
            self._kick()
        return _rows(sid, rows)

    def settle(self, sid: int, mids: Sequence[int], *, remove: bool) -> None:
        """Ack (``remove``) or requeue handed-out messages; unknown rows are ignored."""
        if not mids:
            return
        with self.lock:
            if self._closed:
                return
            kick = False
            if remove:
                # group commit: acks are applied by the next transaction, or by the
                # dispatcher thread within a few milliseconds.  Only the first pending ack
                # wakes the dispatcher: waking it for each one would cut its coalescing
                # wait short and commit (nearly) every ack on its own.
                kick = not self._pending_acks
                self._pending_acks.extend((sid, m) for m in mids)
                if len(self._pending_acks) >= _ACK_BATCH:
                    self.flush_acks()
            else:
                with self.tx() as c:
                    c.executemany(
                        "UPDATE queue_entries SET state = 0 "
                        "WHERE sub = ? AND mid = ? AND state = 1",
                        [(sid, m) for m in mids],
                    )
                st = self.subs.get(sid)
                if st is not None:
                    # requeued below the take watermark: pending removals were applied
                    # at the start of that transaction, so the watermark can go
                    st.taken_upto = 0
        if kick:
            self._kick()
        elif not remove:
            self._wake({sid})

    def _kick(self) -> None:
        """Make sure the dispatcher thread runs (it flushes pending acks)."""
        with self._cv:
            self._ensure_dispatcher()
            self._cv.notify()

    def peek(self, sid: int, n: int) -> list[tuple[Row, float]]:
        """Up to ``n`` ready messages of ``sid``, oldest first, with their publish time
        (POSIX seconds), read and left as they are: nothing handed out or marked.
        Messages taken and not yet removed (``take``) and those past the subscription's
        ``max_age`` are left out, as the next ``fetch`` would leave them out."""
        if n <= 0:
            return []
        with self.lock:
            st = self.subs.get(sid)
            if st is None or self._closed:
                return []
            selected = self.conn.execute(_READY_AFTER, (sid, st.taken_upto, n)).fetchall()
        if st.limits.max_age is not None:
            cutoff = time.time() - st.limits.max_age.total_seconds()
            selected = [r for r in selected if r[_PUBLISHED] >= cutoff]
        rows = _rows(sid, selected)
        return [(row, float(r[_PUBLISHED])) for row, r in zip(rows, selected, strict=True)]

    def depth(self, sid: int) -> int:
        with self.lock:
            st = self.subs.get(sid)
            if st is None:
                return 0
            if st.limits.max_age is not None or self._pending_acks:
                with self.tx():
                    self._expire(st)
            row = self.conn.execute(
                "SELECT count(*) FROM queue_entries WHERE sub = ? AND state = 0", (sid,)
            ).fetchone()
            return int(row[0])

    def purge(self, sid: int) -> int:
        """Remove every ready message of ``sid`` (an operator's purge); returns how many.
        Handed-out messages stay until they are settled; the transaction applies pending
        acks first, so a message taken and not yet removed is not counted."""
        with self.lock:
            st = self.subs.get(sid)
            if st is None or self._closed:
                return 0
            with self.tx() as c:
                ready = "SELECT mid FROM queue_entries WHERE sub = ? AND state = 0"
                c.execute(f"UPDATE messages SET refs = refs - 1 WHERE id IN ({ready})", (sid,))
                c.execute(f"DELETE FROM messages WHERE refs <= 0 AND id IN ({ready})", (sid,))
                removed = c.execute(
                    "DELETE FROM queue_entries WHERE sub = ? AND state = 0", (sid,)
                ).rowcount
                self._count(st)
            return int(removed)

    def depths(self, sids: Sequence[int]) -> list[int]:
        """``depth`` of each subscription in one transaction and one grouped count."""
        with self.lock:
            bounded = [self.subs[s] for s in sids if s in self.subs]
            aged = [st for st in bounded if st.limits.max_age is not None]
            if aged or self._pending_acks:
                with self.tx():
                    for st in aged:
                        self._expire(st)
            counts = dict(
                self.conn.execute(
                    "SELECT sub, count(*) FROM queue_entries WHERE state = 0 GROUP BY sub"
                ).fetchall()
            )
        return [int(counts.get(s, 0)) for s in sids]

    def current_message(self, topic: Topic) -> StoredMessage | None:
        with self.lock:
            if self._closed:
                raise AdapterUnavailable("the embedded adapter is closed")
            row = self.conn.execute(
                "SELECT coalesce(c.body, m.body), coalesce(c.headers, m.headers), "
                "coalesce(c.ctype, m.ctype) FROM current c LEFT JOIN messages m ON m.id = c.mid "
                "WHERE c.ns = ? AND c.path = ?",
                (topic.namespace, _topic_key(topic)),
            ).fetchone()
        if row is None or row[0] is None:
            return None
        return StoredMessage(
            topic=topic, body=bytes(row[0]), headers=json.loads(row[1]), content_type=row[2]
        )

    # ------------------------------------------------------------------ dispatch

    def wait_arrival(self, since: int, timeout: float) -> int:
        """Block until a publish after ``since`` (an ``arrivals`` value) or timeout."""
        with self._arrival:
            if self._arrivals == since and not self._closed:
                self._arrival.wait(timeout)
            return self._arrivals

    @property
    def arrivals(self) -> int:
        return self._arrivals

    def _wake(self, sids: Iterable[int]) -> None:
        sids = set(sids)
        if not sids:
            return
        with self._arrival:
            self._arrivals += 1
            self._arrival.notify_all()
        handles = [h for sid in sids for h in tuple(self.started.get(sid, ()))]
        if handles:
            self.schedule(handles)

    def schedule(self, handles: Iterable[EmbeddedHandle]) -> None:
        """Queue started handles for a dispatcher round."""
        with self._cv:
            for h in handles:
                if h not in self._queued:
                    self._queued.add(h)
                    self._ready.append(h)
            self._ensure_dispatcher()
            self._cv.notify()

    def _ensure_dispatcher(self) -> None:
        # call with self._cv held
        if self._dispatcher is None and not self._closed:
            self._dispatcher = threading.Thread(
                target=self._dispatch_loop, name=f"wsnmom-embedded-{self.path}", daemon=True
            )
            self._dispatcher.start()

    def _dispatch_loop(self) -> None:
        while True:
            h: EmbeddedHandle | None = None
            with self._cv:
                while not self._ready and not self._closed:
                    if self._pending_acks:
                        self._cv.wait(_ACK_DELAY)  # let acks coalesce, then flush them
                        break
                    self._cv.wait()
                if self._closed:
                    return
                if self._ready:
                    h = self._ready.popleft()
                    self._queued.discard(h)
            if h is None:
                try:
                    self.flush_acks()
                except Exception:  # pragma: no cover - e.g. closed meanwhile
                    log.exception("embedded store: flushing acks failed")
                continue
            try:
                more = h.dispatch_round(_FETCH_BATCH)
            except AdapterUnavailable:  # closed while dispatching
                more = False
            except Exception:  # pragma: no cover - defensive: keep the dispatcher alive
                log.exception("embedded dispatcher failed for %s", h.name)
                more = False
            if more:
                self.schedule([h])


def _synchronous(value: str) -> str:
    v = str(value).upper()
    if v not in {"OFF", "NORMAL", "FULL", "EXTRA"}:
        raise ValueError(f"synchronous must be NORMAL or FULL, not {value!r}")
    return v


# --------------------------------------------------------------------------- engines


_engines: dict[str, Engine] = {}
_engines_lock = threading.Lock()


def acquire_engine(path: str, options: Mapping[str, Any]) -> Engine:
    """The engine of ``path`` (shared within the process); call :func:`release_engine`."""
    sync = str(options.get("synchronous", "NORMAL"))
    _synchronous(sync)  # validate before anything is locked or created
    if path == MEMORY:
        mem = Engine(MEMORY, synchronous=sync)
        mem.users = 1
        return mem
    key = os.path.realpath(path)
    with _engines_lock:
        eng = _engines.get(key)
        if eng is None or eng.closed:
            eng = Engine(key, synchronous=sync)
            _engines[key] = eng
        eng.users += 1
        return eng


def release_engine(engine: Engine) -> None:
    """Drop one user of ``engine``; the last one closes it."""
    with _engines_lock:
        engine.users -= 1
        if engine.users > 0:
            return
        if not engine.memory:
            _engines.pop(engine.path, None)
    engine.close()
