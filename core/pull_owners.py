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
the store at most every :data:`FRESH` seconds.

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
    ) -> None:
        #: whether a pull point has one reading instance (cluster mode, no native pull)
        self.active = active
        self.instance = instance
        self._shards = shards
        self._lease = lease
        self._delivers = delivers
        self._instances = instances
        self._retry_after = retry_after
        self._secret_of = secret
        self._secret: str | None = None
        self._lock = threading.Lock()
        self._table: list[InstanceInfo] = []
        self._read_at = -FRESH

    def secret(self) -> str:
        """The cluster's secret that signs forwarded requests (read from the store once)."""
        if self._secret is None:
            self._secret = self._secret_of()
        return self._secret

    def reads_here(self, pull_point_id: str) -> bool:
        """Whether this instance may read the pull point now."""
        return not self.active or self._delivers(pull_point_id)

    def refusal(self, pull_point_id: str) -> errors.ResourceUnavailable:
        """:func:`handed_over` with this cluster's ``Retry-After``."""
        return handed_over(pull_point_id, self._retry_after)

    def reader(self, pull_point_id: str) -> Reader:
        """Who reads the pull point now.

        :raises errors.ResourceUnavailable: no live instance holds its shard (retry later)
        """
        if self.reads_here(pull_point_id):
            return _HERE
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
                f"the store does not answer: {exc}; retry later", retry_after=self._retry_after
            ) from exc
        with self._lock:
            self._table, self._read_at = table, now
        return table
