"""Consuming from the embedded engine's queues: hand-outs (``fetch``), consuming reads
(``take``), settling, peeking, depths, purges and the current message of a topic (see
:mod:`wsnmom.adapters.embedded.store`)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

from wsnmom.core.adapter import (
    AdapterUnavailable,
    StoredMessage,
)
from wsnmom.topic_mapping.model import Topic

from .parts import EngineParts
from .records import (
    _HAND_OUT,
    _HEADS,
    _PUBLISHED,
    _READY,
    _READY_AFTER,
    Row,
    _rows,
    _topic_key,
)

#: a subscription's ready count
_COUNT_READY = "SELECT count(*) FROM queue_entries WHERE sub = ? AND state = 0"
#: every queue's ready count
_COUNTS = "SELECT sub, count(*) FROM queue_entries WHERE state = 0 GROUP BY sub"
#: pending acks that force an immediate commit
_ACK_BATCH = 512


class Queues(EngineParts):
    """The consuming side of an engine's queues."""

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

    def waiting(self) -> set[int]:
        """Ids of the subscriptions whose queues hold ready messages (one query)."""
        with self.lock:
            if self._closed:
                return set()
            rows = self.conn.execute("SELECT DISTINCT sub FROM queue_entries WHERE state = 0")
            return {int(r[0]) for r in rows}

    def depth(self, sid: int) -> int:
        with self.lock:
            st = self.subs.get(sid)
            if st is None:
                return 0
            if st.limits.max_age is not None or self._pending_acks:
                with self.tx():
                    self._expire(st)
            row = self.conn.execute(_COUNT_READY, (sid,)).fetchone()
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
        """``depth`` of each subscription from one grouped query.  When some of them have
        a ``max_age``, that query also reads each queue's oldest ready message's publish
        time, and only the queues whose oldest message is past their ``max_age`` are
        expired (ids follow publish order: if the oldest is young, none is) and counted
        again: a poll where nothing expired is one read, not a query per aged queue."""
        with self.lock:
            if self._closed:
                raise AdapterUnavailable("the embedded adapter is closed")
            if self._pending_acks:
                with self.tx():  # a message taken and not yet removed is not counted
                    pass
            subs = self.subs
            if not any(  # stops at the first queue with a max_age (all by default)
                (st := subs.get(s)) is not None and st.limits.max_age is not None for s in sids
            ):
                counts = dict(self.conn.execute(_COUNTS).fetchall())
                return [int(counts.get(s, 0)) for s in sids]
            wanted = set(sids)
            counts = {}
            stale = []
            now = time.time()
            for sub, n, published in self.conn.execute(_HEADS):  # the queues holding any
                counts[sub] = n
                st = subs.get(sub)
                if (
                    st is not None
                    and (max_age := st.limits.max_age) is not None
                    and published < now - max_age.total_seconds()
                    and sub in wanted
                ):
                    stale.append(st)
            if stale:
                with self.tx() as c:
                    for st in stale:
                        self._expire(st)
                        counts[st.id] = c.execute(_COUNT_READY, (st.id,)).fetchone()[0]
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
