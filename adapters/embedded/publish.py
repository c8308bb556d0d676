"""Publishing into the embedded engine: a batch is routed once per topic, stored once per
message with one queue entry per receiving subscription, and the topics' current messages
kept (see :mod:`wsnmom.adapters.embedded.store`)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from typing import Any

from wsnmom.core.adapter import (
    DROPPED_OVERFLOW,
    OutboundMessage,
    is_internal_namespace,
)
from wsnmom.topic_mapping.model import Topic

from .parts import EngineParts
from .records import (
    _INLINE,
    _SET_CURRENT,
    SubState,
    _HeadersJson,
    _Route,
    _topic_key,
    next_message_id,
    release,
    write_rows,
)

#: topics whose current message id ``Engine`` remembers (beyond: forget them all)
_CURRENT_MIDS_MAX = 4096


class Publishing(EngineParts):
    """``publish_many`` of an engine."""

    def publish_many(self, messages: Sequence[OutboundMessage]) -> list[int]:
        """Store and route ``messages`` in one transaction; returns the fan-out of each.

        Routing is worked out once per distinct topic of the batch (:meth:`_routes`).  A
        message is stored once, with one ``queue_entries`` row per subscription that accepts
        it; the batch's last message on a topic that is not internal becomes the topic's
        current message (the others would be replaced within the same transaction); one
        that no subscription receives is held inline in its ``current`` row, and a message
        with neither a queue nor the current slot to go to is not stored at all.
        Rows are written with ``executemany`` when the batch is done, with message ids
        assigned here in AUTOINCREMENT order (:meth:`_next_message_id`); a bounded
        subscription's overflow policy sees every earlier message of the batch (the rows
        are written before it runs).
        """
        now = time.time()
        fanouts: list[int] = [0] * len(messages)
        touched: set[int] = set()
        with self.lock:
            known_mid = self._next_mid
            # forgotten until this transaction commits: a failed one leaves them unknown
            self._next_mid = None
            current_mids, self._current_mids = self._current_mids, {}
            self._publish_tx(messages, now, fanouts, touched, known_mid, current_mids)
            self._current_mids = current_mids
        self._wake(touched)
        return fanouts

    def _publish_tx(
        self,
        messages: Sequence[OutboundMessage],
        now: float,
        fanouts: list[int],
        touched: set[int],
        known_mid: int | None,
        current_mids: dict[tuple[str, str], int],
    ) -> None:
        """The transaction of :meth:`publish_many` (``self.lock`` held); on success sets
        ``self._next_mid`` and brings ``current_mids`` up to date."""
        with self.tx() as c:
            routes, last_in_slot = self._routes(messages)
            message_rows: list[tuple[Any, ...]] = []
            entry_rows: list[tuple[int, int]] = []
            #: (ns, path, mid, body, headers, ctype): a stored message by id, or _INLINE
            #: and the message itself when no subscription received it
            current: list[tuple[str, str, int, bytes | None, str | None, str | None]] = []
            mid = 0  # the id of the next stored message, once known
            headers_json = _HeadersJson()
            for i, m in enumerate(messages):
                route = routes[i]
                fanouts[i] = route.fanout
                retain = route.slot is not None and last_in_slot.get(route.slot) == i
                if not route.targets and not retain:
                    continue
                size = len(m.body)
                accepted = self._accepting(c, route, m, size, message_rows, entry_rows)
                if not accepted:
                    if retain:
                        current.append(
                            (
                                route.namespace,
                                route.key,
                                _INLINE,
                                m.body,
                                headers_json(m),
                                m.content_type,
                            )
                        )
                    continue
                if not mid:
                    mid = known_mid or next_message_id(c)
                message_rows.append(
                    (
                        mid,
                        route.namespace,
                        route.key,
                        m.body,
                        headers_json(m),
                        m.content_type,
                        m.message_id,
                        size,
                        now,
                        len(accepted) + int(retain),
                    )
                )
                if retain:
                    current.append((route.namespace, route.key, mid, None, None, None))
                for st in accepted:
                    entry_rows.append((st.id, mid))
                    if st.count is not None and st.bytes is not None:
                        st.count += 1
                        st.bytes += size
                    touched.add(st.id)
                mid += 1
            write_rows(c, message_rows, entry_rows)
            _set_current(c, current, current_mids)
        if len(current_mids) + len(current) > _CURRENT_MIDS_MAX:
            current_mids.clear()
        for slot in current:
            current_mids[(slot[0], slot[1])] = slot[2]
        # dead letters written by this transaction took ids after ``mid``
        self._next_mid = None if self._interred else mid or known_mid
        self._interred = False

    def _accepting(
        self,
        c: sqlite3.Connection,
        route: _Route,
        m: OutboundMessage,
        size: int,
        message_rows: list[tuple[Any, ...]],
        entry_rows: list[tuple[int, int]],
    ) -> list[SubState]:
        """The subscriptions of ``route`` that take ``m`` (``size`` bytes): a bounded one
        first applies its overflow policy, which sees the batch's rows written so far, and
        one that cannot make room buries ``m`` instead (:meth:`_publish_tx`)."""
        subs = self.subs
        accepted: list[SubState] = []
        for sid in route.targets:
            st = subs.get(sid)
            if st is None:
                continue
            if st.bounded:
                write_rows(c, message_rows, entry_rows)
                if not self._make_room(st, size):
                    self._grave(st, m, dict(m.headers), DROPPED_OVERFLOW)
                    continue
            accepted.append(st)
        return accepted

    def _routes(
        self, messages: Sequence[OutboundMessage]
    ) -> tuple[list[_Route], dict[tuple[str, str], int]]:
        """The route of each message (one per distinct topic, looked up once) and, per
        current-message slot ``(namespace, path)``, the index of the batch's last message
        in it (internal topics keep no current message).  Call with ``self.lock`` held."""
        routes: list[_Route] = []
        last_in_slot: dict[tuple[str, str], int] = {}
        by_topic: dict[Topic, _Route] = {}
        topic: Topic | None = None
        route: _Route | None = None
        for i, m in enumerate(messages):
            if m.topic is not topic or route is None:
                topic = m.topic
                route = by_topic.get(topic)
                if route is None:
                    found = self.targets(topic)
                    key = _topic_key(topic)
                    keeps = self.keep_current and not is_internal_namespace(topic.namespace)
                    route = by_topic[topic] = _Route(
                        topic.namespace,
                        key,
                        (topic.namespace, key) if keeps else None,
                        sorted(found),
                        len(found),
                    )
            if route.slot is not None:
                last_in_slot[route.slot] = i
            routes.append(route)
        return routes, last_in_slot


def _set_current(
    c: sqlite3.Connection,
    current: Sequence[tuple[str, str, int, bytes | None, str | None, str | None]],
    current_mids: dict[tuple[str, str], int],
) -> None:
    """Write the batch's ``current`` rows (``_SET_CURRENT``) and release the messages they
    replace; ``current_mids`` tells the replaced ids known without a query."""
    for slot in current:
        ns, key = slot[0], slot[1]
        old = current_mids.get((ns, key))
        if old is None:
            row = c.execute(
                "SELECT mid FROM current WHERE ns = ? AND path = ?", (ns, key)
            ).fetchone()
            old = row[0] if row is not None else None
        c.execute(_SET_CURRENT, slot)
        if old:  # neither unknown (None) nor inline (_INLINE)
            release(c, old)
