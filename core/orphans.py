"""The orphan sweep: removes durable subscriptions the middleware keeps for a subscription
or pull point that the store no longer has (a delete that failed while the middleware was
away, a process killed between the store and the middleware, a refused Subscribe or
CreatePullPoint whose durable subscription was already made).  Such a queue or session
would otherwise hold messages for nobody, for ever.

Runs on a ``core.periodic.PeriodicTask`` every ``termination.orphan_sweep_interval``, on
one instance of a cluster (the leader, as the lifetime sweep) and on a single instance.
Only adapters that list their durable subscriptions (``Adapter.subscription_names``) and
list only their own (``Capabilities.own_names``) are swept.  A name is removed only after
it was found without a record by every sweep for ``termination.orphan_grace``: the list
is read before the store in each round, so a resource whose durable subscription is made
before its record (CreatePullPoint, on any instance) is never removed while it is being
made, as long as making it takes less than the grace.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from wsnmom.core import metrics
from wsnmom.core.adapter import AdapterError
from wsnmom.core.context import BrokerContext
from wsnmom.core.dead_letters import is_box_name
from wsnmom.core.periodic import PeriodicTask

__all__ = ["OrphanSweep"]

log = logging.getLogger(__name__)


class OrphanSweep:
    """One orphan sweep per ``sweep`` call (see the module docstring)."""

    def __init__(self, ctx: BrokerContext, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._ctx = ctx
        term = ctx.settings.termination
        #: seconds a name must stay without a record (``termination.orphan_grace``)
        self.grace = term.orphan_grace.total_seconds()
        interval = term.orphan_sweep_interval.total_seconds()
        #: the periodic thread (None: ``interval`` 0, the sweep is off)
        self._task = (
            PeriodicTask(self.sweep, name="wsnmom-orphans", interval=interval)
            if interval > 0
            else None
        )
        #: seconds, monotonic (tests set their own)
        self.clock = clock
        #: name -> when a sweep first found it without a record (and every one since)
        self._seen: dict[str, float] = {}

    def start(self) -> None:
        """Sweep every interval from now on (nothing when the sweep is off)."""
        if self._task is not None:
            self._task.start()

    def stop(self) -> None:
        """Stop sweeping (a round under way finishes first, up to the task's timeout)."""
        if self._task is not None:
            self._task.stop()

    def _orphans(self) -> set[str] | None:
        """The names the adapter lists that no stored subscription or pull point has
        (dead-letter boxes aside: core's own); None when either cannot be read."""
        ctx = self._ctx
        try:
            listed = ctx.adapter.subscription_names()
        except AdapterError as exc:
            log.debug("orphan sweep: listing durable subscriptions failed: %s", exc)
            return None
        if listed is None:
            return None
        try:
            # after the list: a record stored before the list was read is seen here
            known = {s.id for s in ctx.store.list_subscriptions()}
            known.update(p.id for p in ctx.store.list_pull_points())
        except Exception:
            log.warning("orphan sweep: reading the store failed", exc_info=True)
            return None
        return {name for name in listed if name not in known and not is_box_name(name)}

    def sweep(self) -> list[str]:
        """Remove the orphans found in every sweep for the grace; the names removed."""
        ctx = self._ctx
        if not ctx.adapter.capabilities.own_names or not ctx.leads():
            self._seen.clear()  # a leader to come starts its own grace
            return []
        orphans = self._orphans()
        if orphans is None:
            return []
        now = self.clock()
        self._seen = {name: self._seen.get(name, now) for name in orphans}
        removed: list[str] = []
        for name, since in sorted(self._seen.items()):
            if now - since < self.grace:
                continue
            try:
                ctx.adapter.delete_subscription(name)
            except AdapterError as exc:
                log.warning("removing the orphan durable subscription %s failed: %s", name, exc)
                continue
            del self._seen[name]
            metrics.ORPHANS_REMOVED.inc()
            log.warning(
                "removed the orphan durable subscription %s: no subscription or pull point "
                "of that name in the store for %.0f s",
                name,
                now - since,
            )
            removed.append(name)
        return removed
