"""The PostgreSQL store's connections (``core.store_postgres``): the pool, the recovery
when the server comes back, the transactions, and the schema's migration at start.

Opened for ``postgresql://user:password@host:port/database`` (``postgres://`` too) through
psycopg 3 with a connection pool (extra ``postgres``).  :class:`PostgresConnections` is the
base class of :class:`~wsnmom.core.store_postgres.PostgresStore`: it connects, migrates
(``core.store_postgres_schema``) and hands out pooled connections, in autocommit
(:meth:`~PostgresConnections._conn`) or in one transaction (:meth:`~PostgresConnections._tx`).

Connection trouble surfaces as :class:`~wsnmom.core.store.StoreUnavailable` (a
:class:`~wsnmom.core.store.StoreError`): the frontend answers it with a Receiver fault
and HTTP 503, and ``ping`` (``/readyz``) says the store is not answering.  While the
server is down, uses fail at once except for one probe per :data:`PROBE_INTERVAL`.
Every call has a deadline (:data:`CALL_TIMEOUT`, ``core.store_postgres_deadline``); a
listing of every record is read in pages, each with that deadline (:data:`LIST_PAGE`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any
from urllib.parse import urlsplit

from wsnmom.core.redaction import redact_url
from wsnmom.core.store import StoreError, StoreUnavailable
from wsnmom.core.store_postgres_deadline import Deadlines
from wsnmom.core.store_postgres_schema import MIGRATION_LOCK, MIGRATIONS, SCHEMA_VERSION

#: seconds a connection attempt may take before the store counts as unreachable
CONNECT_TIMEOUT = 5.0
#: seconds a request waits for a pooled connection before the store counts as overloaded
POOL_TIMEOUT = 10.0
#: while the server is down, seconds between the connection attempts that look for it
PROBE_INTERVAL = 1.0
#: seconds a store call may wait for the server's answers before its connection is cut
#: and the store counts as unreachable (``core.store_postgres_deadline``; the migration
#: at start, which may wait for another instance's, is not bounded)
CALL_TIMEOUT = 15.0
#: seconds ``ping`` (``/readyz``) waits
PING_TIMEOUT = 5.0
#: rows of a listing read per round trip (:meth:`PostgresConnections._listing`): each page
#: has the call timeout, not the whole listing.  100,000 subscriptions took up to 11 s in
#: one call at load 5 (most of it psycopg decoding the documents), near the 15 s deadline
#: (docs/scale-out.md, "A start's listings and the store's deadline")
LIST_PAGE = 5000


def session_options(url: str) -> str:
    """The connections' ``options``: JIT compilation off, then whatever the store's URL
    sets (which wins).  The store's statements are short, and a first JIT in a server
    process loads LLVM and compiles inside a call's timeout (50-120 ms measured; a listing
    page of a large table is costed above ``jit_above_cost``)."""
    from psycopg.conninfo import conninfo_to_dict

    given = conninfo_to_dict(url).get("options")
    return f"-c jit=off {given}" if given else "-c jit=off"


def check_url(url: str) -> None:
    """StoreError for a store URL libpq would read wrongly or not at all: a user name or
    password with an ``@``, ``/``, ``%`` or space that is not percent-encoded (``u:p@ss@h``
    reads as the host ``ss@h``, ``u:ab/cd@h`` as the host ``u`` and the port ``ab``).  The
    message never quotes the URL's parts: libpq's would quote pieces of the password."""
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict

    try:
        given = conninfo_to_dict(url)
    except ProgrammingError:
        unread = True
    else:
        ports = str(given.get("port") or "5432").split(",")
        unread = "@" in str(given.get("host", "")) or not all(p.isdigit() for p in ports)
    if unread:
        raise StoreError(
            f"the PostgreSQL store URL {redact_url(url)} cannot be read as "
            "postgresql://USER:PASSWORD@HOST:PORT/DATABASE: percent-encode the special "
            "characters of the user name and password (@ as %40, / as %2F, % as %25, "
            ": as %3A, ? as %3F, # as %23, a space as %20)"
        )


class PostgresConnections:
    """The pooled connections of a PostgreSQL store (see the module docstring)."""

    def __init__(
        self,
        url: str,
        *,
        min_size: int = 1,
        max_size: int = 8,
        instance_id: str = "",
        call_timeout: float = CALL_TIMEOUT,
    ) -> None:
        try:
            import psycopg
            import psycopg_pool  # noqa: F401
            from psycopg.types.json import Jsonb
        except ImportError as exc:
            raise StoreError(
                f"a PostgreSQL store needs psycopg 3 ({exc}): pip install 'wsnmom[postgres]'"
            ) from None
        check_url(url)
        parts = urlsplit(url)
        if not parts.hostname and "host=" not in parts.query:
            raise StoreError(f"PostgreSQL store URL without a host: {redact_url(url)}")
        self._psycopg = psycopg
        self._jsonb = Jsonb
        self._closed = False
        self._lock = threading.Lock()
        try:  # one plain attempt first: a refused connection fails at once, with its reason
            psycopg.connect(url, connect_timeout=int(CONNECT_TIMEOUT)).close()
        except psycopg.Error as exc:
            raise StoreUnavailable(f"cannot connect to the PostgreSQL store: {exc}") from None
        self._url = url
        self._sizes = (min_size, max_size)
        #: the connections' application_name: the origin of the changes this instance
        #: writes, which its own change follower skips
        self.instance_id = instance_id or "wsnmom"
        #: monotonic time of the last failed use while the server does not answer (None: up)
        self._down_since: float | None = None
        #: what the last failed use or probe met (``unavailable_reason``)
        self._why = ""
        self._last_probe = 0.0
        self._recovering = threading.Lock()
        self._call_timeout = call_timeout
        self._deadlines = Deadlines()
        try:
            self._pool = self._new_pool()
        except Exception as exc:  # psycopg_pool.PoolTimeout, psycopg.Error
            raise StoreUnavailable(f"cannot open the PostgreSQL store: {exc}") from None
        try:
            self._migrate()
        except BaseException:
            self._pool.close()
            self._deadlines.close()
            raise

    # ------------------------------------------------------------------ plumbing

    def _new_pool(self) -> Any:
        from psycopg_pool import ConnectionPool

        min_size, max_size = self._sizes
        pool = ConnectionPool(
            self._url,
            min_size=min_size,
            max_size=max_size,
            timeout=POOL_TIMEOUT,
            kwargs={
                "connect_timeout": int(CONNECT_TIMEOUT),
                # transactions are explicit (``_tx``); a lone statement commits by itself
                "autocommit": True,
                "application_name": self.instance_id,
                "options": session_options(self._url),
            },
            open=False,
            name="wsnmom-store",
        )
        pool.open(wait=True, timeout=CONNECT_TIMEOUT * 2)
        return pool

    def _require_server(self) -> None:
        """While the server was found down: refuse at once, except for one probe per
        :data:`PROBE_INTERVAL`; when the probe connects, start a fresh pool (the old one
        may be waiting out its reconnection backoff) and carry on."""
        if self._down_since is None:
            return
        now = time.monotonic()
        if now - self._last_probe < PROBE_INTERVAL or not self._recovering.acquire(False):
            raise StoreUnavailable(self._why or "the PostgreSQL store is not answering")
        try:
            self._last_probe = now
            try:
                self._psycopg.connect(self._url, connect_timeout=int(CONNECT_TIMEOUT)).close()
            except self._psycopg.Error as exc:
                self._why = f"the PostgreSQL store is not answering: {exc}"
                raise StoreUnavailable(self._why) from None
            old, self._pool = self._pool, self._new_pool()
            self._down_since = None
            old.close(timeout=0)
        finally:
            self._recovering.release()

    def _down(self, why: str) -> StoreUnavailable:
        if self._down_since is None:
            self._down_since = time.monotonic()
            self._last_probe = self._down_since
        self._why = why
        return StoreUnavailable(why)

    @property
    def call_timeout(self) -> float:
        """Seconds a store call may wait for the server's answers (:data:`CALL_TIMEOUT`)."""
        return self._call_timeout

    def deadline(self, conn: Any, seconds: float) -> AbstractContextManager[list[bool]]:
        """Cut ``conn`` (a connection of this store's, pooled or dedicated) if the block has
        not ended within ``seconds``: the one deadline watcher of the store's calls
        (``core.store_postgres_deadline``), for the coordination's dedicated connections."""
        return self._deadlines.bound(conn, seconds)

    def unavailable_reason(self) -> str | None:
        """What the last failed use or probe met while the server does not answer."""
        return self._why if self._down_since is not None else None

    @contextmanager
    def _tx(self, timeout: float | None = -1.0) -> Iterator[Any]:
        """A pooled connection inside one transaction (see :meth:`_conn`)."""
        with self._conn(timeout) as conn, conn.transaction():
            yield conn

    @contextmanager
    def _conn(self, timeout: float | None = -1.0) -> Iterator[Any]:
        """A pooled connection in autocommit: each statement is a transaction of its own,
        one round trip (a transaction block costs two more, BEGIN and COMMIT), so a
        single-statement write or read runs here, several that must commit together in
        :meth:`_tx`.  Connection trouble becomes StoreUnavailable (and later uses fail at
        once until a probe connects again), other database errors StoreError.  The block
        must end within ``timeout`` seconds (negative: the store's ``call_timeout``;
        None: no bound), or its connection is cut (``core.store_postgres_deadline``)."""
        if self._closed:
            raise StoreError("store is closed")
        self._require_server()
        psycopg = self._psycopg
        seconds = self._call_timeout if timeout is not None and timeout < 0 else timeout
        cut = [False]
        try:
            with self._pool.connection() as conn:
                with self._deadlines.bound(conn, seconds) as cut:
                    yield conn
                if cut[0]:  # cut as the block ended: the pool discards a closed one
                    conn.close()
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            if cut[0]:
                raise self._down(
                    f"the PostgreSQL store did not answer within {seconds:g} s"
                ) from None
            raise self._down(f"the PostgreSQL store is not answering: {exc}") from None
        except psycopg.Error as exc:
            raise StoreError(f"PostgreSQL store error: {exc}") from None
        except Exception as exc:
            if type(exc).__name__ == "PoolTimeout":
                raise self._down(
                    f"no PostgreSQL connection free within {POOL_TIMEOUT:.0f}s"
                ) from None
            raise

    def _rows(
        self, sql: str, params: tuple[Any, ...] = (), timeout: float = -1.0
    ) -> list[tuple[Any, ...]]:
        with self._conn(timeout) as conn:
            return list(conn.execute(sql, params).fetchall())

    def _listing(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Every row of a listing (a start's, the orphan sweep's), read in pages of
        :data:`LIST_PAGE` rows through a server-side cursor in one transaction (one query,
        one sort): each page must come within the call timeout, not the whole listing,
        whose time grows with the store.  A page cut: StoreUnavailable, as any call."""
        seconds = self._call_timeout
        rows: list[tuple[Any, ...]] = []
        cut = [False]
        try:
            with (
                self._conn(None) as conn,
                conn.transaction(),
                conn.cursor(name="wsnmom_listing") as cursor,
            ):
                with self.deadline(conn, seconds) as cut:
                    cursor.execute(sql, params)  # DECLARE: the rows come with the fetches
                while True:
                    with self.deadline(conn, seconds) as cut:
                        page = cursor.fetchmany(LIST_PAGE)
                    rows.extend(page)
                    if len(page) < LIST_PAGE:
                        return rows
        except StoreUnavailable:
            if cut[0]:
                raise self._down(
                    f"the PostgreSQL store did not answer within {seconds:g} s "
                    f"(a page of {LIST_PAGE} rows of a listing)"
                ) from None
            raise

    def _count(self, sql: str, params: tuple[Any, ...]) -> int:
        with self._conn() as conn:
            return int(conn.execute(sql, params).rowcount)

    def _migrate(self) -> None:
        with self._tx(None) as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            conn.execute(
                "CREATE TABLE IF NOT EXISTS wsnmom_schema ("
                "version INTEGER PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
            )
            row = conn.execute("SELECT max(version) FROM wsnmom_schema").fetchone()
            current = int(row[0]) if row and row[0] is not None else 0
            if current > SCHEMA_VERSION:
                raise StoreError(
                    f"store schema version {current} is newer than this wsnmom "
                    f"({SCHEMA_VERSION}); upgrade wsnmom"
                )
            for version in sorted(v for v in MIGRATIONS if v > current):
                for statement in MIGRATIONS[version]:
                    conn.execute(statement)
                conn.execute("INSERT INTO wsnmom_schema (version) VALUES (%s)", (version,))

    @property
    def schema_version(self) -> int:
        """The schema version recorded in the store."""
        return int(self._rows("SELECT max(version) FROM wsnmom_schema")[0][0])
