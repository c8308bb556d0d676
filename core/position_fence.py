"""Delivery positions kept in the shared store, each write fenced by its shard's epoch
(cluster mode on PostgreSQL; docs/scale-out.md, "What fences what today").

:class:`FencedPositions` is the :class:`~wsnmom.core.adapter.PositionKeeper` core hands
the adapter (``Adapter.positions_kept_by``).  A write carries, per name, the token core
gives it (``ClusterParts.token``: the shard the name is fenced by and the epoch this
instance holds it with, a clean hand-back's during its grace), and the store's
:class:`PositionTable` writes it in one statement only where that shard's epoch is still
the one carried (``core.positions_postgres``).  A name without a token is refused
without asking the store, as ``may_save`` refuses it; each refused name comes back with
why (``NOT_HELD``, ``TAKEN_OVER``), for the adapter's log line.  A store only one instance opens
(SQLite) has no such table: nobody else can take a shard there, and the adapter keeps its
positions in the middleware as before.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Protocol

from wsnmom.core.adapter import Stream

__all__ = ["NOT_HELD", "TAKEN_OVER", "FencedPositions", "FencedRow", "PositionTable"]

#: why a name is refused (``FencedPositions.save``): no token, so the store is not asked
NOT_HELD = "this instance no longer holds its shard"
#: why a name is refused: the store found its shard at another epoch than the token's
TAKEN_OVER = "another instance took its shard over (the store refused the write)"

#: one stream's position to write: name, log, partition, offset, shard, epoch
FencedRow = tuple[str, str, int, int, int, int]


class PositionTable(Protocol):
    """The store's table of positions (``core.positions_postgres``)."""

    def load(self, names: Collection[str]) -> dict[str, dict[Stream, int]]:
        """The rows of these names."""

    def load_all(self) -> dict[str, dict[Stream, int]]:
        """Every row."""

    def names(self) -> set[str]:
        """The names that have rows (the orphan sweep's listing, ``core.orphans``)."""

    def save(self, rows: Collection[FencedRow]) -> set[str]:
        """Upsert the rows whose (shard, epoch) is still the shard's, in one statement
        that locks those shard rows; the names of the others."""

    def delete(self, names: Collection[str]) -> None:
        """Delete the rows of these names."""


class FencedPositions:
    """``PositionKeeper`` over a :class:`PositionTable` (see the module docstring)."""

    def __init__(
        self, table: PositionTable, token: Callable[[str], tuple[int, int] | None]
    ) -> None:
        self._table = table
        self._token = token

    def load(self, names: Collection[str]) -> dict[str, dict[Stream, int]]:
        return self._table.load(names) if names else {}

    def load_all(self) -> dict[str, dict[Stream, int]]:
        return self._table.load_all()

    def save(self, changes: Mapping[str, Mapping[Stream, int]]) -> dict[str, str]:
        refused: dict[str, str] = {}
        rows: list[FencedRow] = []
        for name, positions in changes.items():
            token = self._token(name)
            if token is None:
                refused[name] = NOT_HELD
                continue
            shard, epoch = token
            rows.extend(
                (name, log, part, offset, shard, epoch)
                for (log, part), offset in positions.items()
                if offset >= 0
            )
        if rows:
            refused.update(dict.fromkeys(self._table.save(rows), TAKEN_OVER))
        return refused

    def delete(self, names: Collection[str]) -> None:
        if names:
            self._table.delete(names)
