"""The delivery positions of durable subscriptions in a PostgreSQL store (schema 11),
each write fenced by its shard's epoch in the write's own statement
(``core.position_fence``; docs/scale-out.md, "What fences what today").

``wsnmom_positions (name, stream, part, position)``: one row per durable subscription
(its name) and stream of a log-based middleware (a Kafka topic partition).
:meth:`PostgresPositions.save` upserts the rows of a whole save pass in one statement
(arrays, ``unnest``) that first locks the shard rows it names ``FOR SHARE``, in shard
order, and writes only the rows whose (shard, epoch) is still the shard row's.  A
takeover (``UPDATE wsnmom_shards ... epoch = epoch + 1``, ``core.coordination_postgres``)
and such a write serialise on the shard row: a write that waited for a takeover's commit
sees the new row version (READ COMMITTED re-checks a locked row) and is refused; a
takeover that finds the row locked by a write skips it (``SKIP LOCKED``) and takes it at
its next heartbeat, after the write committed.  The epoch alone is the token: a clean
hand-back leaves it as it was, so the final positions of a shard handed back still land
until another instance takes it.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from wsnmom.core.adapter import Stream
from wsnmom.core.position_fence import FencedRow

if TYPE_CHECKING:
    from wsnmom.core.store_postgres import PostgresStore

__all__ = ["PostgresPositions"]

_SAVE = (
    "WITH w AS (SELECT * FROM unnest("
    "%s::text[], %s::text[], %s::int[], %s::bigint[], %s::int[], %s::bigint[]"
    ") AS w(name, stream, part, position, shard, epoch)), "
    "fence AS (SELECT shard, epoch FROM wsnmom_shards WHERE shard = ANY(%s::int[]) "
    "ORDER BY shard FOR SHARE), "
    "saved AS (INSERT INTO wsnmom_positions (name, stream, part, position) "
    "SELECT w.name, w.stream, w.part, w.position FROM w "
    "JOIN fence f ON f.shard = w.shard AND f.epoch = w.epoch "
    "ON CONFLICT (name, stream, part) DO UPDATE SET position = EXCLUDED.position "
    "RETURNING 1) "
    "SELECT DISTINCT w.name FROM w WHERE NOT EXISTS "
    "(SELECT 1 FROM fence f WHERE f.shard = w.shard AND f.epoch = w.epoch)"
)


def _grouped(rows: list[Any]) -> dict[str, dict[Stream, int]]:
    out: dict[str, dict[Stream, int]] = {}
    for name, stream, part, position in rows:
        out.setdefault(str(name), {})[(str(stream), int(part))] = int(position)
    return out


class PostgresPositions:
    """``core.position_fence.PositionTable`` in PostgreSQL (see the module docstring)."""

    def __init__(self, store: PostgresStore) -> None:
        self._store = store

    def load(self, names: Collection[str]) -> dict[str, dict[Stream, int]]:
        with self._store.statement() as conn:
            rows = conn.execute(
                "SELECT name, stream, part, position FROM wsnmom_positions "
                "WHERE name = ANY(%s::text[])",
                (list(names),),
            ).fetchall()
        return _grouped(rows)

    def load_all(self) -> dict[str, dict[Stream, int]]:
        with self._store.statement() as conn:
            rows = conn.execute(
                "SELECT name, stream, part, position FROM wsnmom_positions"
            ).fetchall()
        return _grouped(rows)

    def names(self) -> set[str]:
        with self._store.statement() as conn:
            rows = conn.execute("SELECT DISTINCT name FROM wsnmom_positions").fetchall()
        return {str(r[0]) for r in rows}

    def save(self, rows: Collection[FencedRow]) -> set[str]:
        if not rows:
            return set()
        columns = list(zip(*rows, strict=True))
        shards = sorted({int(s) for s in columns[4]})
        with self._store.statement() as conn:
            refused = conn.execute(_SAVE, (*[list(c) for c in columns], shards)).fetchall()
        return {str(r[0]) for r in refused}

    def delete(self, names: Collection[str]) -> None:
        with self._store.statement() as conn:
            conn.execute(
                "DELETE FROM wsnmom_positions WHERE name = ANY(%s::text[])", (list(names),)
            )
