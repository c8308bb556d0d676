"""Dead letters of the embedded engine: what a subscription's limits drop is kept, in the
transaction that drops it, for the subscription's dead-letter topic and routed like any
message on it when that transaction commits (or written to the :mod:`.outbox`) (see
:mod:`wsnmom.adapters.embedded.store`).

A dead letter whose topic has no queue when it is written (its box, the subscription of
the gateway that reads the destination, was deleted) is not dropped: it is *stranded*,
kept in the ``stranded`` table (logged as an error, counted by :meth:`stranded_count`),
and moved into the queues of its topic, in one transaction, as soon as a subscription
that receives it is attached (the gateway opens a destination's box again when asked to
list it, ``wsnmom dead-letters list -d NAME``)."""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from wsnmom.core.adapter import (
    HEADER_DROPPED_AT,
    HEADER_DROPPED_ATTEMPTS,
    HEADER_DROPPED_FROM,
    HEADER_DROPPED_REASON,
    HEADER_MESSAGE_ID,
    HEADER_TOPIC_NAMESPACE,
    HEADER_TOPIC_PATH,
    OutboundMessage,
)
from wsnmom.topic_mapping.model import Topic

from .parts import EngineParts
from .records import (
    _INSERT_MESSAGE,
    LETTER_COLUMNS,
    SubState,
    _execute_rows,
    _topic_key,
    letter_of,
    letter_values,
    next_message_id,
)

#: the engine's logger (one name for all its parts)
log = logging.getLogger(f"{__package__}.store")


class DeadLetters(EngineParts):
    """Burial of what an engine's limits drop."""

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
        dead-lettered exactly when they are dropped; ``context``: more headers for them.
        Nothing without a topic."""
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
        mid = next_message_id(c)
        for m in graves:
            if self.outbox is not None and not self._parking and self.outbox(m.topic):
                self._to_outbox(c, m)
                continue
            targets = [sid for sid in sorted(self.targets(m.topic)) if sid in self.subs]
            if not targets:
                self._strand(c, m, now)
                continue
            size = len(m.body)
            c.execute(_INSERT_MESSAGE, (mid, *letter_values(m), size, now, len(targets)))
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

    def _strand(self, c: sqlite3.Connection, m: OutboundMessage, now: float) -> None:
        """Keep dead letter ``m``, whose topic has no queue, in the ``stranded`` table
        (inside the transaction that would have queued it)."""
        c.execute(
            f"INSERT INTO stranded({LETTER_COLUMNS}, since) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (*letter_values(m), now),
        )
        self._stranded = True
        log.error(
            "embedded store: a dead letter for %s has no queue (its box was deleted); it is "
            "kept and goes to the box as soon as one is opened again",
            m.topic,
        )

    def stranded_count(self) -> int:
        """How many dead letters wait for a queue of their topic (see the module
        docstring)."""
        with self.lock:
            if self._closed:
                return 0
            return int(self.conn.execute("SELECT count(*) FROM stranded").fetchone()[0])

    def _release_stranded(self) -> int:
        """Move every stranded dead letter whose topic has a queue now into those queues
        (one transaction, call with ``lock`` held); how many.  Their stranded rows go in
        the same transaction, so none is queued twice."""
        if not self._stranded or self._closed:
            return 0
        rows = self.conn.execute(
            f"SELECT id, {LETTER_COLUMNS} FROM stranded ORDER BY id"
        ).fetchall()
        found: list[tuple[int, OutboundMessage]] = []
        for rid, *row in rows:
            m = letter_of(*row)
            if any(sid in self.subs for sid in self.targets(m.topic)):
                found.append((rid, m))
        if not found:
            self._stranded = bool(rows)
            return 0
        self._parking = True  # into the queues, not the outbox: they were there before
        try:
            with self.tx() as c:
                c.executemany("DELETE FROM stranded WHERE id = ?", [(rid,) for rid, _ in found])
                self._graves.extend(m for _, m in found)
        finally:
            self._parking = False
        self._stranded = len(found) < len(rows)
        log.info("embedded store: %d stranded dead letter(s) moved to their box", len(found))
        return len(found)
