"""The cursor engine's burial: the records a cursor skips for its limits are published to
its dead-letter topic before its committed position passes them, held in flight until the
publish is confirmed, and tried again with a doubling delay when it fails; and a
subscription ended with its whole backlog buried (``delete_into_dead_letters``) (see
:mod:`wsnmom.adapters.logbase.engine`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime

from wsnmom.core.adapter import (
    DROPPED_OVERFLOW,
    HEADER_DROPPED_AT,
    HEADER_DROPPED_ATTEMPTS,
    HEADER_DROPPED_FROM,
    HEADER_DROPPED_REASON,
    HEADER_MESSAGE_ID,
    HEADER_TOPIC_NAMESPACE,
    HEADER_TOPIC_PATH,
    AdapterUnavailable,
    OutboundMessage,
)

from .backend import StreamId
from .cursor import Cursor
from .parts import EngineParts

#: the engine's logger (one name for all its parts)
log = logging.getLogger(f"{__package__}.engine")


class Burial(EngineParts):
    """Dead letters of a :class:`~wsnmom.adapters.logbase.engine.CursorEngine`'s cursors."""

    def _retry_bury(self, cursor: Cursor) -> None:
        """Bury what ``cursor`` skipped if it has records waiting for that and no failed
        publish asks it to wait (served by this thread, no lock held); when it must wait,
        the commit thread hands it to a reader once it is due."""
        with self.lock:
            if not cursor.dropping:
                return
            due = cursor.bury_due <= time.monotonic()
            if not due:  # e.g. skipped again after a stop: tried when the last wait ends
                self._bury_retry.setdefault(cursor.name, cursor.bury_due)
        if due:
            self._bury(cursor)

    def _queue_due_buries(self) -> None:
        """Hand each cursor whose dead-letter publish is due again to a catch-up reader
        (commit thread), whether it is attached, paused or its window is full."""
        now = time.monotonic()
        with self.lock:
            for name, due in list(self._bury_retry.items()):
                cursor = self._cursors.get(name)
                if cursor is None or cursor.deleted or not cursor.dropping:
                    del self._bury_retry[name]
                elif due <= now and not cursor.serving:  # served: looked at next pass
                    del self._bury_retry[name]
                    if not cursor.queued:
                        cursor.queued = True
                        self._catch_up.put(cursor)

    def _bury(self, cursor: Cursor) -> bool:
        """Publish the records ``cursor`` skipped to its dead-letter topic and settle them
        (served by this thread, no lock held).  False when the publish failed: they stay
        held in flight at the front of ``dropping`` (no committed position passes them)
        and are tried again after a delay that doubles with each failure in a row
        (``bury_retry_first`` .. ``bury_retry_max``), on a later turn; the cursor does not
        go back, so what it handed out meanwhile is not handed out again."""
        with self.lock:
            dropped, cursor.dropping = cursor.dropping, []
            gen, topic, bury = cursor.gen, cursor.dead_letters, cursor.bury
        if not dropped or topic is None or bury is None:
            return True
        out: list[OutboundMessage] = []
        now = datetime.now(UTC).isoformat()
        for record in dropped:
            headers = dict(record.headers)
            headers.setdefault(HEADER_TOPIC_NAMESPACE, record.topic.namespace)
            headers.setdefault(HEADER_TOPIC_PATH, "/".join(record.topic.path))
            headers.update(cursor.drop_context)
            headers[HEADER_DROPPED_REASON] = cursor.drop_reason
            headers[HEADER_DROPPED_FROM] = cursor.name
            headers[HEADER_DROPPED_AT] = now
            if record.offset < cursor.redeliver_below.get(record.stream, -1):
                headers[HEADER_DROPPED_ATTEMPTS] = "1"  # handed out before (at least once)
            out.append(
                OutboundMessage(
                    topic=topic,
                    body=bytes(record.body),
                    message_id=headers.get(HEADER_MESSAGE_ID)
                    or f"{cursor.name}:{record.stream}:{record.offset}",
                    headers=headers,
                    content_type=record.content_type or "application/xml",
                )
            )
        try:
            bury(out)
        except Exception as exc:
            with self.lock:
                self._bury_failed += 1
                if cursor.deleted:
                    return False
                if gen != cursor.gen:
                    # stopped or rewound meanwhile: it went back to them (they were in
                    # flight), so they are read, skipped and buried again from there
                    cursor.skip_oldest += len(dropped)
                    return False
                cursor.dropping[:0] = dropped  # still held: the commit stays below them
                # what was still to be skipped is delivered instead, and ``discard``
                # skips nothing more until they are published: only these stay held
                cursor.skip_oldest, cursor.cap_budget, cursor.cap_until = 0, None, {}
                cursor.bury_failures += 1
                delay = min(
                    self.bury_retry_first * 2 ** min(cursor.bury_failures - 1, 30),
                    self.bury_retry_max,
                )
                cursor.bury_due = time.monotonic() + delay
                self._bury_retry[cursor.name] = cursor.bury_due
                failures = cursor.bury_failures
            log.log(
                logging.ERROR if failures == 1 else logging.WARNING,
                "subscription %s: dead letters not published: %d dropped message(s) "
                "(%s); they stay held, tried again in %.1fs (failure %d in a row)",
                cursor.name,
                len(out),
                exc,
                delay,
                failures,
            )
            return False
        with self.lock:
            cursor.buried += len(dropped)
            if gen == cursor.gen:
                cursor.bury_failures = 0
                cursor.bury_due = 0.0
                cursor.held_drops = max(0, cursor.held_drops - len(dropped))
        for record in dropped:
            self.settle(cursor, record.stream, record.offset, gen, rewind=False)
        return True

    def _await_head_locked(
        self, cursor: Cursor, ends: Mapping[StreamId, int], timeout: float
    ) -> None:
        """Wait (hold the lock; released meanwhile) until the head reader has polled to
        the end and past ``ends`` in every stream ``cursor`` reads; ``AdapterUnavailable``
        when it has not within ``timeout`` (nothing is dead-lettered yet)."""
        deadline = time.monotonic() + timeout
        while True:
            self._sync_head_locked(timeout=max(0.0, deadline - time.monotonic()))
            behind = sorted(
                s for s, e in ends.items() if e > self._head.get(s, 0) and self._relevant(cursor, s)
            )
            if not behind:
                return
            if time.monotonic() >= deadline or not self._dispatching or not self._running:
                raise AdapterUnavailable(
                    f"subscription {cursor.name}: the head reader did not reach the end of "
                    f"{behind} within {timeout:g}s; nothing sent to the dead letters yet"
                )

    def delete_into_dead_letters(
        self, cursor: Cursor, reason: str, context: Mapping[str, str], timeout: float
    ) -> int:
        """Bury what ``cursor`` has waiting up to where the head is now, then forget it
        (``SubscriptionHandle.delete_into_dead_letters``): it is stopped (what was in
        flight is given back), and a catch-up reader reads it on to the head as for
        ``discard(newest=True)`` with no budget, holding each record until ``_bury``
        published it (``HEADER_DROPPED_REASON`` = ``reason``, ``context`` added).  This
        thread waits for that; a failed publish, or ``timeout`` seconds without progress
        (nothing more read or buried), raises ``AdapterUnavailable`` (the cursor keeps
        what was not buried, and buries what it holds later; core starts it again)."""
        if cursor.dead_letters is None or cursor.bury is None:
            raise NotImplementedError(f"subscription {cursor.name} has no dead-letter topic")
        self.stop_cursor(cursor)
        self._start_head()
        ends = self._ends_at_least(self.backend.end_positions())
        with self.lock:
            if cursor.deleted:
                return 0
            # "the head" is where the streams end now, not where the head reader last
            # polled: a record published before this call is backlog too, and would
            # otherwise be neither delivered nor dead-lettered once the cursor is gone
            self._await_head_locked(cursor, ends, timeout)
            cursor.drop_reason, cursor.drop_context = reason, dict(context)
            cursor.buried, cursor.bury_failures, cursor.bury_due = 0, 0, 0.0
            cursor.cap_budget = 0
            cursor.cap_until = {s: h for s, h in self._head.items() if self._relevant(cursor, s)}
            until = dict(cursor.cap_until)
            cursor.dirty = True
        deadline = time.monotonic() + timeout
        error = f"no progress for {timeout:g}s"
        progress: tuple[int, int] = (-1, -1)
        while time.monotonic() < deadline:
            with self.lock:
                if cursor.bury_failures:
                    error = "the dead letters were not published"
                    break
                now = (cursor.buried, sum(cursor.positions.values()))
                if now != progress:  # a long backlog takes as long as it needs
                    progress, deadline = now, time.monotonic() + timeout
                read = cursor.cap_budget is None or all(
                    cursor.positions.get(s, 0) >= end for s, end in until.items()
                )
                if read and not cursor.dropping and not cursor.unsettled:
                    buried = cursor.buried
                    self.delete_subscription(cursor.name)  # the lock held: nothing moved
                    return buried
                self._queue_catch_up(cursor, skipping=True)  # (no-op while queued)
            time.sleep(0.02)
        with self.lock:
            cursor.cap_budget, cursor.cap_until = None, {}
            cursor.drop_reason, cursor.drop_context = DROPPED_OVERFLOW, {}
            buried = cursor.buried
        raise AdapterUnavailable(
            f"subscription {cursor.name}: {buried} record(s) sent to the dead letters, "
            f"the rest not: {error}"
        )
