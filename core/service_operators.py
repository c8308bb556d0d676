"""The operators' calls of ``BrokerService`` (:class:`OperatorCalls`, a base class of it): what
the admin page, the admin API and the ``wsnmom`` commands ask of a running broker (the
resources with their delivery state, the traffic history, the cluster, peeks and purges,
the dead letters) and the backlog figures the metrics and the admin page's charts read,
answered by the parts the service built (``core.operations``, ``core.rate_history``,
``core.cluster``, ``core.peek``, ``core.dead_letter_admin``)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from wsnmom.core.adapter import Adapter
from wsnmom.core.availability import MiddlewareGate
from wsnmom.core.cluster import ClusterMember, ClusterStatus
from wsnmom.core.dead_letter_admin import DeadLetterAdmin
from wsnmom.core.dead_letter_records import DeadLetter
from wsnmom.core.operations import Operations, Overview, SubscriptionRow, SubscriptionStatus
from wsnmom.core.peek import Peeker, PeekResult
from wsnmom.core.pull_points import PullPoints
from wsnmom.core.rate_history import RateHistory, RatePoint
from wsnmom.core.registry import Registry
from wsnmom.core.subscriptions import Subscriptions

__all__ = ["OperatorCalls"]

# BrokerService's logger: these are its calls
log = logging.getLogger("wsnmom.core.service")


class OperatorCalls:
    """The operators' part of the broker port; the parts it asks are set by
    ``BrokerService.__init__``."""

    operations: Operations
    rates: RateHistory
    cluster: ClusterMember
    peeker: Peeker
    dead_letter_admin: DeadLetterAdmin
    subscriptions: Subscriptions
    pull_points: PullPoints
    adapter: Adapter
    registry: Registry
    _gate: MiddlewareGate
    _started: bool
    _closed: bool

    def overview(self, limit: int | None = None) -> Overview:
        """Every live resource with its state, the topics and the health (admin page);
        with a ``limit``, the full state of only the subscriptions needing attention."""
        return self.operations.overview(limit)

    def subscription_statuses(
        self, ids: Sequence[str] | None = None, *, depths: bool = True
    ) -> list[SubscriptionStatus]:
        """Every live subscription (or those of ``ids``) with its backlog and delivery
        state, oldest first; without ``depths`` the backlogs are unknown (None)."""
        return self.operations.subscriptions(ids, depths=depths)

    def subscription_rows(
        self, *, depths: bool = False, delivery: bool = True
    ) -> list[SubscriptionRow]:
        """Every live subscription as what searching and sorting look at, in no order;
        backlogs only with ``depths``, delivery states only with ``delivery`` (the admin
        API's list)."""
        return self.operations.subscription_rows(depths=depths, delivery=delivery)

    def rate_history(self) -> list[RatePoint]:
        """The last hour of traffic, oldest first (the admin page's charts)."""
        return self.rates.points()

    def cluster_status(self) -> ClusterStatus:
        """This instance and every instance sharing its store (``wsnmom cluster status``)."""
        return self.cluster.status()

    def subscription_status(self, subscription_id: str) -> SubscriptionStatus:
        """One subscription with its backlog and delivery state."""
        return self.operations.subscription(subscription_id)

    def purge_subscription(self, subscription_id: str) -> int | None:
        """Drop every message waiting for the subscription; how many (None: unknown)."""
        self._gate.require_middleware()
        return self.subscriptions.purge(subscription_id)

    def peek_subscription(self, subscription_id: str, count: int) -> PeekResult:
        """The first ``count`` messages of the subscription's backlog, not consumed."""
        return self.peeker.subscription(subscription_id, count)

    def peek_pull_point(self, pull_point_id: str, count: int) -> PeekResult:
        """The first ``count`` messages waiting in the pull point, not consumed."""
        return self.peeker.pull_point(pull_point_id, count)

    # -- dead letters (core.dead_letter_admin) --------------------------------------------
    def dead_letters(self, destination: str | None = None) -> list[DeadLetter]:
        """The dead letters held, oldest first per destination."""
        return self.dead_letter_admin.list(destination)

    def dead_letter(self, letter_id: str) -> DeadLetter:
        """One dead letter (``ResourceUnknown`` when not held)."""
        return self.dead_letter_admin.show(letter_id)

    def replay_dead_letter(self, letter_id: str, consumer: str | None = None) -> str:
        """Re-deliver a dead letter to its subscription or to ``consumer``; where it went."""
        return self.dead_letter_admin.replay(letter_id, consumer)

    def purge_dead_letters(
        self, letter_ids: Sequence[str] | None = None, destination: str | None = None
    ) -> int:
        """Remove dead letters (all held, or those named); how many."""
        return self.dead_letter_admin.purge(letter_ids, destination)

    def purge_pull_point(self, pull_point_id: str) -> int | None:
        """Drop every message waiting in the pull point; how many (None: unknown)."""
        self._gate.require_middleware()
        return self.pull_points.purge(pull_point_id)

    # -- the backlog (metrics, the admin page's charts) --------------------------------------
    def _backlog(self) -> float:
        """Messages waiting over every subscription and pull point: one bulk ``depths``
        call to the adapter, plus what core's pull buffers hold."""
        try:
            depths = self.adapter.depths(self.registry.handles())
        except Exception:
            log.debug("reading the backlog failed", exc_info=True)
            depths = []
        return float(sum(d or 0 for d in depths) + self.registry.buffered())

    def _subscription_backlogs(self) -> list[tuple[str, float]]:
        """(id, backlog) of every live subscription whose backlog the middleware can tell
        (one bulk ``depths`` call)."""
        if not self._started or self._closed:
            return []
        return [
            (s.record.id, float(s.backlog))
            for s in self.operations.subscriptions()
            if s.backlog is not None
        ]
