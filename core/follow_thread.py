"""The cluster member's follow thread (``core.cluster``): reads the change log other
instances write, woken by the store (LISTEN/NOTIFY) and at least every ``cluster.poll``
seconds, and hands the changes to ``core.follow``; a change whose following failed is
followed again until it succeeds.

Following a subscription made through another instance declares it in the middleware
(round trips): a burst of Subscribes keeps this thread busy for as long as it lasts, which
is why it is a thread apart from the heartbeat's.  A change whose following failed here
(the middleware closed the connection under its declaration, the store did not answer) is
followed again, first after :data:`FOLLOW_RETRY_EVERY` seconds, the wait doubling after
each failure up to :data:`FOLLOW_RETRY_LONGEST`, each try re-reading the store (a resource
destroyed meanwhile stops failing).  It is never given up: a subscription made elsewhere
and unknown here is delivered by nobody when this instance holds its shard.  One failing
for :data:`FOLLOW_RETRY_ALARM` seconds is logged as an ERROR, once.  Only the thread
writes a :class:`FollowThread`'s state; others read how many changes are failing
(``len``: ``wsnmom_cluster_follow_failing``, the cluster status) and its longest round.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from itertools import takewhile

from wsnmom.core import metrics
from wsnmom.core.coordination import Change, Coordination
from wsnmom.core.follow import Follower

__all__ = ["FOLLOW_RETRY_ALARM", "FOLLOW_RETRY_EVERY", "FOLLOW_RETRY_LONGEST", "FollowThread"]

log = logging.getLogger(__name__)

#: seconds until a change whose following failed is followed again; the wait doubles
#: after each failure, up to ``FOLLOW_RETRY_LONGEST``
FOLLOW_RETRY_EVERY = 2.0
FOLLOW_RETRY_LONGEST = 60.0
#: seconds of failing after which a change's following is logged as an ERROR (once)
FOLLOW_RETRY_ALARM = 300.0


@dataclass(slots=True)
class _Retry:
    """A change whose following failed: when it first failed, when it is tried next, and
    the wait after its next failure."""

    first: float
    at: float
    wait: float
    alarmed: bool = False


class FollowThread:
    """The follow thread's round and its state (see the module docstring)."""

    def __init__(
        self,
        coordination: Coordination,
        follower: Follower,
        poll: float,
        stop: threading.Event,
        instance: Callable[[], str],
    ) -> None:
        self._coordination = coordination
        self._follower = follower
        self._poll = poll
        self._stop = stop
        self._instance = instance
        #: the change log's position read up to (set by ``ClusterMember.join``)
        self.cursor = 0
        #: seconds the longest round took (None: none yet)
        self.longest: float | None = None
        self._failed: dict[Change, _Retry] = {}

    def __len__(self) -> int:
        """How many changes are failing now."""
        return len(self._failed)

    def run(self) -> None:
        """Follow the change log until stopped (the thread's target)."""
        while not self._stop.is_set():
            self.round()
            try:
                self._coordination.wait(self._poll)
            except Exception:
                log.debug("waiting for store changes failed", exc_info=True)
                self._stop.wait(self._poll)

    def round(self) -> None:
        """Read the change log once and follow what it holds, with the failing changes
        whose wait is over."""
        started = time.monotonic()
        try:
            self.cursor, changes = self._coordination.changes(self.cursor)
        except Exception:
            log.debug("reading the change log failed", exc_info=True)
            return
        # a change whose following failed earlier first, when its wait is over (a
        # subscription declared in the middleware when it was made elsewhere: unknown
        # here, nobody would deliver it)
        again = self._due(started, set(changes))
        if again or changes:
            tried = [*again, *changes]
            # a burst is thousands of middleware declarations: a stop does not wait for them
            failed = self._follower.apply(takewhile(lambda _: not self._stop.is_set(), tried))
            self._remember(tried, failed)
        took = time.monotonic() - started
        metrics.CLUSTER_FOLLOW_SECONDS.observe(took)
        if self.longest is None or took > self.longest:
            self.longest = took

    def _due(self, now: float, fresh: Collection[Change]) -> list[Change]:
        """The failing changes whose wait is over at ``now`` (monotonic), but for those
        of ``fresh`` (read from the change log just now: followed with them)."""
        return [c for c, r in self._failed.items() if now >= r.at and c not in fresh]

    def _remember(self, tried: Iterable[Change], failed: list[Change]) -> None:
        """Forget the changes of ``tried`` followed now; schedule those of ``failed`` again
        (the wait doubling from :data:`FOLLOW_RETRY_EVERY` to
        :data:`FOLLOW_RETRY_LONGEST`), with an ERROR once one fails for
        :data:`FOLLOW_RETRY_ALARM` seconds."""
        now = time.monotonic()
        still = set(failed)
        for change in tried:
            if change not in still:
                self._failed.pop(change, None)
        for change in failed:
            r = self._failed.get(change)
            if r is None:
                r = self._failed[change] = _Retry(now, 0.0, FOLLOW_RETRY_EVERY)
            r.at = now + r.wait
            r.wait = min(r.wait * 2, FOLLOW_RETRY_LONGEST)
            if not r.alarmed and now - r.first >= FOLLOW_RETRY_ALARM:
                r.alarmed = True
                log.error(
                    "instance %s has failed to follow %s %s for %.0f s: it tries again "
                    "every %.0f s; until then nobody may deliver it (its shard's owner "
                    "does not know it)",
                    self._instance(),
                    change.kind,
                    change.id,
                    now - r.first,
                    FOLLOW_RETRY_LONGEST,
                )
