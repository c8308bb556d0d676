"""How a delivery channel ends a batch's delivery other than by delivering it
(:class:`ChannelGiveUp`, a part of ``core.channel.Channel``): the batch goes to the dead
letters and is settled once they are confirmed.

- Retries ran out with ``give_up = "end"`` (``_give_up``): the handle stops and the
  channel's ``on_give_up`` gets an :class:`~wsnmom.core.channel_signals.EndSubscription` on
  a thread of its own (the service sends the rest of the backlog to the dead letters, ends
  the subscription and publishes SubscriptionEnd).
- ``prepare`` raised ``EndSubscription`` (a filter exceeded its evaluation budget;
  ``_end``): the same, at once.
- The consumer answered one of the schedule's *final* statuses (``_bury_final``): the batch
  alone goes to the dead letters (reason ``final-status``) and delivery goes on with the
  next messages.

When the middleware does not confirm the dead letters, nothing is settled: the handle is
stopped (the middleware gives everything back) and the channel starts again after the
longest retry delay (``_start_later``), so that the give-up is tried again and no message
is lost.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TypeVar

from wsnmom.core.adapter import Received
from wsnmom.core.channel_signals import EndSubscription
from wsnmom.core.channel_state import ChannelState, settle
from wsnmom.core.later import later

__all__ = ["ChannelGiveUp"]

log = logging.getLogger("wsnmom.core.delivery")

T = TypeVar("T")


class ChannelGiveUp(ChannelState[T]):
    """A channel's give-ups and dead letters (see the module docstring)."""

    __slots__ = ()

    def _give_up(
        self, letters: list[Received], batch: list[Received], failures: int, reason: str
    ) -> None:
        """Retries ran out (``give_up = "end"``): ``letters`` go to the dead letters and
        ``batch`` is settled, the handle stops (what else it held goes back to the
        middleware) and the subscription ends on a thread of its own, which buries the
        rest of its backlog."""
        log.warning(
            "subscription %s: giving up after %d failed attempts: %s",
            self.name,
            failures,
            reason,
        )
        if not self._bury(letters, batch, "retries-exhausted", failures, reason):
            return
        try:
            self.handle.stop()
        except Exception:
            log.debug("stopping the handle failed", exc_info=True)
        end = EndSubscription(reason, "delivery")
        self.engine._spawn(lambda: self.on_give_up(end))

    def _end(self, gen: int, take: list[Received], end: EndSubscription) -> None:
        """``prepare`` said the subscription cannot go on: stop and hand over (the caller's
        ``finally`` clears ``_running``)."""
        with self._lock:
            current = gen == self._gen and not self._stopped
            if current:
                self._stopped = True
                self._gen += 1
                self._retry_at = 0.0
                self._queue = None
                self._pending = []
                self._error = end.reason
                self._release(self._forget_charges())
        if not current:
            for received in take:
                self._settle(received, ack=False)
            return
        # like a give-up: the batch goes to the dead letters, what else is held stays
        # unsettled; the subscription is being ended
        log.warning("subscription %s: %s", self.name, end.reason)
        if not self._bury(take, take, "filter-budget", 0, end.reason):
            return
        try:
            self.handle.stop()
        except Exception:
            log.debug("stopping the handle failed", exc_info=True)
        self.engine._spawn(lambda: self.on_give_up(end))

    def _bury(
        self,
        letters: Sequence[Received],
        batch: Sequence[Received],
        reason: str,
        attempts: int,
        error: str | None,
    ) -> bool:
        """After a give-up (the channel is stopped): publish ``letters`` as dead letters
        and acknowledge ``batch`` (``letters`` and the filtered messages settled in order
        with them) once the middleware confirmed them (True).  When it did not, nothing
        is settled, the handle is stopped (the middleware gives everything back) and the
        channel starts again after the longest retry delay (False): the give-up is tried
        again, and no message is lost."""
        sink = self.dead_letter
        if sink is None or not batch:
            return True
        if not letters or sink(letters, reason, attempts, error):
            for received in batch:  # in order: a log commits a contiguous prefix
                settle(received, ack=True)
            return True
        try:
            self.handle.stop()
        except Exception:
            log.debug("stopping the handle failed", exc_info=True)
        self._start_later()
        return False

    def _start_later(self) -> None:
        """Start again after the longest retry delay (a dead letter was not confirmed),
        unless stopped or started meanwhile."""
        with self._lock:
            self._start_due = True
        later(self.schedule.max_delay, self._start_if_due)

    def _start_if_due(self) -> None:
        """The timer of ``_start_later``."""
        with self._switch:
            with self._lock:
                due = self._start_due
            if due:
                self.start()

    def _bury_final(
        self,
        pending: list[tuple[Received, T | None]],
        attempts: int,
        error: str,
        gen: int,
    ) -> bool:
        """The consumer answered a final status: the batch goes to the dead letters and is
        settled once they are confirmed, and delivery goes on with the next messages;
        whether the channel is to run again now.  Not confirmed: the channel stops (the
        middleware gives everything back) and starts again after the longest retry delay,
        so that nothing is lost."""
        letters = [r for r, item in pending if item is not None]
        sink = self.dead_letter
        if sink is None or sink(letters, "final-status", attempts, error):
            for received, _ in pending:  # in order: a log commits a contiguous prefix
                self._settle(received, ack=True)
            with self._lock:
                if gen != self._gen or self._stopped:
                    return False
                if self._queue:
                    return True
                self._scheduled = False
                return False
        self.stop()
        self._start_later()
        return False
