"""Demand-based publishing (WS-BrokeredNotification §4, DEM-01..06).

For each live registration with ``Demand=true`` the broker keeps at most one subscription
at the publisher's NotificationProducer (DEM-04), covering all registered topics, with the
broker's own NotificationBroker address as consumer (so the publisher's Notify messages
arrive at the normal Notify path).

Decisions (advertised in the policy document):

* *Demand* exists while at least one active (not paused, not expired) subscription has a
  topic filter that can select one of the registered topics; a subscription without a
  topic filter selects everything.  MessageContent filters are not considered.
* The broker subscribes lazily, when demand first appears (not at registration time): a
  publisher nobody wants is never contacted (the peers' tests expect this).
* When demand disappears the broker sends PauseSubscription (DEM-03); if pausing fails it
  falls back to Unsubscribe and subscribes afresh on the next demand (DEM-06).
* When demand comes back it sends ResumeSubscription; if resuming fails it subscribes
  afresh.
* DestroyRegistration and registration expiry send Unsubscribe.
* With several instances on one store only the leader calls publishers (Subscribe,
  Pause, Resume) and writes their subscriptions into the store; its first pass as leader
  reads them from the store first (``refresh``), since it may not have followed its
  predecessor's last save.  Each save carries the leadership epoch the pass began under,
  and the store refuses it once another instance took the leadership (``Deposed``: the
  leader was deposed while a call was in flight): the pass ends, a subscription it had
  just made is unsubscribed (nobody else knows it), and this instance does no more
  passes under that epoch.
* Calls to publishers run on a background thread (``reconcile``) after every change and
  every ``interval`` seconds, so a slow or unreachable publisher never delays a
  Subscribe; failures are retried on the next pass.  Wake-ups are coalesced (at most one
  pass per ``min_spacing`` seconds), and a pass with no demand-based registration returns
  without looking at the subscriptions: a Subscribe costs O(1) here, not O(subscriptions).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from wsnmom.core.coordination import SINGLE_EPOCH
from wsnmom.core.filters import expressions_overlap
from wsnmom.core.model import EndpointReference, PublisherRegistration
from wsnmom.core.periodic import PeriodicTask
from wsnmom.core.ports import DeliveryFailed, OutboundSoap
from wsnmom.core.store import Deposed
from wsnmom.topic_mapping.model import TopicExpression

log = logging.getLogger(__name__)


@dataclass(slots=True)
class DemandEntry:
    """A demand-based registration as the demand manager sees it."""

    registration: PublisherRegistration
    topics: tuple[TopicExpression, ...]


class DemandManager:
    """Keeps the broker's subscriptions at demand-based publishers in line with demand."""

    def __init__(
        self,
        outbound: OutboundSoap,
        *,
        broker_consumer: Callable[[], EndpointReference],
        entries: Callable[[], Sequence[DemandEntry]],
        active_filters: Callable[[], Sequence[TopicExpression | None]],
        save: Callable[[PublisherRegistration, int], bool],
        timeout: float = 10.0,
        interval: float = 5.0,
        min_spacing: float = 0.1,
        leadership: Callable[[], int | None] = lambda: SINGLE_EPOCH,
        refresh: Callable[[], None] = lambda: None,
    ) -> None:
        self.outbound = outbound
        #: the epoch of the leadership this instance holds, None when it does not lead
        #: (with several on one store, only the leader reconciles)
        self._leadership = leadership
        #: brings the records' publisher subscriptions in line with the store, at the
        #: first pass as leader (the leader before may have saved one not followed here)
        self._refresh = refresh
        self._led = False
        #: an epoch under which a save was refused: no more passes under it
        self._deposed: int | None = None
        self._broker_consumer = broker_consumer
        self._entries = entries
        self._active_filters = active_filters
        self._save = save
        self.timeout = timeout
        self.interval = interval
        self._lock = threading.Lock()
        self._task = PeriodicTask(
            self.reconcile,
            name="wsnmom-demand",
            interval=interval,
            join_timeout=timeout + 5,
            min_spacing=min_spacing,
        )
        self._retired: list[EndpointReference] = []

    # -- thread ----------------------------------------------------------------------------
    def start(self) -> None:
        """Start the background reconciler (idempotent)."""
        self._task.start()

    def wake(self) -> None:
        """Demand may have changed: reconcile soon."""
        self._task.wake()

    def stop(self) -> None:
        """Stop the reconciler."""
        self._task.stop()

    # -- logic -----------------------------------------------------------------------------
    @staticmethod
    def wanted(entry: DemandEntry, filters: Sequence[TopicExpression | None]) -> bool:
        """Whether any active subscription filter overlaps the registered topics."""
        return any(expressions_overlap(f, t) for f in filters for t in entry.topics)

    def reconcile(self) -> None:
        """Subscribe / pause / resume / unsubscribe at publishers as demand requires.

        The active subscription filters (a scan of every subscription) are asked for only
        when there is a demand-based registration with a publisher to call.
        """
        with self._lock:
            retired, self._retired = self._retired, []
            for ref in retired:
                self._unsubscribe(ref)
            epoch = self._leadership()
            if epoch is None or epoch == self._deposed:
                self._led = False
                return
            if not self._led:
                self._refresh()
                self._led = True
            entries = [
                e
                for e in self._entries()
                if e.registration.demand and e.registration.publisher_reference is not None
            ]
            if not entries:
                return
            filters = list(self._active_filters())
            try:
                for entry in entries:
                    reg = entry.registration
                    if self.wanted(entry, filters):
                        self._ensure_flowing(reg, epoch)
                    else:
                        self._ensure_paused(reg, epoch)
            except Deposed:
                # the next leader read the store when it took over: this instance's
                # records are taken from the store again if it leads once more
                self._deposed, self._led = epoch, False

    def release(self, reg: PublisherRegistration) -> None:
        """The registration is gone: unsubscribe at the publisher (in the background)."""
        if reg.demand_subscription is not None:
            with self._lock:
                self._retired.append(reg.demand_subscription)
                reg.demand_subscription = None
            self.wake()

    def _ensure_flowing(self, reg: PublisherRegistration, epoch: int) -> None:
        assert reg.publisher_reference is not None
        if reg.demand_subscription is not None and not reg.demand_paused:
            return
        if reg.demand_subscription is not None:
            try:
                self.outbound.resume(reg.demand_subscription, timeout=self.timeout)
            except DeliveryFailed as exc:
                log.info("resume at publisher failed (%s); subscribing afresh", exc.reason)
                self._unsubscribe(reg.demand_subscription)
                reg.demand_subscription = None
            else:
                reg.demand_paused = False
                self._save_under(reg, epoch)
                return
        try:
            ref = self.outbound.subscribe(
                reg.publisher_reference,
                self._broker_consumer(),
                list(reg.topics),
                timeout=self.timeout,
            )
        except DeliveryFailed as exc:
            log.warning(
                "demand subscribe at publisher %s failed: %s; will retry",
                reg.publisher_reference.address,
                exc.reason,
            )
            self._save_under(reg, epoch)
            return
        reg.demand_subscription = ref
        reg.demand_paused = False
        try:
            saved = self._save(reg, epoch)
        except Deposed:
            log.warning(
                "demand: registration %s: save refused, this instance no longer leads "
                "(epoch %d); unsubscribing the subscription it just made at %s",
                reg.id,
                epoch,
                ref.address,
            )
            reg.demand_subscription = None
            self._unsubscribe(ref)
            raise
        if not saved:
            # destroyed meanwhile, through another instance whose DestroyRegistration
            # knew no subscription at the publisher yet: nobody else will end this one
            log.info("registration %s is gone: unsubscribing at its publisher", reg.id)
            reg.demand_subscription = None
            self._unsubscribe(ref)

    def _ensure_paused(self, reg: PublisherRegistration, epoch: int) -> None:
        if reg.demand_subscription is None or reg.demand_paused:
            return
        try:
            self.outbound.pause(reg.demand_subscription, timeout=self.timeout)
        except DeliveryFailed as exc:
            log.info("pause at publisher failed (%s); unsubscribing instead", exc.reason)
            self._unsubscribe(reg.demand_subscription)
            reg.demand_subscription = None
            reg.demand_paused = False
        else:
            reg.demand_paused = True
        self._save_under(reg, epoch)

    def _save_under(self, reg: PublisherRegistration, epoch: int) -> None:
        """Save a change of ``reg`` at its publisher other than a new subscription; a
        refused save is logged and ends the pass.  The Pause or Resume it records was
        made: until the next change of demand the publisher may disagree with what the
        new leader read from the store (no call can be taken back)."""
        try:
            self._save(reg, epoch)
        except Deposed:
            log.warning(
                "demand: registration %s: save refused, this instance no longer leads "
                "(epoch %d); the publisher's subscription is left to the new leader",
                reg.id,
                epoch,
            )
            raise

    def _unsubscribe(self, ref: EndpointReference) -> None:
        try:
            self.outbound.unsubscribe(ref, timeout=self.timeout)
        except DeliveryFailed as exc:
            log.info("unsubscribe at publisher %s failed: %s", ref.address, exc.reason)
