"""Pull points: CreatePullPoint, GetMessages, Notify to a pull point, DestroyPullPoint.

A pull point is a durable subscription bound to its private inbox topic
``{urn:wsnmom:internal:pull-point}p<id>`` (``core.codec.pull_point_inbox``), where Notify to
the pull point publishes.  The subscriptions feeding it are read by it directly, from
their own durable subscriptions (``core.pull_feeds``): through the middleware's pull
(``core.pull_reader``) or core's pull buffer (``core.pull_buffer``).  With
``Capabilities.sole_publisher`` those without a MessageContent filter are routed into the
inbox when a notification is published instead (``core.direct_routing``).

* CreatePullPoint with a known ``name`` re-attaches to that pull point.
* GetMessages: FIFO; MaximumNumber absent or 0 returns everything available up to
  ``limits.get_messages_cap``, a larger MaximumNumber at most that many; the read is
  destructive for the client (an answer written is never handed out again) and
  at-least-once for an answer lost on its way: its messages are settled in the
  middleware only once the HTTP server accepted the whole answer, and handed out again,
  first, when it was not written or the reader died meanwhile (``core.pull_handout``).
* A message older than ``limits.max_age`` where core enforces it (``core.limits``) is not
  handed out but a dead letter ("max-age"): a fed message one of its subscription's (as
  when the feed prepared it), one of the pull point's inbox one of the pull point's (the
  gateway's default destination, naming the pull point, as the middleware's drops from
  a pull point).  Its dead letter is published before the answer is given, and the
  message settled when the answer is, written or not: an answer that is not written
  gives back the messages it carried, not those it made dead letters
  (``Settlement.buried``), so each is one dead letter.  A dead letter the middleware did
  not confirm cuts the answer there: that message and those taken after it are handed
  out again, first, by the next GetMessages, which tries the dead letter again (as a
  stalled feed does, ``core.pull_stall``).
* DestroyPullPoint and pull point expiry destroy the subscriptions feeding it (DPP-04).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime

from wsnmom.core import errors, metrics
from wsnmom.core.adapter import AdapterError, Received, SubscriptionHandle, SubscriptionSpec
from wsnmom.core.codec import decode, pull_point_inbox
from wsnmom.core.context import BrokerContext
from wsnmom.core.inbound import Inbound
from wsnmom.core.lifetimes import is_expired
from wsnmom.core.model import (
    CreatePullPointRequest,
    InboundNotification,
    NotificationMessage,
    PullPoint,
    RequestedTime,
    new_resource_id,
)
from wsnmom.core.pull_buffer import Fed, PullBuffer
from wsnmom.core.pull_handout import Settlement, nack_all
from wsnmom.core.pull_owners import handed_over
from wsnmom.core.pull_reader import PullReader
from wsnmom.core.registry import LivePullPoint, LiveSubscription
from wsnmom.core.store import IntentGone, StoreError
from wsnmom.topic_mapping.model import PathPattern

__all__ = ["PullPoints", "inbox_pattern"]

log = logging.getLogger(__name__)


def inbox_pattern(pull_point_id: str) -> PathPattern:
    """The topic pattern of a pull point's inbox."""
    topic = pull_point_inbox(pull_point_id)
    return PathPattern(topic.namespace, topic.path)


class PullPoints:
    """Creates, reads and destroys pull points."""

    def __init__(
        self,
        ctx: BrokerContext,
        inbound: Inbound,
        destroy_subscription: Callable[[LiveSubscription], None],
    ) -> None:
        self._ctx = ctx
        self._inbound = inbound
        self._destroy_subscription = destroy_subscription

    def open_handle(self, pull_point_id: str) -> SubscriptionHandle:
        """Create, or re-attach to, the pull point's durable subscription."""
        ctx = self._ctx
        return ctx.adapter.subscription(
            SubscriptionSpec(
                name=pull_point_id,
                patterns=(inbox_pattern(pull_point_id),),
                limits=ctx.limits(),
                # what the limits drop from the pull point: the default destination
                dead_letters=ctx.dead_letters.native_target(None),
                dead_letter_sink=ctx.dead_letters.sink,
                pulled=ctx.adapter.capabilities.native_pull,
            )
        )

    def live(self, record: PullPoint, handle: SubscriptionHandle) -> LivePullPoint:
        """The live pull point over ``handle``: read through the middleware's pull, or
        through a pull buffer when it has none (``Capabilities.native_pull``), started when
        this instance reads the pull point (in a cluster, the one holding its shard:
        ``core.ownership`` starts and stops it as shards come and go)."""
        ctx = self._ctx
        cap = ctx.settings.limits.get_messages_cap
        if ctx.adapter.capabilities.native_pull:
            return LivePullPoint(record, handle, PullReader(handle, cap))
        buffer = PullBuffer(handle, cap)
        if ctx.delivers(record.id):
            buffer.start()
        return LivePullPoint(record, handle, buffer)

    def create(self, req: CreatePullPointRequest) -> PullPoint:
        """CreatePullPoint (BN §5.2); a known ``name`` re-attaches to its pull point."""
        ctx = self._ctx
        registry = ctx.registry
        owner = ctx.guard.owner()
        if req.name:
            # names are per owner: another identity's pull point of that name is not found
            with registry.lock:
                for state in registry.pull_points.values():
                    if (
                        state.record.name == req.name
                        and state.record.owner == owner
                        and not is_expired(state.record.termination_time, ctx.now())
                    ):
                        return replace(state.record)
            if registry.loader is not None:  # made through another instance a moment ago
                stored = ctx.store.find_pull_point(req.name)
                if stored is not None and stored.owner == owner:
                    registry.loader("pull_point", stored.id)
                    found = registry.pull_points.get(stored.id)
                    if found is not None and not is_expired(
                        found.record.termination_time, ctx.now()
                    ):
                        return replace(found.record)
        ctx.guard.check_quota("pull_points", errors.UnableToCreatePullPoint)
        termination = ctx.termination(
            req.initial_termination_time,
            errors.UnableToCreatePullPoint,
            default=ctx.settings.termination.pull_point_default,
        )
        pp = PullPoint(new_resource_id(), ctx.now(), termination, req.name, owner)
        # its intent first, then the durable subscription, then the record, which replaces
        # the intent (a process killed in between leaves the intent: ``core.orphans``)
        ctx.store.put_intent(pp.id)
        live: LivePullPoint | None = None
        try:
            live = self.live(pp, self.open_handle(pp.id))
            ctx.store.add_pull_point(pp)
        except AdapterError as exc:
            ctx.undo_native(pp.id)
            refusal = ctx.gate.refusal(exc)
            if refusal is not None:
                raise refusal from exc
            raise errors.UnableToCreatePullPoint(f"the middleware refused: {exc}") from exc
        except StoreError as exc:  # nothing may stay behind
            if live is not None:
                live.stop()
            ctx.undo_native(pp.id)
            if isinstance(exc, IntentGone):
                raise errors.UnableToCreatePullPoint(
                    "making the pull point took longer than the orphan grace; retry"
                ) from exc
            raise
        with registry.lock:
            registry.pull_points[pp.id] = live
        registry.update_gauges()
        return replace(pp)

    def get(self, pull_point_id: str) -> PullPoint:
        """The pull point (a copy); ResourceUnknown when unknown or expired."""
        return replace(self._ctx.registry.live_pull_point(pull_point_id).record)

    def renew(self, pull_point_id: str, termination: RequestedTime) -> PullPoint:
        """A new termination time for the pull point (ONVIF's Renew of a pull-point
        subscription renews its pull point with it; WS-N has no Renew of a pull point)."""
        ctx = self._ctx
        state = ctx.registry.live_pull_point(pull_point_id)
        if termination is None:
            raise errors.UnacceptableTerminationTime("Renew needs a TerminationTime")
        new_time = ctx.termination(termination, errors.UnacceptableTerminationTime)
        with ctx.registry.lock:
            state.record.termination_time = new_time
            ctx.store.put_pull_point(state.record)
        return replace(state.record)

    def synchronize(self, state: LiveSubscription) -> int:
        """ONVIF's SetSynchronizationPoint for a subscription feeding a pull point: the
        current message of every topic its topic filter selects goes into the pull point
        again (the MessageContent filter is not applied); how many."""
        ctx = self._ctx
        pull_point_id = state.record.pull_point_id
        if pull_point_id is None:
            raise errors.ResourceUnknown(
                f"subscription {state.record.id!r} does not feed a pull point"
            )
        ctx.registry.live_pull_point(pull_point_id)
        messages = []
        for topic in ctx.topic_set.topics():
            message = self._inbound.current(topic)
            if message is not None and state.filter.matches_topic(message):
                messages.append(replace(message, subscription_reference=None))
        if messages:
            self._inbound.publish(messages, route=pull_point_inbox(pull_point_id))
        return len(messages)

    def get_messages(self, pull_point_id: str, maximum: int | None) -> list[NotificationMessage]:
        """Destructive FIFO read (BN §5.1.2); None/0 = all available up to the cap;
        settled at once (callers that write no answer: ONVIF, in-process)."""
        messages, settlement = self.hand_out(pull_point_id, maximum)
        settlement.settle()
        return messages

    def hand_out(
        self, pull_point_id: str, maximum: int | None
    ) -> tuple[list[NotificationMessage], Settlement]:
        """GetMessages' read, settled by the caller once its answer was written, or given
        back (handed out again, first) when it was not (``core.pull_handout``)."""
        ctx = self._ctx
        state = ctx.registry.live_pull_point(pull_point_id)
        if maximum is not None and maximum < 0:
            raise errors.UnableToGetMessages("MaximumNumber must not be negative")
        # MaximumNumber is an xsd:nonNegativeInteger without bound; the cap bounds what
        # one answer holds (and keeps a huge number out of the adapter's LIMIT)
        cap = ctx.settings.limits.get_messages_cap
        limit = min(maximum, cap) if maximum else cap
        failed: AdapterError | None = None
        received: list[Received] = []
        settlement = Settlement((), nack_all)
        with state.lock:
            # a buffer is read only by the instance holding the pull point's shard
            # (``core.pull_owners``); checked under the lock its hand-over takes
            if isinstance(state.reader, PullBuffer) and not ctx.delivers(pull_point_id):
                raise handed_over(pull_point_id, ctx.settings.middleware.retry_after)
            try:
                # out of later reads until the answer is written (settled) or not (back)
                received, settlement = state.reader.hand_out(limit)
            except AdapterError as exc:
                failed = exc
        if failed is not None:
            # destroyed through another instance a moment ago (its queue gone, not followed
            # here yet): unknown, as on every instance, not a middleware failure
            if ctx.registry.pull_point_gone(pull_point_id):
                raise errors.ResourceUnknown(f"no pull point {pull_point_id!r}") from failed
            refusal = ctx.gate.refusal(failed)
            if refusal is not None:
                raise refusal from failed
            raise errors.UnableToGetMessages(f"the middleware failed: {failed}") from failed
        try:
            out = self._messages(pull_point_id, self._bury_old(pull_point_id, received, settlement))
        except BaseException:
            settlement.give_back()
            raise
        return out, settlement

    def _messages(self, pull_point_id: str, received: list[Received]) -> list[NotificationMessage]:
        """The answer's messages of what was taken."""
        ctx = self._ctx
        out: list[NotificationMessage] = []
        # an undecodable message is settled with the answer (dropped)
        for r in received:
            if isinstance(r, Fed) and isinstance(r.message, NotificationMessage):
                message = r.message  # from a feeding subscription, rendered for it
            else:
                try:
                    message = decode(r)
                except Exception:
                    log.exception("undecodable message in pull point %s dropped", pull_point_id)
                    continue
            dialect = ctx.topic_dialect(message.topic_dialect)
            if dialect != message.topic_dialect:
                message = replace(message, topic_dialect=dialect)
            out.append(message)
        metrics.NOTIFICATIONS_OUT.labels(mode="pull").inc(len(out))
        ctx.observers.delivered(out, pull_point_id)
        return out

    def _bury_old(
        self, pull_point_id: str, received: list[Received], settlement: Settlement
    ) -> list[Received]:
        """What of ``received`` is to be handed out: a message past ``limits.max_age``
        goes to the dead letters (settled however the answer ends); at one whose dead letter
        was not confirmed the answer is cut (see the module docstring)."""
        ctx = self._ctx
        now = ctx.now()
        keep: list[Received] = []
        run: list[Received] = []  # consecutive dead letters of one owner, published together
        owner: LiveSubscription | None = None
        mark = 0  # how many were kept before the run
        for r in [*received, None]:
            if r is not None and not ctx.limit_keeper.expired(r, now):
                keep.append(r)
                continue
            whose = self._owner(r) if r is not None else None
            if run and (r is None or whose is not owner):
                if not self._bury(pull_point_id, owner, run):
                    log.warning(
                        "pull point %s: the answer stops at a message past max_age whose "
                        "dead letter was not confirmed; it and %d after it are handed out "
                        "again, first",
                        pull_point_id,
                        len(received) - received.index(run[0]) - 1,
                    )
                    settlement.cut(run[0])
                    return keep[:mark]
                ctx.limit_keeper.buried(len(run))
                settlement.buried(run)  # settled whether the answer is written or not
                run = []
            if r is not None:
                if not run:
                    owner, mark = whose, len(keep)
                run.append(r)
        return keep

    def _owner(self, received: Received) -> LiveSubscription | None:
        """The subscription whose message ``received`` is (None: the pull point's)."""
        if isinstance(received, Fed):
            return self._ctx.registry.subscriptions.get(received.feed.handle.name)
        return None

    def _bury(
        self, pull_point_id: str, owner: LiveSubscription | None, messages: list[Received]
    ) -> bool:
        """Publish ``messages`` past ``max_age`` to ``owner``'s dead letters (None: the
        pull point's); True once confirmed."""
        dead_letters = self._ctx.dead_letters
        if owner is not None:
            return dead_letters.bury(owner.record, messages, "max-age", 0, "older than max_age")
        return dead_letters.bury_pull_point(
            pull_point_id, messages, "max-age", "older than max_age"
        )

    def purge(self, pull_point_id: str) -> int | None:
        """An operator's purge: drop every message waiting in the pull point (core's pull
        buffer included); returns how many the middleware dropped (None: it cannot tell).

        :raises NotImplementedError: the middleware can neither purge nor count.
        """
        ctx = self._ctx
        state = ctx.registry.live_pull_point(pull_point_id)
        with state.lock:  # no GetMessages meanwhile
            reader = state.reader
            try:
                reader.stop()  # buffered messages go back to the middleware, then go
                dropped = state.handle.purge()
                # what the active feeds hold was on its way into the pull point
                for feed in reader.feeds(active=True):
                    more = feed.purge()
                    dropped = None if dropped is None or more is None else dropped + more
            except AdapterError as exc:
                raise ctx.gate.fault(
                    exc, errors.ResourceUnavailable(f"the middleware failed: {exc}")
                ) from exc
            finally:
                if not isinstance(reader, PullBuffer) or ctx.delivers(pull_point_id):
                    reader.start()  # a buffer only on the pull point's reading instance
        log.warning("pull point %s purged: %s message(s) dropped", pull_point_id, dropped)
        if dropped:
            metrics.NOTIFICATIONS_PURGED.inc(dropped)
        return dropped

    def notify(self, pull_point_id: str, messages: Sequence[InboundNotification]) -> None:
        """Notify sent to a pull point: accumulate as received (PP-05).  ``prepare``'s
        checks (the Notify ACL, the topics against their namespaces' rules), then the
        fan-out bound (the payload, copied once into the pull point).  Its topics are not
        admitted to the broker's topic set: a pull point is a NotificationConsumer, its
        messages go only into its inbox (``Inbound``'s module docstring)."""
        ctx = self._ctx
        ctx.registry.live_pull_point(pull_point_id)
        prepared = self._inbound.prepare(messages, registration_check=False, into_pull_point=True)
        ctx.guard.check_fanout(prepared, pull_point=pull_point_id)
        self._inbound.publish(prepared, route=pull_point_inbox(pull_point_id))

    def destroy(self, pull_point_id: str) -> None:
        """DestroyPullPoint: destroys the subscriptions feeding it too."""
        state = self._ctx.registry.live_pull_point(pull_point_id)
        try:
            self.remove(state)
        except AdapterError as exc:
            raise self._ctx.gate.fault(exc, errors.UnableToDestroyPullPoint(str(exc))) from exc

    def remove(self, state: LivePullPoint) -> None:
        """Remove the pull point everywhere, feeding subscriptions included."""
        ctx = self._ctx
        registry = ctx.registry
        pp_id = state.record.id
        self._unfeed(pp_id)
        try:
            # the record first: an instance whose GetMessages finds the middleware's side
            # gone then finds the record gone too (``Registry.pull_point_gone``); with an
            # intent of its queue, for the sweep if the delete below never happens (a
            # crash) or fails
            removed = ctx.store.delete_pull_point(pp_id, intent=True)
        except BaseException:
            # the record stays: so do the queue and its messages, and the pull point here
            # (a retry of DestroyPullPoint finds it)
            with registry.lock:
                registry.pull_points.setdefault(pp_id, state)
            registry.update_gauges()
            raise
        self._delete_queue(pp_id, removed)

    def expire(self, state: LivePullPoint, now: datetime, epoch: int) -> bool:
        """The cluster leader's expiry at ``now``, under the leadership ``epoch``
        (``Store.expire_pull_point``): the record goes first, only while the store's is
        still expired and the epoch the leadership's; then the feeding subscriptions and
        the queue, as :meth:`remove` does (the other instances forget the feeding
        subscriptions of a pull point whose record is gone, ``core.follow``).  Renewed
        meanwhile (ONVIF's Renew through another instance): kept, False.

        :raises core.store.Deposed: ``epoch`` is not the leadership's any more (nothing
            removed)"""
        ctx = self._ctx
        pp_id = state.record.id
        removed = ctx.store.expire_pull_point(pp_id, now, epoch=epoch)
        if not removed and ctx.store.get_pull_point(pp_id) is not None:
            return False  # renewed through another instance: kept
        self._unfeed(pp_id)
        self._delete_queue(pp_id, removed)
        return True

    def _unfeed(self, pp_id: str) -> None:
        """Forget the pull point here and destroy the subscriptions feeding it."""
        registry = self._ctx.registry
        with registry.lock:
            registry.pull_points.pop(pp_id, None)
            feeding = [
                s for s in registry.subscriptions.values() if s.record.pull_point_id == pp_id
            ]
        for sub in feeding:
            try:
                self._destroy_subscription(sub)
            except AdapterError:
                log.exception("destroying subscription %s failed", sub.record.id)

    def _delete_queue(self, pp_id: str, removed: bool) -> None:
        """After the record's delete: the pull point's durable subscription, and the
        intent its delete wrote (``removed``) once that is gone."""
        ctx = self._ctx
        try:
            ctx.adapter.delete_subscription(pp_id)
            if removed:
                ctx.drop_intent(pp_id)
        finally:
            ctx.registry.update_gauges()
