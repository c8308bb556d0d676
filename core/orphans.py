"""The orphan sweep: removes durable subscriptions the middleware keeps for a subscription
or pull point that the store does not have (a process killed between making the durable
subscription and storing its record, a refused Subscribe or CreatePullPoint whose undo
failed, a delete that failed while the middleware was away).  Such a queue or session
would otherwise hold messages for nobody, for ever.

Runs on a ``core.periodic.PeriodicTask`` every ``termination.orphan_sweep_interval``, on
one instance of a cluster (the leader, as the lifetime sweep) and on a single instance;
a single instance (no other instance shares its store) also sweeps once at start.  Two
ways of finding orphans:

* **Intents**, on every adapter.  Before core asks the adapter to make a new durable
  subscription it stores the name as an intent (``Store.put_intent``); the record's write
  removes it in the same statement (``Store.add_subscription``/``add_pull_point``).  An
  intent older than ``termination.orphan_grace`` (by the store's clock) is an orphan's:
  the sweep removes the intent (only if still that old), then deletes the durable
  subscription (idempotent).  Removing the intent first is what makes this safe against a
  Subscribe still under way, however slow: its record's write finds no intent and fails
  (``IntentGone``), and the Subscribe deletes its own durable subscription and is
  refused.  An intent whose record exists is removed, if still that old (one a removal
  wrote anew meanwhile is that removal's).  At start a single instance
  sweeps every intent, whatever its age: no Subscribe can be under way.  A removal
  (Unsubscribe, DestroyPullPoint, expiry) writes an intent in the record's delete
  (``Store.delete_subscription(intent=True)``) and removes it once the middleware's
  delete succeeded: a crash or a refused delete in between leaves it to the sweep.
* **Listing**, where the adapter lists its durable subscriptions and only its own
  (``Capabilities.own_names``: embedded, MQTT), and, in cluster mode where core keeps the
  adapter's delivery positions in the store (Kafka, ``core.position_fence``), the names
  those positions are kept for (``kept``): it also finds orphans no intent names (a failed
  delete, and those made before intents existed; on Kafka the rows, and through the
  adapter's delete the consumer group, of a subscription whose delete was taken by the
  adapter, so its intent dropped, and then failed until the process stopped).  A listed
  name is removed only after it was found without a record by every sweep for
  ``termination.orphan_grace``: the round's time is read before the list, and the list
  before the store.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from datetime import UTC, datetime

from wsnmom.core import metrics
from wsnmom.core.adapter import AdapterError
from wsnmom.core.context import BrokerContext
from wsnmom.core.dead_letter_records import is_box_name
from wsnmom.core.periodic import PeriodicTask
from wsnmom.core.store import Store

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
        #: cluster mode: retires what departed instances kept (``core.departed``), run
        #: after each round of the leader's sweep
        self.departed: Callable[[], list[str]] | None = None
        #: cluster mode with positions kept in the store: the names kept, listed with the
        #: adapter's own (``PositionTable.names``)
        self.kept: Callable[[], Collection[str]] | None = None

    def start(self) -> None:
        """Sweep every interval from now on (nothing when the sweep is off)."""
        if self._task is not None:
            self._task.start()

    def stop(self) -> None:
        """Stop sweeping (a round under way finishes first, up to the task's timeout)."""
        if self._task is not None:
            self._task.stop()

    def _orphans(self) -> set[str] | None:
        """The names the adapter lists (``own_names``) and those positions are kept for
        (``kept``) that no stored subscription or pull point has (dead-letter boxes
        aside: core's own); None when any of them cannot be read."""
        ctx = self._ctx
        listed: set[str] = set()
        if ctx.adapter.capabilities.own_names:
            try:
                names = ctx.adapter.subscription_names()
            except AdapterError as exc:
                log.debug("orphan sweep: listing durable subscriptions failed: %s", exc)
                return None
            if names is None:
                return None
            listed.update(names)
        try:
            if self.kept is not None:
                listed.update(self.kept())
            # after the list: a record stored before the list was read is seen here
            known = {s.id for s in ctx.store.list_subscriptions()}
            known.update(p.id for p in ctx.store.list_pull_points())
        except Exception:
            log.warning("orphan sweep: reading the store failed", exc_info=True)
            return None
        return {name for name in listed if name not in known and not is_box_name(name)}

    def at_start(self, *, shared: bool) -> list[str]:
        """A single instance (not ``shared``), before it serves: every intent is an
        orphan's (no Subscribe is under way); the names removed.  Nothing in a cluster
        (its leader sweeps) or when the sweep is off."""
        return [] if shared or self._task is None else self.sweep_intents(0.0)

    def sweep(self) -> list[str]:
        """One round: the intents older than the grace, then (``own_names``, ``kept``)
        the listed orphans found in every sweep for the grace, then (cluster mode) what
        departed instances kept (``core.departed``); the names removed."""
        if not self._ctx.leads():
            self._seen.clear()  # a leader to come starts its own grace
            return []
        removed = self.sweep_intents(self.grace)
        if self._ctx.adapter.capabilities.own_names or self.kept is not None:
            removed += self._sweep_listed(set(removed))
        if self.departed is not None:
            removed += self.departed()
        return removed

    def sweep_intents(self, older_than: float) -> list[str]:
        """Delete the durable subscription of each intent at least ``older_than`` seconds
        old that no record names, and the intent; the names whose durable subscription
        was deleted."""
        store = self._ctx.store
        try:
            stale = store.list_intents(older_than)
        except Exception:
            log.warning("orphan sweep: reading the intents failed", exc_info=True)
            return []
        removed: list[str] = []
        for name, at in stale:
            try:
                if self._remove_intended(store, name, at, older_than):
                    removed.append(name)
            except Exception:
                log.warning("orphan sweep: the intent of %s failed", name, exc_info=True)
        return removed

    def _remove_intended(self, store: Store, name: str, at: datetime, older_than: float) -> bool:
        """One stale intent (see :meth:`sweep_intents`); True when its durable
        subscription was deleted."""
        if name in store.held((name,)):
            # its record exists: the durable subscription is live.  Only if still that
            # old: a removal since the read (a round stopped here, then woken) wrote it
            # anew, and it is that removal's, for a delete on the middleware that failed
            store.delete_intent(name, older_than)
            return False
        # the intent first: a Subscribe still under way now fails to store its record
        if not store.delete_intent(name, older_than):
            return False  # its record was stored meanwhile
        try:
            self._ctx.adapter.delete_subscription(name)
        except AdapterError as exc:
            log.warning("removing the orphan durable subscription %s failed: %s", name, exc)
            store.put_intent(name, at)  # the next round tries again
            return False
        metrics.ORPHANS_REMOVED.inc()
        age = (datetime.now(UTC) - at).total_seconds()
        log.warning(
            "removed the orphan durable subscription %s: its intent, %.0f s old, was left "
            "by a Subscribe or CreatePullPoint that never stored its record, or by a removal "
            "that deleted the record but not the durable subscription",
            name,
            age,
        )
        return True

    def _sweep_listed(self, just_removed: set[str]) -> list[str]:
        """The listed orphans found in every sweep for the grace, removed; not those the
        round's intents removed (``just_removed``): an adapter may delete after it
        answered (Kafka's cursor engine queues the delete of a cursor's rows and group),
        so they can still be listed, and were removed a second time.  Listed again in a
        later round, such a name starts its grace anew."""
        ctx = self._ctx
        # the time of the round is its listing's, read before it: a round stopped after
        # its store read (SIGSTOP, then SIGCONT) counts none of the stop as time without
        # a record (a Subscribe may have stored its record meanwhile)
        now = self.clock()
        orphans = self._orphans()
        if orphans is None:
            return []
        orphans -= just_removed
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
