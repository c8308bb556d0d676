"""Subscriptions feeding one of the broker's pull points, read by the pull point directly.

A subscription whose consumer is one of the broker's pull points has a durable
subscription of its own, and its pull point reads it directly, as a *feed*: through the
middleware's own pull where it has one (``Capabilities.native_pull``: GetMessages takes
from the feed, ``core.pull_reader``), else through core's pull buffer, which consumes the
feed into memory unsettled (``core.pull_buffer``).  This is the one path from a
subscription into a pull point; the one exception is an optimisation: with
``Capabilities.sole_publisher``, a feeding subscription without a MessageContent filter
that was never paused is routed into the pull point's inbox when a notification is
published (``core.direct_routing``) and has no durable subscription at all.

No copy of a fed message is made into the pull point's inbox.  Before, a delivery channel
published a copy of every message into the inbox, waited for the middleware's
confirmation on a delivery thread, and the pull point read the copy back: two trips
through the middleware per message, a consumer per feeding subscription, and a
one-message fan-out to 10,000 pull points bounded by eight threads waiting for
confirmations.  The copy added nothing: the subscription's own durable subscription
already keeps the message until it is handed out.

What a pull point fed this way guarantees, as before:

* GetMessages returns each message as its subscription renders it (SubscriptionReference,
  topic dialect, producer reference) and filters it (topic, MessageContent, expiry,
  ``limits.max_age``: to the dead letters, settled once confirmed; with the buffer the
  feed stalls at it meanwhile, ``core.pull_stall``).
* At least once: a fed message stays in the subscription until GetMessages hands it out
  (buffered: unsettled until then; after a crash it comes again, marked redelivered).
* PauseSubscription keeps what reached the pull point in it: the feed's waiting messages
  (those in the buffer; with native pull, the first ``get_messages_cap`` waiting in the
  subscription) are published into the pull point's inbox and settled, then the feed
  stops; the subscription accumulates until ResumeSubscription starts it again.
  Unsubscribe, expiry and the broker's own ends do the same before the durable
  subscription is deleted (unless the pull point itself is being destroyed).  Should that
  publish fail, the messages stay in the subscription and come after the resume.  An
  answer being sent that took from the feed before, and is then not sent, gives those
  messages the same way (``_suspend``'s ``keep_late``), after what the pause or end
  kept, also when another instance ended the subscription (it deleted the durable
  subscription: this instance's answer holds the only copy); the buffer only at an end:
  at a pause they go back to the subscription, which hands them out again after the
  resume, in order.  With the buffer a pause stops the feed's handle once the answers
  on their way that took its messages were settled (an ack made after the stop is lost:
  the message came again after the resume), on a thread of its own (the Pause is
  answered at once; at most ``pull_fed.SETTLE_WAIT``); a resume meanwhile starts the
  feed once its handle stopped (it gives back what it delivered while paused, which the
  buffer ignored; a stop that fails starts it all the same, a start that fails is
  retried: ``_start``; ``core.pull_feed_stops``).  An end through another instance
  stops the handle so too, once this one follows it (``detach``; native pull's too: the
  middleware may bury what is handed out and unsettled), and an end here meeting it,
  before or during its own stop, waits for that stop before the backlog goes (else a
  message of an answer written meanwhile was handed out and a dead letter too).  In a
  cluster, native pull gives
  what an unsent answer took from a feed to the inbox whatever the feed's state
  (``Feed.keeper``): another instance may drain and delete the subscription's durable
  subscription before this one follows the end, and a requeue in between was lost.
* Limits: the subscription's QueueLimits apply to its durable subscription as before, the
  pull point's to its inbox; the buffer holds at most ``get_messages_cap`` messages per
  feed.
* Order: each subscription's messages in its order; between feeds and the inbox, the
  order they reached the buffer (native pull: in one answer the inbox's first, then the
  feeds' in turn).  The copies a pause kept in the inbox come before the subscription's
  later messages: with the buffer, a resume starts the feed once they are back in the
  buffer (``PullBuffer.expect``; at most ``pull_buffer.KEPT_WAIT`` later).
* A MessageContent filter that exceeds its evaluation budget ends the subscription, as
  on a delivery channel, and every message from that one on goes to its dead letters: the
  feed stops at once (``halt_feed``), so nothing from the breach on is handed out or
  settled, and the subscription's ``give_up`` runs on a thread of its own.  That keeps
  what reached the pull point in it (as a pause does), stops the feed's handle, sends
  the subscription's backlog to its dead letters and ends it (``core.subscriptions``;
  when the middleware refuses the backlog, the subscription stays with its feed stopped
  until a sweep ends it).  With the buffer the breaching message and those behind it
  stay unsettled in the subscription, part of that backlog, and the feed's handle stops
  once the answers on their way that took its messages were settled (an ack made after
  the stop is lost: the message came back into the backlog, handed out and a dead
  letter too; ``PullBuffer.wait_settled``, at most ``pull_fed.SETTLE_WAIT``), waited
  for without the lock that serialises the feeds' changes (the other feeds' go on; a
  resume or an operator's purge of this one meanwhile leaves it stopped, an Unsubscribe
  stops its handle at once).  With native pull a ``take`` has already removed the breaching
  message, and the rest of its batch, from the middleware: those go to the dead
  letters in the answer that met them (``halt_feed``'s ``keep_late``, ``_bury_late``:
  settled once the middleware confirmed them, else given back into the subscription,
  which the end waits for, so they go with the backlog); what an answer took before the breach (an
  earlier answer, or the one that meets the breach) and gives back goes to the dead
  letters too (``halt_feed``'s ``keep_late``: given back into the durable subscription,
  it was lost once the end deleted that; settled when the breach was met, it was lost
  when its answer was not sent), and the end waits for those answers before the
  backlog, as with the buffer (``PullReader.wait_settled``: the embedded and MQTT
  middleware bury what is handed out and unsettled with the backlog, which made such a
  message handed out and a dead letter too), so each such message is handed out or a
  dead letter, once.  That wait, and the feed's suspension before it (which waits for
  an answer reading the feed, maybe publishing dead letters up to the publish timeout),
  hold no lock the other feeds' changes need.
* Each feed's changes (attach, pause, resume, end, purge, the stops above) are
  serialised by a lock of the feed's own (``FeedStops._feed_lock``), held across their
  middleware calls: a pause's, an end's or a purge's publish into the pull point's
  inbox that the middleware is slow to confirm (up to the publish timeout), a handle's
  stop, start or purge, hold that feed's changes only; the other feeds' go on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from functools import partial

from wsnmom.core import metrics
from wsnmom.core.adapter import AdapterError, Received, SubscriptionHandle
from wsnmom.core.channel_signals import EndSubscription, PrepareLater
from wsnmom.core.context import BrokerContext
from wsnmom.core.model import NotificationMessage, Subscription, SubscriptionState
from wsnmom.core.ports import DeliveryFailed
from wsnmom.core.pull_buffer import Fed, PullBuffer
from wsnmom.core.pull_fed import SETTLE_WAIT
from wsnmom.core.pull_feed_stops import FeedStops
from wsnmom.core.pull_reader import PullReader
from wsnmom.core.registry import LiveSubscription

__all__ = ["PullFeeds"]

log = logging.getLogger(__name__)

#: the pull point's message of one of the subscription's messages (None: dropped)
Prepare = Callable[[LiveSubscription, Received], NotificationMessage | None]
#: publishes messages into a pull point's inbox (DeliveryFailed when it cannot)
Forward = Callable[[LiveSubscription, str, Sequence[NotificationMessage]], None]


class _Ending:
    """The ``_stopping`` token of an end's stop (``PullFeeds.stop``), which a purge leaves
    in place."""


class PullFeeds(FeedStops):
    """Attaches, pauses, resumes and ends feeding subscriptions (see the module
    docstring).  Thread-safe; changes of one broker's feeds are serialised."""

    def __init__(self, ctx: BrokerContext, prepare: Prepare, forward: Forward) -> None:
        super().__init__()
        self._ctx = ctx
        self._prepare = prepare
        self._forward = forward
        #: subscriptions whose filter ended them (-> why), until their give-up ran;
        #: under a lock of its own (``_prepared`` runs inside a reader's ``take``, which
        #: ``sync`` and ``detach`` wait for while holding the feed's lock)
        self._ending: dict[str, str] = {}
        self._ending_lock = threading.Lock()

    @staticmethod
    def wanted(sub: Subscription) -> bool:
        """Whether ``sub`` is to be read by its pull point directly (every subscription
        that feeds a pull point and is not routed at publish time)."""
        return sub.pull_point_id is not None

    def attach(
        self,
        state: LiveSubscription,
        handle: SubscriptionHandle,
        give_up: Callable[[EndSubscription], None],
    ) -> None:
        """Make the subscription's durable ``handle`` a feed of its pull point's reader
        (read unless the subscription is paused); ``give_up`` ends the subscription."""
        sub = state.record
        assert sub.pull_point_id is not None
        live = self._ctx.registry.pull_points.get(sub.pull_point_id)
        if live is None:
            raise AdapterError(f"pull point {sub.pull_point_id} is gone")
        reader = live.reader
        prepared = partial(self._prepared, state, give_up)
        active = sub.state is SubscriptionState.ACTIVE
        with self._feed_lock(sub.id):
            state.feed = reader
            if isinstance(reader, PullReader) and self._ctx.shared:
                # another instance may delete the subscription's durable subscription
                # before this one follows the end: what an answer gives back goes into
                # the pull point's inbox, never into a queue about to be deleted
                keeper = partial(self._keep, state, reader)
                reader.add_feed(sub.id, handle, prepared, active=active, keeper=keeper)
            else:
                reader.add_feed(sub.id, handle, prepared, active=active)

    def _prepared(
        self,
        state: LiveSubscription,
        give_up: Callable[[EndSubscription], None],
        received: Received,
    ) -> NotificationMessage | None:
        sub_id = state.record.id
        reader = state.feed
        ending = self._ending.get(sub_id)
        if ending is not None:
            # met after the breach: with native pull the reader buries it (``halt_feed``'s
            # ``keep_late``); the buffer leaves it unsettled, in the backlog
            return None
        try:
            message = self._prepare(state, received)
        except EndSubscription as end:
            with self._ending_lock:
                first = sub_id not in self._ending
                self._ending.setdefault(sub_id, end.reason)
            if not first:
                return None
            log.warning("subscription %s: %s", sub_id, end.reason)
            # nothing from here on is handed out or settled (see the module docstring)
            if isinstance(reader, PullReader):
                # what an answer took before gives back later: its queue may be deleted
                reader.halt_feed(sub_id, partial(self._bury_late, state, end.reason))
            elif reader is not None:
                reader.halt_feed(sub_id)
            threading.Thread(target=self._give_up, args=(sub_id, give_up, end), daemon=True).start()
            return None
        except PrepareLater:
            raise  # its dead letter not confirmed: prepared again later (``core.pull_stall``)
        except Exception:
            log.exception("subscription %s: cannot prepare a message; dropped", state.record.id)
            return None
        if message is None:
            metrics.NOTIFICATIONS_FILTERED.inc()
            return None
        metrics.NOTIFICATIONS_OUT.labels(mode="forward").inc()
        tracing = self._ctx.tracing
        if tracing is not None:
            # the message reached the pull point: a delivery span continues its trace
            with tracing.attempt([message.headers], sub_id, "forward"):
                pass
        return message

    def _bury_late(self, state: LiveSubscription, error: str, fed: list[Fed[object]]) -> None:
        """Native pull, a feed its filter ended (``halt_feed``'s ``keep_late``): what the
        answer that met the breach took from the breach on, and what an answer took
        before and gives back, goes to the dead letters, as the backlog it would have
        been part of (given back into the durable subscription, it was lost once that
        was deleted).  Settled once the middleware confirmed them; else never settled:
        given back into the subscription, they go to the dead letters with its backlog
        (its end, tried again at every sweep while the middleware refuses it)."""
        reason = f"subscription ended: {error}"
        if not self._ctx.dead_letters.bury(state.record, fed, "filter-budget", 0, reason):
            log.warning(
                "subscription %s: %d message(s) whose dead letters were not confirmed go "
                "back to it (they go to its dead letters with its backlog)",
                state.record.id,
                len(fed),
            )
            PullReader.give_back(fed)
            return
        for item in fed:
            try:
                item.ack()
            except Exception:  # the handle may be gone: so is the message
                log.debug("settling a fed message failed", exc_info=True)

    def _give_up(
        self, sub_id: str, give_up: Callable[[EndSubscription], None], end: EndSubscription
    ) -> None:
        try:
            give_up(end)
        except Exception:
            log.exception("subscription %s: ending it failed", sub_id)
        finally:
            with self._ending_lock:
                self._ending.pop(sub_id, None)

    def sync(self, state: LiveSubscription, *, here: bool = True) -> None:
        """Bring the feed in line with the subscription's state after a pause or resume:
        read when active; when paused, what reached the pull point kept in it and the
        feed stopped.  ``here`` False: another instance made the change (and kept what
        reached the pull point from the middleware's side)."""
        name = state.record.id
        with self._feed_lock(name):
            reader, handle = state.feed, state.handle
            if reader is None or handle is None:
                return
            if state.record.state is SubscriptionState.ACTIVE:
                if name not in self._stopping:  # else started once stopped
                    reader.resume_feed(name)
                return
            drain = here and self._kept_here(state)
            self._keep(state, reader, self._suspend(state, reader, drain=drain))
            if name in self._stopping:
                return
            if not (isinstance(reader, PullBuffer) and reader.handed_out(name)):
                handle.stop()
                return
            # an ack made after the stop would be lost (the message came again after the
            # resume): stopped once the answers on their way settled, the pause answered
            # meanwhile
            token = self._stopping[name] = object()
        self._spawn(self._stop_settled, (state, reader, handle, token), f"feed-pause-{name[:8]}")

    def stop(self, state: LiveSubscription) -> bool:
        """Before the subscription's backlog goes to its dead letters: what reached the
        pull point stays in it (as a pause keeps it), the feed and its handle stop (what
        the handle held goes back to the middleware, into that backlog), once the answers
        on their way that took the feed's messages were settled or given back (else those
        came back into the backlog with the buffer, and with native pull the middleware
        may bury what is handed out and unsettled: handed out and dead letters too).
        False when it has no feed here (when its end through another instance was
        followed, and that end's stop of its handle waits for answers on their way: once
        that stop was made)."""
        name = state.record.id
        with self._feed_lock(name):
            reader, handle = state.feed, state.handle
            if reader is None or handle is None:
                pending = self._detached_stop(name)
            else:
                # a pause's stop waiting for the same answers leaves the stop to this
                # one; a resume or a purge meanwhile leaves the feed stopped
                token = self._stopping[name] = _Ending()
                # waited for below even if a detach removes the feed meanwhile
                held = reader.unsettled(name)
        if reader is None or handle is None:
            if pending is not None:
                self._wait_detached(name, pending)
            return False
        # without the lock, the other feeds' changes going on meanwhile: with native pull
        # the suspension waits for an answer reading the feed, which may be publishing
        # its dead letters (up to the publish timeout); a pause or a purge meanwhile
        # keeps what waits itself, an Unsubscribe removes the feed (nothing left here)
        drain = self._kept_here(state)
        self._keep(state, reader, self._suspend(state, reader, drain=drain))
        if not (held is None or held.wait(SETTLE_WAIT)):
            log.warning(
                "subscription %s: an answer holding its messages is still on its way; "
                "its backlog goes to its dead letters without waiting longer",
                name,
            )
        with self._feed_lock(name):
            if self._stopping.get(name) is token:
                del self._stopping[name]
                handle.stop()
                return True
            # detached or purged meanwhile: a detach through another instance stops the
            # handle once the answers settled, which the backlog waits for too
            pending = self._detached_stop(name)
        if pending is not None:
            self._wait_detached(name, pending)
        return True

    def detach(
        self,
        state: LiveSubscription,
        *,
        here: bool = True,
        then: Callable[[], None] | None = None,
    ) -> None:
        """The subscription ends: what reached the pull point stays in it (unless the pull
        point is gone), the feed is forgotten, ``then`` runs once its handle stopped; the
        caller deletes the durable subscription.  ``here`` False: it ended through
        another instance, which deletes the durable subscription, maybe after this stop:
        the feed's handle stops once the answers on their way that took its
        messages settled (an ack made after the stop is lost: the message went back into
        the subscription, for the ending instance's drain or dead letters), on a thread
        of its own (the caller, the follow thread or a request's, goes on; at most
        ``pull_fed.SETTLE_WAIT``).  A second detach meanwhile (two threads following
        the same end) runs its ``then`` after that stop too, not at once (the adapter
        forgetting the subscription stops its consuming before the answers' acks)."""
        name = state.record.id
        later = False
        try:
            with self._feed_lock(name):
                reader, handle = state.feed, state.handle
                if reader is None:
                    detached = self._detaching.get(name)
                    if detached is not None and then is not None:
                        # a detach before (another thread following the same end)
                        # stops the handle later: ``then`` runs after that stop
                        detached.thens.append(then)
                        later = True
                    return
                state.feed = None
                self._stopping.pop(name, None)  # its handle stops here
                drain = here and self._kept_here(state)
                held = reader.unsettled(name)
                # removed: nothing more of the feed is handed out
                self._keep(state, reader, self._suspend(state, reader, drain=drain, remove=True))
                if handle is None:
                    return
                if here or held is None or not held.pending:
                    handle.stop()
                    return
                self._stops_later(name, held, then)
            self._spawn(self._stop_detached, (name, handle, held), f"feed-end-{name[:8]}")
            later = True
        finally:
            if not later and then is not None:
                then()

    def purge(self, state: LiveSubscription) -> int | None:
        """An operator's purge of a feeding subscription: what reached the pull point
        stays there, what waits in the subscription is dropped."""
        with self._feed_lock(state.record.id):
            reader, handle = state.feed, state.handle
            if reader is None or handle is None:
                return 0
            # a pause's stop waiting for answers is taken over (its handle stops here);
            # an end's is not: the feed of a subscription being ended is not read again
            # (its prepare drops what it reads, which the buffer would settle: lost)
            ending = isinstance(self._stopping.get(state.record.id), _Ending)
            if not ending:
                self._stopping.pop(state.record.id, None)
            self._keep(state, reader, reader.suspend_feed(state.record.id))
            handle.stop()
            try:
                return handle.purge()
            finally:
                if not ending and state.record.state is SubscriptionState.ACTIVE:
                    reader.resume_feed(state.record.id)

    def _suspend(
        self,
        state: LiveSubscription,
        reader: PullBuffer | PullReader,
        *,
        drain: bool,
        remove: bool = False,
    ) -> list[Fed[object]]:
        """Stop (``remove``: forget) the feed; what reached the pull point, to keep.  What
        an answer handed out before gives back later is kept too: when the feed is
        removed, whoever ended the subscription (this instance's answer holds the only
        copy once the durable subscription is deleted: given back into it, it would be
        lost); at a pause only with native pull draining here (with the buffer, stopping
        the feed's handle gave it back to the subscription, which hands it out again
        after the resume; a pause another instance made leaves it to the subscription)."""
        name = state.record.id
        keep = remove or (drain and not isinstance(reader, PullBuffer))
        late = partial(self._keep, state, reader) if keep else None
        if remove:
            return reader.remove_feed(name, drain=drain, keep_late=late)
        return reader.suspend_feed(name, drain=drain, keep_late=late)

    def _kept_here(self, state: LiveSubscription) -> bool:
        """Whether the subscription's pull point is still there to keep its messages."""
        pull_point_id = state.record.pull_point_id
        return pull_point_id is not None and pull_point_id in self._ctx.registry.pull_points

    def _keep(
        self, state: LiveSubscription, reader: PullBuffer | PullReader, waiting: list[Fed[object]]
    ) -> None:
        """Publish the waiting messages into the pull point's inbox and settle them (in
        order); when the pull point is gone or the publish fails they stay unsettled."""
        if not waiting:
            return
        sub = state.record
        pull_point_id = sub.pull_point_id
        if pull_point_id is None or pull_point_id not in self._ctx.registry.pull_points:
            reader.give_back(waiting)
            return
        messages = [w.message for w in waiting if isinstance(w.message, NotificationMessage)]
        if messages:
            # named before they are published: the buffer may receive them at once
            ids = [m.message_id for m in messages]
            if isinstance(reader, PullBuffer):
                reader.expect(sub.id, ids)
            try:
                self._forward(state, pull_point_id, messages)
            except DeliveryFailed as exc:
                if isinstance(reader, PullBuffer):
                    reader.unexpect(sub.id, ids)
                log.warning(
                    "subscription %s: %d message(s) waiting in pull point %s go back to "
                    "the subscription: %s",
                    sub.id,
                    len(messages),
                    pull_point_id,
                    exc.reason,
                )
                reader.give_back(waiting)
                return
        for item in waiting:
            try:
                item.ack()
            except Exception:  # the handle may be gone; the copies are in the inbox
                log.debug("settling a fed message failed", exc_info=True)
