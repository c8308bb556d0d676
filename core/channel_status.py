"""What operators see of a delivery channel (the admin page and API): :class:`ChannelStatus`
and the last :data:`ATTEMPTS_KEPT` delivery attempts (:class:`DeliveryAttempt`)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ATTEMPTS_KEPT", "ChannelStatus", "DeliveryAttempt"]


@dataclass(frozen=True, slots=True)
class ChannelStatus:
    """A channel's delivery state as operators see it (``Channel.status``); times are
    POSIX seconds."""

    #: consuming (False while paused, after a give-up, or closed)
    active: bool
    #: consecutive failed attempts of the batch being retried (0: none failing)
    failures: int
    #: when that batch is tried again, None when no retry is scheduled
    retry_at: float | None
    #: why the last attempt failed, None after a success
    last_error: str | None
    #: messages delivered since the gateway started
    delivered: int
    #: when the last delivery succeeded, None before the first
    last_delivery: float | None
    #: messages held in memory (received, not yet settled)
    held: int
    #: the last :data:`ATTEMPTS_KEPT` delivery attempts, oldest first
    attempts: tuple[DeliveryAttempt, ...] = ()


#: how many delivery attempts a channel remembers for operators
ATTEMPTS_KEPT = 20


@dataclass(frozen=True, slots=True)
class DeliveryAttempt:
    """One try to hand a batch to the consumer, as operators see it (``ChannelStatus``)."""

    #: when it ended (POSIX seconds)
    at: float
    #: the consumer took it
    ok: bool
    #: messages in the batch (filtered ones not counted)
    messages: int
    #: why it failed (None after a success)
    error: str | None = None
    #: the consumer asked to wait (Retry-After, or a lane/breaker deferred it): not counted
    #: as a failure
    deferred: bool = False
