"""The embedded engine's database: opening it, the process lock, WAL checkpoints and
vacuum steps on a thread of their own, and the write transaction with its group-committed
acknowledgements (see :mod:`wsnmom.adapters.embedded.store`)."""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
from collections.abc import Iterator

from wsnmom.core.adapter import (
    AdapterError,
    AdapterUnavailable,
)
from wsnmom.core.sqlite_space import JOURNAL_LIMIT, reclaimable, vacuum_step

from ..dir_lock import lock_directory
from .parts import EngineParts
from .records import (
    _REMOVE,
    _SCHEMA,
    _SCHEMA_VERSION,
    MEMORY,
    decref,
)

#: the engine's logger (one name for all its parts)
log = logging.getLogger(f"{__package__}.store")

DB_FILE = "embedded.sqlite3"
LOCK_FILE = "wsnmom.lock"

#: seconds between WAL checkpoints (``Engine._checkpoint_loop``)
_CHECKPOINT_INTERVAL = 0.5
#: incremental-vacuum steps per checkpoint interval at most (of VACUUM_STEP pages each)
_VACUUM_STEPS = 16
#: WAL pages (4 KiB) after which a commit checkpoints itself
_WAL_BACKSTOP_PAGES = 4096


class Storage(EngineParts):
    """The database of an :class:`~wsnmom.adapters.embedded.store.Engine`."""

    #: why the last ``ping`` failed ("" when it answered)
    ping_error = ""

    def _open_database(self, synchronous: str) -> None:
        """Open (or create) the database, its schema and the checkpoint thread; a
        directory's database only after taking its process lock."""
        if self.memory:
            db = MEMORY
        else:
            os.makedirs(self.path, exist_ok=True)
            self._acquire_process_lock()
            db = os.path.join(self.path, DB_FILE)
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
            raise AdapterError(f"cannot open embedded store {self.path!r}: {exc}") from exc
        self._db_file = db
        self._stop_checkpoints = threading.Event()
        self._checkpointer = None
        if not self.memory:
            self._checkpointer = threading.Thread(
                target=self._checkpoint_loop, name=f"wsnmom-checkpoint-{self.path}", daemon=True
            )
            self._checkpointer.start()

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
        self._dir_lock = lock_directory(self.path, LOCK_FILE, "embedded store")

    def _release_process_lock(self) -> None:
        if self._dir_lock is not None:
            self._dir_lock.release()
            self._dir_lock = None

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
                if not self._closed and self._batch is None:
                    self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

    def _vacuum_step(self) -> None:
        """Give the pages of deleted messages back to the filesystem, a step at a time
        (``wsnmom.core.sqlite_space``; the checkpoint that follows shrinks the file)."""
        for _ in range(_VACUUM_STEPS):
            with self.lock:  # released between steps: publishes and takes go on
                if self._closed or self._batch is not None or not vacuum_step(self.conn):
                    return

    @property
    def closed(self) -> bool:
        return self._closed

    @contextlib.contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; call with ``self.lock`` held."""
        if self._closed:
            raise AdapterUnavailable("the embedded adapter is closed")
        self.end_batch()
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

    def end_batch(self) -> None:
        """Commit the restore's shared transaction of new subscriptions, if one is open
        (:meth:`Subscriptions._insert_batched`; call with ``self.lock`` held).  When the
        commit fails, its subscriptions are forgotten (a later attach makes them again)
        and ``restored`` reports the failure."""
        if self._batch is None:
            return
        try:
            self.conn.execute("COMMIT")
        except BaseException as exc:
            self._batch_error = exc
            self._abort_batch()
            raise
        self._batch = None

    def _abort_batch(self) -> None:
        """Roll the restore's shared transaction back and forget its subscriptions."""
        batch, self._batch = self._batch, None
        if self.conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self.conn.execute("ROLLBACK")
        if batch:
            self._forget(batch)
            if self._batch_error is None:
                self._batch_error = AdapterError(
                    f"{len(batch)} new durable subscription(s) were rolled back"
                )

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
        decref(c, [mid for _, mid in gone])

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
        except sqlite3.Error as exc:
            self.ping_error = f"its database does not answer: {exc}"
            return False
        self.ping_error = ""
        return True


def _synchronous(value: str) -> str:
    v = str(value).upper()
    if v not in {"OFF", "NORMAL", "FULL", "EXTRA"}:
        raise ValueError(f"synchronous must be NORMAL or FULL, not {value!r}")
    return v
