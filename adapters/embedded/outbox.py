"""The embedded engine's outbox: dead letters that another middleware is to get (the MQTT
adapter's queue store publishes them to the broker and then removes them) (see
:mod:`wsnmom.adapters.embedded.store`)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from wsnmom.core.adapter import (
    AdapterUnavailable,
    OutboundMessage,
)

from .parts import EngineParts
from .records import LETTER_COLUMNS, letter_of, letter_values


class Outbox(EngineParts):
    """The outbox table of an engine."""

    def _to_outbox(self, c: sqlite3.Connection, m: OutboundMessage) -> None:
        """Write the dead letter ``m`` to the outbox (inside the transaction that buried it;
        ``on_outbox`` is called once that transaction committed)."""
        c.execute(
            f"INSERT INTO outbox({LETTER_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)", letter_values(m)
        )
        self._outboxed = True

    def outbox_batch(self, limit: int) -> list[tuple[int, OutboundMessage]]:
        """The oldest ``limit`` dead letters waiting in the outbox (see ``outbox``), with
        their row ids for :meth:`outbox_remove`."""
        with self.lock:
            if self._closed:
                raise AdapterUnavailable("the embedded adapter is closed")
            rows = self.conn.execute(
                f"SELECT id, {LETTER_COLUMNS} FROM outbox ORDER BY id LIMIT ?", (limit,)
            ).fetchall()
        return [(rid, letter_of(*row)) for rid, *row in rows]

    def outbox_park(self, parked: Sequence[tuple[int, OutboundMessage]]) -> int:
        """Move outbox rows (id, the dead letter :meth:`outbox_batch` gave) that the other
        middleware refuses for good into the queues here of their topic's subscriptions
        (the gateway's dead-letter boxes), in one transaction, as if there were no
        outbox: they stay listed and counted, and wait here until replayed or purged.
        One with no queue of its topic (its box was deleted) is stranded instead
        (:mod:`.dead_letters`), kept until a box is opened again; returns how many were.

        The row id is the key: a row no longer in the outbox (parked already, by a call
        that failed after its commit and is repeated) is not queued again."""
        with self.lock:
            homeless = 0
            self._parking = True
            try:
                with self.tx() as c:
                    for rid, m in parked:
                        if c.execute("DELETE FROM outbox WHERE id = ?", (rid,)).rowcount:
                            self._graves.append(m)
                            homeless += not any(sid in self.subs for sid in self.targets(m.topic))
            finally:
                self._parking = False
            return homeless

    def outbox_remove(self, ids: Sequence[int]) -> None:
        """Forget outbox rows ``ids`` (their dead letters were delivered elsewhere)."""
        with self.lock, self.tx() as c:
            c.executemany("DELETE FROM outbox WHERE id = ?", [(i,) for i in ids])
