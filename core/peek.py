"""Peek: the first messages waiting for a subscription or in a pull point, shown to an
operator without consuming them.

A subscription's backlog is what its delivery channel holds in memory (the batch being
sent and what was received for the next ones, ``Channel.held_messages``) followed by what
waits in the middleware; a pull point's is what core's pull buffer holds followed by what
waits in the middleware for its durable subscription (read through the middleware's pull,
``core.pull_reader``: then what waits in its active feeds, in the order GetMessages takes
them).  The part in memory is read from
core.  The part in the middleware is read with ``SubscriptionHandle.peek`` where the
adapter can read it without consuming (``Capabilities.peek``); where it cannot (RabbitMQ
hands a message out only by delivering it), the answer holds only what core holds,
``complete`` is False and ``note`` gives the adapter's reason.  Nothing is settled,
requeued or committed either way.

Messages are shown as GetMessages or a push would carry them (``codec.decode``), before
the subscription's MessageContent filter, which is applied when they are delivered.
Dead letters are held by core itself (``core.dead_letters``): listing them consumes
nothing, so they need nothing of this module.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from wsnmom.core import errors
from wsnmom.core.adapter import AdapterError, Received, StoredMessage, SubscriptionHandle
from wsnmom.core.codec import decode
from wsnmom.core.context import BrokerContext
from wsnmom.core.model import NotificationMessage
from wsnmom.core.pull_buffer import Fed
from wsnmom.core.pull_reader import PullReader

__all__ = ["MAX_PEEK", "PeekResult", "Peeked", "Peeker"]

log = logging.getLogger(__name__)

#: most messages one peek shows
MAX_PEEK = 500

#: where a peeked message is: in the gateway's memory, or in the middleware
IN_MEMORY = "gateway"
IN_MIDDLEWARE = "middleware"


@dataclass(frozen=True, slots=True)
class Peeked:
    """One message seen by a peek."""

    message: NotificationMessage
    #: :data:`IN_MEMORY` (received from the middleware, not yet delivered or handed
    #: out) or :data:`IN_MIDDLEWARE` (waiting there)
    where: str
    #: the middleware handed it out before (known for messages in memory only)
    redelivered: bool | None
    #: when the middleware stored it (UTC), None when it cannot tell
    stored_at: datetime | None


@dataclass(frozen=True, slots=True)
class PeekResult:
    """The first messages of a backlog, oldest first."""

    messages: list[Peeked]
    #: False when the middleware's part could not be read without consuming it
    complete: bool
    #: why the answer is incomplete (the adapter's reason), or what else to know
    note: str = ""


def _peeked(item: Received | StoredMessage, where: str) -> Peeked | None:
    if isinstance(item, Fed) and isinstance(item.message, NotificationMessage):
        message = item.message  # a feeding subscription's, rendered for the pull point
    else:
        try:
            message = decode(item)
        except Exception:
            log.debug("peek: an undecodable message left out", exc_info=True)
            return None
    return Peeked(
        message=message,
        where=where,
        redelivered=item.redelivered if isinstance(item, Received) else None,
        stored_at=item.timestamp,
    )


class Peeker:
    """Reads backlogs for operators (see the module docstring)."""

    def __init__(self, ctx: BrokerContext) -> None:
        self._ctx = ctx

    def subscription(self, subscription_id: str, count: int) -> PeekResult:
        """The first ``count`` messages of a subscription's backlog; ResourceUnknown when
        there is no such subscription."""
        ctx = self._ctx
        state = ctx.registry.live_subscription(subscription_id)
        count = max(0, min(count, MAX_PEEK))
        if state.handle is None:
            return PeekResult(
                [],
                True,
                "routed into its pull point when published: it holds nothing of its own "
                "(peek the pull point)",
            )
        channel = ctx.engine.channel(state.record.id)
        held = channel.held_messages(count) if channel is not None else []
        result = self._read(held, state.handle, count)
        if state.feed is not None and result.complete:
            # read by its pull point directly (core.pull_feeds): what reached the pull
            # point's buffer is the pull point's
            note = "what its pull point's buffer already holds is shown by the pull point's peek"
            return PeekResult(result.messages, True, note)
        return result

    def pull_point(self, pull_point_id: str, count: int) -> PeekResult:
        """The first ``count`` messages GetMessages would hand out now; ResourceUnknown
        when there is no such pull point."""
        state = self._ctx.registry.live_pull_point(pull_point_id)
        count = max(0, min(count, MAX_PEEK))
        reader = state.reader
        result = self._read(reader.held(count), state.handle, count)
        if isinstance(reader, PullReader):
            for feed in reader.feeds(active=True):
                room = count - len(result.messages)
                if room <= 0 or not result.complete:
                    break
                part = self._read([], feed, room)
                result = PeekResult(result.messages + part.messages, part.complete, part.note)
        return result

    def _read(self, held: Sequence[Received], handle: SubscriptionHandle, count: int) -> PeekResult:
        out = [p for r in held if (p := _peeked(r, IN_MEMORY)) is not None]
        if len(held) >= count:
            return PeekResult(out, True)
        try:
            waiting = handle.peek(count - len(held))
        except NotImplementedError as exc:
            return PeekResult(out, False, str(exc))
        except AdapterError as exc:
            raise self._ctx.gate.fault(
                exc, errors.ResourceUnavailable(f"the middleware failed: {exc}")
            ) from exc
        out += [p for m in waiting if (p := _peeked(m, IN_MIDDLEWARE)) is not None]
        return PeekResult(out, True)
