"""``QueueLimits`` that the middleware does not enforce itself, enforced by core.

Where the adapter declares ``native_queue_limits`` the middleware applies every limit as
messages arrive (RabbitMQ queue arguments, the embedded store).  Otherwise (a log, where
all subscriptions share the stored records) core applies them:

* ``max_age``: a message older than ``max_age`` when it is handed out (pushed, read by a
  pull point's feed, or taken by GetMessages) is never delivered: it goes to the dead
  letters (reason ``max-age``) and is settled once the middleware confirmed its dead
  letter: a subscription's message to the subscription's destination (a delivery
  channel's, a feed's as it prepares it or when it aged in the pull buffer), a pull
  point's own (its inbox) to the default destination, naming the pull point
  (``core.pull_points``); with dead letters disabled, dropped.  One whose dead letter
  was not confirmed stays unsettled and is tried again: a delivery channel keeps its
  batch, a buffered feed stalls at it (``core.pull_stall``), GetMessages' answer stops
  before it.  Its age comes from the gateway's own ``wsnmom-published-at`` header or,
  for a message published natively, the middleware's timestamp (``Received.timestamp``).
* ``max_messages``: every sweep (``termination.sweep_interval``) core reads the depth of
  every subscription and pull point in one ``Adapter.depths`` call and asks those above
  the bound to drop the excess (``SubscriptionHandle.discard``): the oldest messages, or
  with ``drop_newest`` the most recent ones.  Between two sweeps a backlog may exceed the
  bound by what arrived meanwhile.
* ``max_bytes``: needs a byte count of the backlog that such middleware cannot give; it
  is not enforced, and the policy document and a start-up warning say so.

``LimitKeeper.enforcement()`` tells the policy document who enforces each limit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from wsnmom.core import metrics
from wsnmom.core.adapter import (
    HEADER_PUBLISHED_AT,
    Adapter,
    Overflow,
    QueueLimits,
    Received,
    SubscriptionHandle,
)

__all__ = ["LimitKeeper"]

log = logging.getLogger(__name__)

#: who enforces a limit, as the policy document says it
MIDDLEWARE = "middleware"
GATEWAY = "gateway"
NOT_ENFORCED = "not enforced"


def _timestamp(received: Received) -> datetime | None:
    """When ``received`` was published: the gateway's own header (same clock as the
    broker's) or, for a native message, the middleware's timestamp."""
    text = received.headers.get(HEADER_PUBLISHED_AT)
    if text:
        try:
            return datetime.fromisoformat(text)
        except ValueError:
            pass
    return received.timestamp


class LimitKeeper:
    """Applies the limits the adapter leaves to core (see the module docstring)."""

    def __init__(self, adapter: Adapter, limits: QueueLimits) -> None:
        self._adapter = adapter
        self._limits = limits
        self._newest_unsupported = False

    @property
    def native(self) -> bool:
        """The middleware enforces every limit itself."""
        return self._adapter.capabilities.native_queue_limits

    def enforcement(self) -> dict[str, str]:
        """Who enforces each limit (``max_messages``, ``max_bytes``, ``max_age``,
        ``overflow``): "middleware", "gateway" or "not enforced"."""
        lim = self._limits
        if self.native:
            return {
                "max_messages": MIDDLEWARE,
                "max_bytes": MIDDLEWARE,
                "max_age": MIDDLEWARE,
                "overflow": MIDDLEWARE,
            }
        return {
            "max_messages": GATEWAY,
            "max_bytes": NOT_ENFORCED if lim.max_bytes is not None else GATEWAY,
            "max_age": GATEWAY,
            "overflow": GATEWAY,
        }

    def warn_unenforced(self) -> None:
        """Log, once at start, every configured limit nobody enforces."""
        for name, who in self.enforcement().items():
            if who == NOT_ENFORCED:
                log.warning(
                    "limits.%s is set but the %s adapter cannot measure it and the gateway "
                    "cannot enforce it; it is not applied (the policy document says so)",
                    name,
                    self._adapter.name,
                )

    def expired(self, received: Received, now: datetime) -> bool:
        """Whether core must drop ``received`` for its age (False when the middleware
        enforces ``max_age`` itself or the age is unknown).  Counts nothing: a message
        whose dead letter is refused is seen again at each retry; its caller counts it
        once gone (``buried``)."""
        max_age: timedelta | None = self._limits.max_age
        if max_age is None or self.native:
            return False
        stamp = _timestamp(received)
        if stamp is None:
            return False
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=now.tzinfo)
        return now - stamp > max_age

    @staticmethod
    def buried(count: int) -> None:
        """``count`` messages past ``max_age`` are gone for good: their dead letters
        ("max-age") confirmed, or dropped (dead letters disabled).  Counted here only,
        once per message, however often a refused dead letter was tried before."""
        if count:
            metrics.NOTIFICATIONS_EXPIRED.inc(count)

    def enforce_counts(
        self,
        handles: Sequence[SubscriptionHandle],
        depths: Sequence[int | None],
        fence: Callable[[], None] = lambda: None,
    ) -> int:
        """Ask every handle whose depth exceeds ``max_messages`` to drop the excess;
        returns how many messages were dropped.  ``fence`` is called right before each
        drop, and raises to stop (the cluster leader's epoch, ``core.sweep``): a leader
        deposed since it read ``depths`` must not drop again what its successor drops."""
        bound = self._limits.max_messages
        if bound is None or self.native:
            return 0
        newest = self._limits.overflow is Overflow.DROP_NEWEST and not self._newest_unsupported
        dropped = 0
        try:
            for handle, depth in zip(handles, depths, strict=True):
                if depth is None or depth <= bound:
                    continue
                fence()
                try:
                    dropped += handle.discard(depth - bound, newest=newest)
                except NotImplementedError:
                    self._newest_unsupported = True
                    log.error(
                        "limits.overflow = drop_newest: the %s adapter cannot drop the newest "
                        "messages; the oldest are dropped instead",
                        self._adapter.name,
                    )
                    dropped += handle.discard(depth - bound)
                except Exception:
                    log.warning("enforcing limits on %s failed", handle.name, exc_info=True)
        finally:
            if dropped:
                metrics.NOTIFICATIONS_DROPPED.inc(dropped)
        return dropped
