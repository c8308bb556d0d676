"""The cluster's tables in a PostgreSQL store (schema version 3, ``core.store_postgres``).

* ``wsnmom_changes``: a trigger on subscriptions, pull points and registrations logs every
  write with the writer's ``application_name`` (its instance id) and sends a NOTIFY on
  ``wsnmom_changes`` whose payload is that id (schema 7; the kind before).
  :meth:`PostgresCoordination.changes` reads what other instances wrote; rows younger than
  :data:`SETTLE` seconds are read again on every call (a transaction that took a lower
  ``seq`` may commit after a higher one), and the ones seen are remembered, so nothing is
  missed or applied twice.  This instance's own rows stay in the server (only the highest
  settled ``seq`` comes back, to move the cursor), and its own NOTIFYs do not end
  :meth:`PostgresCoordination.wait`: a burst of writes through one instance costs it no
  reading of the log it wrote (docs/scale-out.md, "What cluster mode costs").
* ``wsnmom_instances``: id, address, version, heartbeat (the store's clock).
* ``wsnmom_shards``: one row per shard with its owner, epoch and lease expiry.  A
  heartbeat renews this instance's unexpired leases and takes free or expired ones up to
  its fair share (shards / live instances, rounded up); taking a shard bumps its epoch
  (the fencing token).  Above its fair share (an instance joined) it releases the rest
  after it stopped delivering them.
* ``wsnmom_meta`` row ``cluster_secret``: the secret instances sign forwarded requests
  with, made by the first instance that asks (``secret``).
* ``wsnmom_nonces`` (schema 6): the nonce of every forwarded request served, with its
  expiry; a nonce is inserted once (:meth:`PostgresCoordination.first_use`), so a request
  replayed to any instance is refused.  The leader deletes those expired for longer than
  :data:`NONCE_MARGIN` (by the store's clock) at a heartbeat every :data:`PRUNE_EVERY`
  seconds, and the store refuses a nonce expired that long (an instance whose clock is
  behind judged it valid; its record may be gone), so a replay is never taken for a first
  use, whatever the clocks.
* Two dedicated connections besides the store's pool: one LISTENs (the follow thread
  waits on it, ``wait``), the other holds the leadership, a session-level advisory lock
  (the heartbeat thread takes it, ``lead``): when the process dies the connection goes and
  so does the lock.  One connection each, because psycopg holds a connection's lock for
  the whole of a wait for notifications: on a shared one, taking the leadership waited
  for the poll.  Their statements are cut by the store's deadline watcher
  (``core.store_postgres_deadline``) like the pool's calls: a backend that stops
  answering (stopped, or a network that no longer carries its packets) would otherwise
  hold the heartbeat thread on the leader's ``SELECT 1`` for as long as it stays so (no
  renewal, no giving up); the leadership's within :data:`BEAT_SHARE` of a lease (then
  the instance gives the leadership up and connects again at its next heartbeat), the
  LISTEN within the store's call timeout.  The heartbeat's transaction and a release run
  on the pool within the same share of a lease, not the store's call timeout (longer
  than a lease by default).
* ``wsnmom_leadership`` (schema 9): one row, the leadership's epoch.  An instance that
  takes the lock bumps it on the lock's connection before it acts as the leader; the
  leader's writes of demand-based registrations carry the epoch they were begun under and
  are made only while it is still the row's (``PostgresStore.save_registration_demand``),
  so a leader deposed while a call to a publisher was in flight (its lock's connection
  ended) cannot overwrite what its successor saved.
"""

from __future__ import annotations

import logging
import math
import secrets
import selectors
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from wsnmom.core.coordination import Change, InstanceInfo, InstanceRefused, Leases

if TYPE_CHECKING:
    from wsnmom.core.positions_postgres import PostgresPositions
    from wsnmom.core.store_postgres import PostgresStore

__all__ = ["LEADER_LOCK", "SETTLE", "PostgresCoordination"]

log = logging.getLogger(__name__)

#: the advisory-lock key of the leadership ("wsnl" as a number)
LEADER_LOCK = 0x77736E6C
#: seconds after which a change-log row counts as settled (no lower seq still to commit)
SETTLE = 5.0
#: change-log rows older than this are deleted by the leader
KEEP_CHANGES = "1 hour"
#: nonces are deleted this long after their expiry (the store's clock may be behind the
#: clocks that judged them, by up to a signature's validity)
NONCE_MARGIN = "60 seconds"
#: how long the leader's pruning waits for a lock on the change log or the nonces
PRUNE_LOCK_WAIT = "200ms"
#: seconds between the leader's prunings (its first heartbeat as leader prunes; five
#: round trips, which at every heartbeat were half of an idle leader's wake-ups)
PRUNE_EVERY = 30.0
CHANNEL = "wsnmom_changes"
#: shard rows an instance updates are locked in shard order, as a position save locks
#: them (``core.positions_postgres``): two statements that lock several of them in the
#: same order never deadlock
_IN_ORDER = "ORDER BY shard FOR UPDATE"
#: the lease assumed before the first heartbeat (``cluster.lease``'s default)
DEFAULT_LEASE = 10.0
#: the share of a lease each store call of the heartbeat thread may take: the heartbeat's
#: transaction, a release, each statement on the leadership's connection (and the
#: server's bound on the heartbeat transaction's idleness).  A call cut then is retried
#: at the next beat, on another connection, before the leases' local deadline (lease
#: minus at most a quarter): one backend that stops answering costs no shard
BEAT_SHARE = 0.5


class PostgresCoordination:
    """:class:`~wsnmom.core.coordination.Coordination` in PostgreSQL (see the module
    docstring).  ``changes`` and ``wait`` are called from one thread (the cluster
    member's follow thread), ``heartbeat``, ``release`` and ``lead`` from another (its
    heartbeat thread); ``instances`` from any."""

    shared = True

    def __init__(self, store: PostgresStore, url: str, instance_id: str) -> None:
        self._store = store
        self._url = url
        self.instance_id = instance_id
        #: the dedicated connections: LISTEN (follow thread), the leadership (heartbeat)
        self._listening: Any = None
        self._leading: Any = None
        self._leader = False
        #: the leadership's epoch this instance took it with (None: it does not lead)
        self._epoch: int | None = None
        self._seen: set[int] = set()
        self._seeded = False
        #: monotonic time of the last pruning (``_prune``), -inf: none yet
        self._pruned_at = -math.inf
        self._address = ""
        self._version = ""
        #: the lease of the last heartbeat (``lead`` bounds its connection's idleness by it)
        self._lease = DEFAULT_LEASE

    # -- the dedicated connections: LISTEN and the leadership -----------------------------
    def _connect(self, role: str) -> Any:
        import psycopg

        return psycopg.connect(
            self._url,
            autocommit=True,
            connect_timeout=5,
            application_name=f"{self.instance_id}/{role}",
        )

    def _listen(self) -> Any:
        if self._listening is None or self._listening.closed:
            connection = self._connect("listen")
            try:
                self._bounded(connection, self._store.call_timeout, f"LISTEN {CHANNEL}")
            except BaseException:
                _close(connection)
                raise
            self._listening = connection
        return self._listening

    def _bounded(
        self, connection: Any, seconds: float, sql: str, params: tuple[Any, ...] = ()
    ) -> Any:
        """One statement on a dedicated connection, whose socket is shut down when the
        answer has not come within ``seconds`` (psycopg's wait then ends with an
        ``OperationalError``)."""
        with self._store.deadline(connection, seconds):
            return connection.execute(sql, params)

    def _beat_bound(self) -> float:
        """Seconds each store call of the heartbeat thread may take (:data:`BEAT_SHARE`)."""
        return min(self._store.call_timeout, self._lease * BEAT_SHARE)

    def _drop_listening(self) -> None:
        connection, self._listening = self._listening, None
        _close(connection)

    def _drop_leading(self) -> None:
        if self._leader:
            log.warning("instance %s lost the leadership (store connection lost)", self.instance_id)
        self._leader = False
        self._epoch = None
        connection, self._leading = self._leading, None
        _close(connection)

    def wait(self, timeout: float) -> None:
        """Return once another instance's NOTIFY arrived, or after ``timeout`` seconds.

        The thread sleeps on the connection's socket, woken only by what the server sends:
        psycopg's own wait for notifications (``notifies(timeout=...)``) wakes every 0.1 s
        to look for a Ctrl-C, ten wake-ups a second of an idle follow thread, each asking
        for the GIL while request and delivery threads hold it (docs/performance.md, "What
        wakes an idle cluster instance").  ``notifies(timeout=0)`` takes what arrived
        without waiting (those received meanwhile on the connection first)."""
        import psycopg

        deadline = time.monotonic() + timeout
        try:
            connection = self._listen()
            with selectors.DefaultSelector() as selector:
                selector.register(connection.fileno(), selectors.EVENT_READ)
                while True:
                    for note in connection.notifies(timeout=0):
                        if note.payload != self.instance_id:
                            return  # another instance's write (or an older release's: the kind)
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return
                    selector.select(remaining)
        except psycopg.Error:
            self._drop_listening()
            raise

    def lead(self) -> bool:
        """Take the leadership when it is free; while held, check that its connection
        (and so the lock) is still there: a round trip per heartbeat, which notices a
        connection the store dropped (the LISTEN connection's waits did, when one
        connection did both)."""
        import psycopg

        bound = self._beat_bound()
        try:
            if self._leader:
                self._bounded(self._leading, bound, "SELECT 1")
                return True
            if self._leading is None or self._leading.closed:
                self._leading = self._connect("leader")
                # a leader stopped (SIGSTOP, a frozen host) keeps its session, and so the
                # lock, alive on the server: nobody did the periodic work while it stayed
                # stopped.  Its connection asks "SELECT 1" at every heartbeat, so one idle
                # for a lease belongs to a stopped process: the server ends it
                try:
                    self._bounded(
                        self._leading,
                        bound,
                        "SELECT set_config('idle_session_timeout', %s, false)",
                        (str(max(1000, int(self._lease * 1000))),),
                    )
                except psycopg.errors.UndefinedObject:  # before PostgreSQL 14
                    log.debug("this PostgreSQL has no idle_session_timeout")
            row = self._bounded(
                self._leading, bound, "SELECT pg_try_advisory_lock(%s)", (LEADER_LOCK,)
            )
            if not row.fetchone()[0]:
                return False
            # the next epoch, on the lock's connection: a write of a leader before, made
            # under the old epoch, either committed before this (the first pass as leader
            # reads it) or is refused after.  Cut after its bound (a save in progress
            # holds the row longer): the session ends, and with it the lock
            bumped = self._bounded(
                self._leading,
                bound,
                "UPDATE wsnmom_leadership SET epoch = epoch + 1, holder = %s RETURNING epoch",
                (self.instance_id,),
            ).fetchone()
        except psycopg.Error:
            self._drop_leading()
            return False
        self._leader, self._epoch = True, int(bumped[0])
        log.info(
            "instance %s took the leadership (periodic work), epoch %d",
            self.instance_id,
            self._epoch,
        )
        return True

    def epoch(self) -> int | None:
        return self._epoch if self._leader else None

    # -- the change log -------------------------------------------------------------------
    def cursor(self) -> int:
        with self._store.statement() as conn:
            row = conn.execute("SELECT coalesce(max(seq), 0) FROM wsnmom_changes").fetchone()
        return int(row[0])

    def changes(self, cursor: int) -> tuple[int, list[Change]]:
        # one statement: the other instances' rows after the cursor, and one row (kind
        # NULL) with the highest settled seq of all, this instance's own rows included
        with self._store.statement() as conn:
            rows = conn.execute(
                "WITH fresh AS (SELECT seq, kind, id, origin, at FROM wsnmom_changes "
                "WHERE seq > %s) "
                "SELECT seq, kind, id FROM fresh WHERE origin <> %s "
                "UNION ALL SELECT max(seq), NULL, NULL FROM fresh "
                "WHERE at < clock_timestamp() - make_interval(secs => %s) "
                "ORDER BY 1",
                (cursor, self.instance_id, SETTLE),
            ).fetchall()
        out: list[Change] = []
        low = cursor
        for seq, kind, rid in rows:
            if seq is None:
                continue  # nothing settled yet
            if kind is None:
                low = max(low, int(seq))
            elif seq not in self._seen:
                self._seen.add(seq)
                change = Change(str(kind), str(rid))
                if change not in out:
                    out.append(change)
        self._seen = {s for s in self._seen if s > low}
        return low, out

    # -- instances and leases -------------------------------------------------------------
    def join(self, address: str, version: str, *, single_instance: bool) -> None:
        self._address, self._version = address, version
        with self._store.transaction() as conn:
            if single_instance:
                row = conn.execute(
                    "SELECT id FROM wsnmom_instances WHERE id <> %s "
                    "AND heartbeat > now() - interval '1 minute' LIMIT 1",
                    (self.instance_id,),
                ).fetchone()
                if row is not None:
                    raise InstanceRefused(
                        f"instance {row[0]!r} is live on this store, and this adapter "
                        "serves one instance only (its subscriptions' messages are in one "
                        "process's data directory, as the embedded adapter's are); stop "
                        "it, or use RabbitMQ, Kafka or MQTT 5 to run several"
                    )
            self._beat(conn)

    def _beat(self, conn: Any) -> None:
        conn.execute(
            "INSERT INTO wsnmom_instances (id, address, version, heartbeat) "
            "VALUES (%s, %s, %s, now()) ON CONFLICT (id) DO UPDATE SET heartbeat = now(), "
            "address = EXCLUDED.address, version = EXCLUDED.version",
            (self.instance_id, self._address, self._version),
        )

    def _prune(self, conn: Any) -> None:
        """The leader's pruning of old change-log rows and nonces, inside the heartbeat's
        transaction but in a savepoint that waits at most :data:`PRUNE_LOCK_WAIT` for its
        locks: a table locked by someone else (a long reader, an operator's maintenance)
        postpones the pruning to a later beat instead of holding the lease renewal back."""
        import psycopg

        try:
            with conn.transaction():
                conn.execute(f"SET LOCAL lock_timeout = '{PRUNE_LOCK_WAIT}'")
                conn.execute(
                    f"DELETE FROM wsnmom_changes WHERE at < now() - interval '{KEEP_CHANGES}'"
                )
                conn.execute(
                    "DELETE FROM wsnmom_nonces "
                    f"WHERE expires_at < now() - interval '{NONCE_MARGIN}'"
                )
            self._pruned_at = time.monotonic()
        except psycopg.errors.LockNotAvailable:
            log.debug("pruning the change log postponed: a table is locked")

    def heartbeat(self, shards: int, lease: float) -> Leases:
        me = self.instance_id
        self._lease = lease
        taken_over: list[int] = []
        with self._store.transaction(self._beat_bound()) as conn:
            self._beat(conn)
            if not self._seeded:
                conn.execute(
                    "INSERT INTO wsnmom_shards (shard, owner, epoch, expires_at) "
                    "SELECT g, NULL, 0, now() FROM generate_series(0, %s - 1) g "
                    "ON CONFLICT (shard) DO NOTHING",
                    (shards,),
                )
            # before the shard rows are locked: a heartbeat stopped inside this
            # transaction (SIGSTOP, a host frozen) would hold them locked, and the others'
            # take-over skips locked rows, so the server ends such a session after half
            # a lease (its shards are then taken over when their lease ends, as a dead
            # instance's are); seen in the HA suite on Kafka under load
            live_row = conn.execute(
                "SELECT (SELECT count(*) FROM wsnmom_instances "
                "WHERE heartbeat > now() - make_interval(secs => %s)), "
                "set_config('idle_in_transaction_session_timeout', %s, true)",
                (lease, str(max(100, int(lease * BEAT_SHARE * 1000)))),
            ).fetchone()
            live = max(1, int(live_row[0]))
            fair = math.ceil(shards / live)
            held = {
                int(s): int(e)
                for s, e in conn.execute(
                    "UPDATE wsnmom_shards SET expires_at = now() + make_interval(secs => %s) "
                    "WHERE shard IN (SELECT shard FROM wsnmom_shards "
                    "WHERE owner = %s AND expires_at > now() AND shard < %s "
                    f"{_IN_ORDER}) RETURNING shard, epoch",
                    (lease, me, shards),
                ).fetchall()
            }
            if len(held) < fair:
                taken = conn.execute(
                    "UPDATE wsnmom_shards s SET owner = %s, epoch = s.epoch + 1, "
                    "expires_at = now() + make_interval(secs => %s) FROM ("
                    "  SELECT shard, owner FROM wsnmom_shards WHERE shard < %s "
                    "  AND (owner IS NULL OR expires_at <= now()) "
                    "  ORDER BY shard LIMIT %s FOR UPDATE SKIP LOCKED) f "
                    "WHERE s.shard = f.shard RETURNING s.shard, s.epoch, f.owner",
                    (me, lease, shards, fair - len(held)),
                ).fetchall()
                for s, e, previous in taken:
                    held[int(s)] = int(e)
                    if previous is not None and previous != me:
                        taken_over.append(int(s))
            if self._leader and time.monotonic() >= self._pruned_at + PRUNE_EVERY:
                self._prune(conn)
        self._seeded = True
        released: tuple[int, ...] = ()
        if len(held) > fair:
            released = tuple(sorted(held)[fair:])
            for s in released:
                del held[s]
        return Leases(held, released, tuple(s for s in taken_over if s in held))

    def release(self, shards: Sequence[int]) -> None:
        if not shards:
            return
        with self._store.statement(self._beat_bound()) as conn:
            conn.execute(
                "UPDATE wsnmom_shards SET owner = NULL, expires_at = now() "
                "WHERE shard IN (SELECT shard FROM wsnmom_shards "
                f"WHERE owner = %s AND shard = ANY(%s) {_IN_ORDER})",
                (self.instance_id, list(shards)),
            )

    def instances(self) -> list[InstanceInfo]:
        with self._store.statement() as conn:
            rows = conn.execute(
                "SELECT i.id, i.address, i.version, "
                "extract(epoch FROM now() - i.heartbeat), "
                "coalesce(array_agg(array[s.shard, s.epoch]::bigint[] ORDER BY s.shard) "
                "FILTER (WHERE s.shard IS NOT NULL), '{}'), "
                "extract(epoch FROM min(s.expires_at) - now()) "
                "FROM wsnmom_instances i LEFT JOIN wsnmom_shards s "
                "ON s.owner = i.id AND s.expires_at > now() "
                "GROUP BY i.id ORDER BY i.heartbeat DESC"
            ).fetchall()
        return [
            InstanceInfo(
                str(r[0]),
                str(r[1]),
                str(r[2]),
                float(r[3]),
                tuple((int(p[0]), int(p[1])) for p in (r[4] or [])),
                None if r[5] is None else max(0.0, float(r[5])),
            )
            for r in rows
        ]

    def leave(self) -> None:
        try:
            with self._store.transaction() as conn:
                conn.execute(
                    "UPDATE wsnmom_shards SET owner = NULL, expires_at = now() "
                    "WHERE shard IN (SELECT shard FROM wsnmom_shards "
                    f"WHERE owner = %s {_IN_ORDER})",
                    (self.instance_id,),
                )
                conn.execute("DELETE FROM wsnmom_instances WHERE id = %s", (self.instance_id,))
        except Exception:
            log.warning("instance %s: leaving the cluster failed", self.instance_id, exc_info=True)
        self._drop_leading()
        self._drop_listening()

    def positions(self) -> PostgresPositions:
        """The positions table, fenced by the shards' epochs (``core.positions_postgres``)."""
        from wsnmom.core.positions_postgres import PostgresPositions

        return PostgresPositions(self._store)

    def secret(self) -> str:
        with self._store.transaction() as conn:
            conn.execute(
                "INSERT INTO wsnmom_meta (key, value) VALUES ('cluster_secret', %s) "
                "ON CONFLICT (key) DO NOTHING",
                (secrets.token_hex(32),),
            )
            row = conn.execute(
                "SELECT value FROM wsnmom_meta WHERE key = 'cluster_secret'"
            ).fetchone()
        return str(row[0])

    def first_use(self, nonce: str, expires_at: float) -> bool:
        # a nonce the leader may have deleted already (its expiry beyond the margin by the
        # store's clock: the judging instance's clock is behind) is refused, recorded or
        # not: its replay could not be told from a first use
        with self._store.statement() as conn:
            inserted = conn.execute(
                "INSERT INTO wsnmom_nonces (nonce, expires_at) "
                "SELECT %s, to_timestamp(%s) "
                f"WHERE to_timestamp(%s) >= now() - interval '{NONCE_MARGIN}' "
                "ON CONFLICT (nonce) DO NOTHING",
                (nonce, expires_at, expires_at),
            ).rowcount
        return bool(inserted == 1)


def _close(connection: Any) -> None:
    if connection is not None:
        try:
            connection.close()
        except Exception:
            log.debug("closing a dedicated store connection failed", exc_info=True)
