"""This broker instance among those sharing its store, as ``BrokerService`` wires it
(:class:`ClusterParts`): the follower that loads what other instances wrote
(``core.follow``), shard ownership (``core.ownership``), the membership itself
(``core.cluster``), which instance reads a pull point core buffers (``core.pull_owners``),
the topic set the instances share (``core.topic_share``), and core's position fence,
which the adapter asks before it saves a position (``may_save``).  On a store only one
instance opens (SQLite) the same parts exist, but no shared topic set; the adapter is
given no fence then.  On PostgreSQL the adapter is also handed the store's positions
table, whose writes are fenced by shard epochs (``FencedPositions``, ``token``).
"""

from __future__ import annotations

from collections.abc import Callable

from wsnmom.core.cluster import ClusterMember
from wsnmom.core.context import BrokerContext
from wsnmom.core.departed import DepartedSweep
from wsnmom.core.follow import Follower
from wsnmom.core.orphans import OrphanSweep
from wsnmom.core.ownership import Ownership
from wsnmom.core.position_fence import FencedPositions
from wsnmom.core.pull_owners import PullOwners
from wsnmom.core.pull_points import PullPoints
from wsnmom.core.registrations import Registrations
from wsnmom.core.subscriptions import Subscriptions
from wsnmom.core.topic_share import SharedTopics

__all__ = ["FEEDS_REMEMBERED", "ClusterParts"]

#: feeds whose pull point the position fence remembers (``ClusterParts.may_save``)
FEEDS_REMEMBERED = 65536


class ClusterParts:
    """This instance's part in a cluster (see the module docstring)."""

    def __init__(
        self,
        ctx: BrokerContext,
        subscriptions: Subscriptions,
        pull_points: PullPoints,
        registrations: Registrations,
        orphans: OrphanSweep,
        *,
        became_leader: Callable[[], None],
    ) -> None:
        self._ctx = ctx
        settings = ctx.settings
        self.follower = Follower(ctx, subscriptions, pull_points, registrations)
        #: opens and closes deliveries as shards come and go (``core.ownership``)
        self.ownership = ownership = Ownership(ctx, subscriptions)
        #: feed subscription -> the pull point it feeds (the position fence's cache)
        self._feeds: dict[str, str] = {}
        #: this instance among those sharing the store (``core.cluster``)
        self.cluster = ClusterMember(
            ctx.store.coordination(ctx.instance_id),
            settings.cluster,
            self.follower,
            gained=ownership.gained,
            lost=ownership.lost,
            held=ownership.reconcile,
            became_leader=became_leader,
        )
        #: which instance reads a pull point core buffers (``core.pull_owners``)
        self.pull_owners = PullOwners(
            active=False,  # known once the adapter is open (start)
            instance=ctx.instance_id,
            shards=settings.cluster.shards,
            lease=settings.cluster.lease.total_seconds(),
            delivers=self.cluster.delivers,
            instances=self.cluster.instances,
            retry_after=settings.middleware.retry_after,
            secret=self.cluster.coordination.secret,
            first_use=self.cluster.coordination.first_use,
            fed_by=self.fed_by,
            is_pull_point=self.is_pull_point,
        )
        #: records the topics admitted here, takes in the others' (``core.topic_share``);
        #: None on a store only this instance opens
        self.topics = (
            SharedTopics(ctx.store, ctx.topic_set, limit=settings.quotas.ad_hoc_topics)
            if self.cluster.shared
            else None
        )
        if self.cluster.shared:
            ctx.adapter.shared_by_instances(self.may_save)
            table = self.cluster.coordination.positions()
            if table is not None:  # positions fenced by shard epochs in the store
                ctx.adapter.positions_kept_by(FencedPositions(table, self.token))
                orphans.kept = table.names  # rows no record names: swept after the grace
            ctx.adapter.kept_in_store(self.stored)
            ctx.adapter.kept_in_store_many(ctx.store.held)
            ctx.adapter.joined_as(ctx.instance_id)
            ctx.delivers = self.cluster.delivers
            ctx.leads = self.cluster.leads
            ctx.leader_epoch = self.cluster.leader_epoch
            ctx.registry.loader = self.follower.load
            # what departed instances left behind, after the grace (``core.departed``)
            grace = settings.termination.orphan_grace.total_seconds()
            orphans.departed = DepartedSweep(ctx.adapter, self.cluster.instances, grace).sweep

    def may_save(self, name: str) -> bool:
        """Core's position fence (``Adapter.shared_by_instances``): a subscription that
        feeds a pull point core buffers is read where that pull point is read
        (``core.pull_owners``), so it is fenced by the pull point's shard; any other name
        by its own (``ClusterMember.may_save``, clean hand-back grace included).  Asked
        before every position write: the feed's pull point is read from the registry (a
        dict read) and remembered, so a feed destroyed a moment ago is still fenced by
        its pull point; never a store query."""
        return self.cluster.may_save(self._fenced_by(name))

    def token(self, name: str) -> tuple[int, int] | None:
        """The fencing token of ``name``'s position writes in the store
        (``core.position_fence``): the shard ``may_save`` fences it by and the epoch this
        instance holds that shard with (``ClusterMember.token``); None when ``may_save``
        says no."""
        return self.cluster.token(self._fenced_by(name))

    def _fenced_by(self, name: str) -> str:
        """The name whose shard fences ``name``'s positions: a feed's pull point, else
        ``name`` itself (``may_save``)."""
        if self.pull_owners.active:
            pull_point = self._feeds.get(name)
            if pull_point is None:
                state = self._ctx.registry.subscriptions.get(name)
                pull_point = state.record.pull_point_id if state is not None else None
                if pull_point is not None:
                    if len(self._feeds) >= FEEDS_REMEMBERED:
                        self._feeds.clear()
                    self._feeds[name] = pull_point
            if pull_point is not None:
                return pull_point
        return name

    def stored(self, name: str) -> bool:
        """Whether the store holds the subscription or pull point ``name``
        (``Adapter.kept_in_store``): a store query, asked by the adapter only when it
        found the durable subscription gone from the middleware.  The store is the truth
        about existence: every removal deletes the store's record before the middleware's
        durable subscription (``Subscriptions.destroy``, ``PullPoints.destroy``)."""
        return name in self._ctx.store.held((name,))  # one query (``Store.held``)

    def is_pull_point(self, resource_id: str) -> bool:
        """Whether a pull point has the id (``core.pull_owners``): known here, else in the
        store (made through another instance a moment ago)."""
        if resource_id in self._ctx.registry.pull_points:
            return True
        return self._ctx.store.get_pull_point(resource_id) is not None

    def fed_by(self, subscription_id: str) -> str | None:
        """The pull point a subscription feeds (``core.pull_owners``): read from memory,
        else from the store (made through another instance a moment ago)."""
        state = self._ctx.registry.subscriptions.get(subscription_id)
        record = (
            state.record if state is not None else self._ctx.store.get_subscription(subscription_id)
        )
        return None if record is None else record.pull_point_id
