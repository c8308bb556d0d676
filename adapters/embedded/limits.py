"""The queue limits of the embedded engine: expiry (``max_age``) and overflow (``max_messages``,
``max_bytes``); what they drop goes to :mod:`.dead_letters` (see
:mod:`wsnmom.adapters.embedded.store`)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from typing import Any

from wsnmom.core.adapter import (
    DROPPED_MAX_AGE,
    DROPPED_OVERFLOW,
    Overflow,
)

from .parts import EngineParts
from .records import (
    _OLDEST_READY,
    _PUBLISHED,
    _REMOVE,
    SubState,
    decref,
)

#: entries ``_expire`` reads per query
_EXPIRE_CHUNK = 256


class Limits(EngineParts):
    """Expiry and overflow of an engine's queues."""

    def _expire(self, st: SubState) -> None:
        """Remove the ready messages of ``st`` older than its ``max_age`` (inside a
        transaction).  Ids follow publish order, so this walks from the oldest entry and
        stops at the first one that is still young: the cost is the count expired, not the
        backlog (a full scan on every fetch made draining a backlog quadratic)."""
        if st.limits.max_age is None:
            return
        cutoff = time.time() - st.limits.max_age.total_seconds()
        after = 0
        while True:
            rows = self.conn.execute(_OLDEST_READY, (st.id, after, _EXPIRE_CHUNK)).fetchall()
            expired = list(itertools.takewhile(lambda r: r[2] < cutoff, rows))
            if expired:
                self._bury(st, [r[0] for r in expired], DROPPED_MAX_AGE)
                self.conn.executemany(_REMOVE, [(st.id, r[0]) for r in expired])
                decref(self.conn, [r[0] for r in expired])
                if st.count is not None and st.bytes is not None:
                    st.count -= len(expired)
                    st.bytes -= sum(r[1] for r in expired)
            if len(expired) < _EXPIRE_CHUNK:
                return
            after = expired[-1][0]

    def _head_expired(self, st: SubState, rows: Sequence[tuple[Any, ...]]) -> bool:
        """True when the oldest of these ``_READY`` rows is past the subscription's
        ``max_age`` (ids follow publish order: if it is not, none of them is)."""
        max_age = st.limits.max_age
        if not rows or max_age is None:
            return False
        return bool(rows[0][_PUBLISHED] < time.time() - max_age.total_seconds())

    def _make_room(self, st: SubState, size: int) -> bool:
        """Apply the overflow policy before one more ``size``-byte message; False = drop it."""
        lim = st.limits
        assert st.count is not None and st.bytes is not None

        def full() -> bool:
            assert st.count is not None and st.bytes is not None
            if lim.max_messages is not None and st.count + 1 > lim.max_messages:
                return True
            return lim.max_bytes is not None and st.bytes + size > lim.max_bytes

        if not full():
            return True
        if lim.max_age is not None:  # expired messages make room before any live one goes
            self._expire(st)
            if not full():
                return True
        if lim.overflow is Overflow.DROP_NEWEST:
            return False
        if lim.max_bytes is not None and size > lim.max_bytes:
            return False
        if lim.max_messages is not None and lim.max_messages <= 0:
            return False
        while full():
            if not self._drop_one(st):
                return False  # everything left is handed out: nothing to drop
        return True

    def _drop_one(self, st: SubState) -> bool:
        """Discard the oldest ready message of ``st``; False when none is ready."""
        row = self.conn.execute(
            "SELECT e.mid, m.size FROM queue_entries e JOIN messages m ON m.id = e.mid "
            "WHERE e.sub = ? AND e.state = 0 ORDER BY e.mid LIMIT 1",
            (st.id,),
        ).fetchone()
        if row is None:
            return False
        self._bury(st, [row[0]], DROPPED_OVERFLOW)
        self.conn.execute(_REMOVE, (st.id, row[0]))
        decref(self.conn, [row[0]])
        if st.count is not None and st.bytes is not None:
            st.count -= 1
            st.bytes -= int(row[1])
        return True

    def _enforce_limits(self, st: SubState) -> None:
        """Trim an existing queue to new, tighter limits (drops the oldest)."""
        lim = st.limits
        while (
            st.count is not None
            and st.bytes is not None
            and (
                (lim.max_messages is not None and st.count > lim.max_messages)
                or (lim.max_bytes is not None and st.bytes > lim.max_bytes)
            )
        ):
            if not self._drop_one(st):
                return
