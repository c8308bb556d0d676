"""Which instance of a cluster reads a pull point whose messages core buffers.

On a middleware without a pull of its own (``Capabilities.native_pull`` False: Kafka,
filelog) core reads a pull point through a buffer (``core.pull_buffer``) that holds
messages taken from the middleware until GetMessages hands them out.  Two instances
buffering one pull point would each hand out every message once.  So in cluster mode a
pull point has exactly one reading instance: the one holding the lease of the pull
point's shard (hashed like push subscriptions, ``core.coordination.shard_of``).  Only
that instance starts the pull point's buffer (``core.ownership``), and a GetMessages
arriving at another instance is forwarded there (``soap_frontend.pull_forward``).

:meth:`PullOwners.reader` answers for a pull point: this instance (read here), another
instance's address (forward there), or a refusal to retry later (no live instance holds
the shard now: a failover or a hand-over is under way).  The instance table is read from
the store at most every :data:`FRESH` seconds.  :meth:`PullOwners.holder` answers the
same for any resource whose shard decides where its backlog is read (a push
subscription's deliverer holds what its delivery took from the middleware): an
operator's purge or peek goes there, on every middleware in cluster mode.
:meth:`PullOwners.pull_point_fed_by` names the pull point a subscription feeds (an ONVIF
pull-point subscription is read where its pull point is); :meth:`PullOwners.is_pull_point`
tells a pull point's id from another resource's (a request naming its resource by a
``ResourceId`` reference parameter alone).

Every forwarded request carries a nonce; :meth:`PullOwners.first_use` records it in the
store (``Coordination.first_use``), so a request replayed to any instance is refused.

On a single instance, or a middleware with a native pull (RabbitMQ's ``basic.get``:
every instance takes from one queue), every instance reads every pull point:
:attr:`PullOwners.active` is False and nothing is forwarded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from wsnmom.core import errors
from wsnmom.core.coordination import InstanceInfo, shard_of

__all__ = ["FRESH", "PullOwners", "Reader", "handed_over"]

#: seconds an instance table read from the store is used for
FRESH = 0.5


@dataclass(frozen=True, slots=True)
class Reader:
    """Who reads a pull point: this instance (``here``), or the instance ``instance`` at
    ``address``."""

    here: bool
    instance: str = ""
    address: str = ""


_HERE = Reader(True)


def handed_over(pull_point_id: str, retry_after: float) -> errors.ResourceUnavailable:
    """The "try again" answer to a GetMessages at an instance that does not read the pull
    point while no live instance does (HTTP 503, ``Retry-After``): never a read there,
    which could hand a message out twice."""
    return errors.ResourceUnavailable(
        f"pull point {pull_point_id} is being handed over between instances of the "
        "cluster; retry later",
        retry_after=retry_after,
    )


class PullOwners:
    """Which instance reads each pull point (see the module docstring)."""

    def __init__(
        self,
        *,
        active: bool,
        instance: str,
        shards: int,
        lease: float,
        delivers: Callable[[str], bool],
        instances: Callable[[], list[InstanceInfo]],
        retry_after: float,
        secret: Callable[[], str],
        first_use: Callable[[str, float], bool] = lambda _n, _t: True,
        fed_by: Callable[[str], str | None] = lambda _id: None,
        is_pull_point: Callable[[str], bool] = lambda _id: False,
        clustered: bool | None = None,
    ) -> None:
        #: whether a pull point has one reading instance (cluster mode, no native pull)
        self.active = active
        #: whether other instances share the store (every middleware): a push
        #: subscription's backlog is then read by its deliverer (:meth:`holder`)
        self.clustered = active if clustered is None else clustered
        self.instance = instance
        self._shards = shards
        self._lease = lease
        self._delivers = delivers
        self._instances = instances
        #: the ``Retry-After`` of this cluster's "try again"
        self.retry_after = retry_after
        self._secret_of = secret
        self._first_use = first_use
        self._fed_by = fed_by
        self._is_pull_point = is_pull_point
        self._secret: str | None = None
        self._lock = threading.Lock()
        self._table: list[InstanceInfo] = []
        self._read_at = -FRESH

    def secret(self) -> str:
        """The cluster's secret that signs forwarded requests (read from the store once)."""
        if self._secret is None:
            self._secret = self._secret_of()
        return self._secret

    def first_use(self, nonce: str, expires_at: float) -> bool:
        """Record a forwarded request's nonce until ``expires_at`` (Unix seconds); False
        when any instance recorded it before (a replay)."""
        return self._first_use(nonce, expires_at)

    def pull_point_fed_by(self, subscription_id: str) -> str | None:
        """The pull point the subscription feeds (None: none, or no such subscription)."""
        return self._fed_by(subscription_id)

    def is_pull_point(self, resource_id: str) -> bool:
        """Whether ``resource_id`` names a pull point (a ``ResourceId`` reference
        parameter names a resource of any kind)."""
        return self._is_pull_point(resource_id)

    def reads_here(self, pull_point_id: str) -> bool:
        """Whether this instance may read the pull point now."""
        return not self.active or self._delivers(pull_point_id)

    def refusal(self, pull_point_id: str) -> errors.ResourceUnavailable:
        """:func:`handed_over` with this cluster's ``Retry-After``."""
        return handed_over(pull_point_id, self.retry_after)

    def reader(self, pull_point_id: str) -> Reader:
        """Who reads the pull point now.

        :raises errors.ResourceUnavailable: no live instance holds its shard (retry later)
        """
        if self.reads_here(pull_point_id):
            return _HERE
        return self._holder(pull_point_id)

    def holder(self, resource_id: str) -> Reader:
        """Who holds the resource's shard now (this instance when no other instance
        shares the store).

        :raises errors.ResourceUnavailable: no live instance holds it (retry later)
        """
        if not self.clustered or self._delivers(resource_id):
            return _HERE
        return self._holder(resource_id)

    def _holder(self, pull_point_id: str) -> Reader:
        shard = shard_of(pull_point_id, self._shards)
        for fresh in (False, True):
            for info in self._table_now(fresh=fresh):
                if info.id == self.instance or not info.address:
                    continue
                if info.heartbeat_age >= self._lease or not info.lease_left:
                    continue
                if any(s == shard for s, _ in info.shards):
                    return Reader(False, info.id, info.address)
        raise self.refusal(pull_point_id)

    def forget(self) -> None:
        """Read the instance table again next time (a forward to its address failed)."""
        with self._lock:
            self._read_at = -FRESH

    def _table_now(self, *, fresh: bool) -> list[InstanceInfo]:
        now = time.monotonic()
        with self._lock:
            if not fresh and now - self._read_at < FRESH:
                return self._table
        try:
            table = self._instances()
        except Exception as exc:
            raise errors.ResourceUnavailable(
                f"the store does not answer: {exc}; retry later", retry_after=self.retry_after
            ) from exc
        with self._lock:
            self._table, self._read_at = table, now
        return table
