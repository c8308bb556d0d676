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

Code layout: :class:`Engine` combines parts of one job each, over the state that
:class:`~wsnmom.adapters.embedded.parts.EngineParts` declares: :mod:`.storage` (the
database, checkpoints, transactions and group-committed acks), :mod:`.subscriptions`,
:mod:`.publish`, :mod:`.queues` (hand-outs, takes, settles, peeks, depths),
:mod:`.limits` (expiry and overflow), :mod:`.dead_letters`, :mod:`.outbox` and
:mod:`.dispatch`; :mod:`.records` holds the schema, the SQL and the records they pass.
"""

from __future__ import annotations

import collections
import contextlib
import os
import sqlite3
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from wsnmom.topic_mapping.index import TopicIndex
from wsnmom.topic_mapping.model import Topic

from .dead_letters import DeadLetters
from .dispatch import Dispatch
from .limits import Limits
from .outbox import Outbox
from .publish import Publishing
from .queues import Queues
from .records import MEMORY
from .storage import Storage, _synchronous
from .subscriptions import Subscriptions

if TYPE_CHECKING:
    pass


class Engine(Storage, Subscriptions, Publishing, Queues, Limits, DeadLetters, Outbox, Dispatch):
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
        self.on_outbox = None
        self._outboxed = False
        self._parking = False
        #: keep the current message per topic (``current`` table); False for a queue store
        #: whose middleware keeps it elsewhere (the MQTT adapter: the broker's retained
        #: messages)
        self.keep_current = keep_current
        self.memory = path == MEMORY
        self.lock = threading.RLock()
        #: messages a limit dropped in the current transaction, for their subscriptions'
        #: dead-letter topics (:meth:`_bury`, written by :meth:`_inter` before the commit)
        self._graves = []
        #: dead letters were written since ``publish_many`` last learnt the next message id
        self._interred = False
        self.users = 0
        self._dir_lock = None
        #: acked (sub, mid) rows not yet deleted: applied at the start of the next
        #: transaction (group commit); a crash before that redelivers them
        self._pending_acks = []
        #: what ``next_message_id`` would answer, known after a publish committed (only
        #: ``publish_many`` inserts messages); None = ask the database
        self._next_mid = None
        #: the ``current`` table's mid per (namespace, path) as read or written by
        #: committed publishes (only ``publish_many`` writes that table); _INLINE when the
        #: row holds the message itself
        self._current_mids = {}
        self._closed = False
        self._batch = None
        self._batch_error = None
        self._open_database(synchronous)
        self._stranded = self.conn.execute("SELECT 1 FROM stranded LIMIT 1").fetchone() is not None
        self.index = TopicIndex()
        self.match_all = set()
        self.subs = {}
        self.by_name = {}
        #: started push handles per subscription id
        self.started = collections.defaultdict(set)
        self._recover()
        # dispatcher
        self._cv = threading.Condition()
        self._ready = collections.deque()
        self._queued = set()
        self._dispatcher = None
        self._holding = 0
        # pull waiters
        self._arrival = threading.Condition()
        self._arrivals = 0

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
            with contextlib.suppress(sqlite3.Error):
                self.end_batch()
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
