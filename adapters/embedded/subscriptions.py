"""The embedded engine's durable subscriptions: their rows, their in-memory state and the
topic index that routes to them (see :mod:`wsnmom.adapters.embedded.store`)."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping

from wsnmom.core.adapter import (
    AdapterUnavailable,
    QueueLimits,
    is_internal_namespace,
)
from wsnmom.topic_mapping.model import PathPattern, Topic

from .parts import EngineParts
from .records import (
    SubState,
    decode_dead_letters,
    decode_limits,
    decode_patterns,
    encode_limits,
    encode_patterns,
)

#: inserts of a restore that share one transaction at most (:meth:`Subscriptions._attach`)
_BATCH_ROWS = 1000

_INSERT = "INSERT INTO subscriptions(name, patterns, limits) VALUES (?, ?, ?)"


class Subscriptions(EngineParts):
    """Durable subscriptions of an engine and the index that routes to them."""

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
            # subscriptions share a few patterns and limits: each text is decoded once
            # (the values are immutable)
            pats: dict[str | None, tuple[PathPattern, ...] | None] = {}
            lims: dict[str, tuple[QueueLimits, Topic | None]] = {}
            rows = self.conn.execute("SELECT id, name, patterns, limits FROM subscriptions")
            for sid, name, patterns, limits in rows.fetchall():
                if patterns not in pats:
                    pats[patterns] = decode_patterns(patterns)
                if limits not in lims:
                    lims[limits] = (decode_limits(limits), decode_dead_letters(limits))
                lim, dead = lims[limits]
                st = SubState(sid, name, pats[patterns], lim, dead_letters=dead)
                self._install(st, held=held.get(sid, (0, 0)))

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
        or dead-letter topic (where what its limits drop goes: :meth:`_bury`); stranded
        dead letters it receives are moved into its queue (:mod:`.dead_letters`)."""
        with self.lock:
            st = self._attach(name, patterns, limits, dead_letters)
            self._release_stranded()
            return st

    def _attach(
        self,
        name: str,
        patterns: tuple[PathPattern, ...] | None,
        limits: QueueLimits,
        dead_letters: Topic | None,
    ) -> SubState:
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
            if self._holding:  # restoring: one transaction for many (:meth:`_insert_batched`)
                sid = self._insert_batched(name, enc_p, enc_l)
            else:
                with self.tx() as c:
                    sid = c.execute(_INSERT, (name, enc_p, enc_l)).lastrowid
            assert sid is not None
            st = SubState(sid, name, patterns, limits, dead_letters=dead_letters)
            self._install(st)
            if self._batch is not None:
                self._batch.append(st)
                if len(self._batch) >= _BATCH_ROWS:
                    self.end_batch()
            return st

    def _insert_batched(self, name: str, enc_p: str | None, enc_l: str) -> int | None:
        """Insert a new durable subscription while core restores (``restoring`` ..
        ``restored``), in the transaction the restore's inserts share: a first start on
        a new middleware directory makes every durable subscription, and a transaction
        each cost most of that start (docs/performance/findings.md, F30).  The shared
        transaction is committed by :meth:`end_batch`: every :data:`_BATCH_ROWS` inserts,
        at ``restored``, and before any other transaction of the engine (so a message is
        never routed to a subscription whose row is not committed before it)."""
        if self._batch is None:
            if self._closed:
                raise AdapterUnavailable("the embedded adapter is closed")
            self.conn.execute("BEGIN IMMEDIATE")
            self._batch = []
        try:
            return self.conn.execute(_INSERT, (name, enc_p, enc_l)).lastrowid
        except BaseException:
            self._abort_batch()
            raise

    def _forget(self, batch: list[SubState]) -> None:
        """Drop from memory the subscriptions of a batch that was rolled back (``restored``
        then fails the start; a later attach makes them again).  Their handles leave the
        started set and fetch nothing; they are not detached here, under ``lock``, which a
        dispatcher round holding a handle may be waiting for."""
        for st in batch:
            if self.by_name.get(st.name) == st.id:
                del self.by_name[st.name]
            self.subs.pop(st.id, None)
            self.index.remove(st.id)
            self.match_all.discard(st.id)
            self.started.pop(st.id, None)

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
        (``_bury``, ``reason``, the headers ``context`` added); returns how many (None:
        unknown subscription).  A failed transaction leaves it as it was."""
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

    def targets(self, topic: Topic) -> set[int]:
        """Subscription ids that receive ``topic`` (one entry each, whatever the patterns).

        Match-all subscriptions (``patterns=None``) get every topic except those of internal
        namespaces (adapter contract, ``core.adapter.is_internal_namespace``)."""
        found: set[int] = self.index.match(topic)
        if self.match_all and not is_internal_namespace(topic.namespace):
            found |= self.match_all
        return found
