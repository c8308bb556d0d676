"""The handle core holds on one RabbitMQ subscription: a durable queue on one consuming
connection, consumed (``start``), pulled, taken, purged, counted and deleted through the
adapter's :class:`~.consumers.Consumers`.  Peeking is refused (:data:`PEEK_REFUSAL`).
"""

from __future__ import annotations

import functools
import logging
import queue
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime

from wsnmom.core.adapter import (
    HEADER_DROPPED_AT,
    HEADER_DROPPED_ATTEMPTS,
    HEADER_DROPPED_FROM,
    HEADER_DROPPED_REASON,
    HEADER_MESSAGE_ID,
    HEADER_TOPIC_NAMESPACE,
    HEADER_TOPIC_PATH,
    AdapterError,
    AdapterUnavailable,
    MiddlewareBusy,
    OutboundMessage,
    Received,
    StoredMessage,
    SubscriptionHandle,
    SubscriptionSpec,
)
from wsnmom.topic_mapping.model import Topic

from ._link import Channel, Link
from .consumers import Consumers
from .declarations import Declared
from .names import Binding

log = logging.getLogger("wsnmom.adapters.rabbitmq")

#: messages dead-lettered per confirmed publish (and the consumer's prefetch meanwhile)
BURIAL_BATCH = 500
#: seconds without a message after which a dead-lettering consumer is stopped and the
#: queue's depth read (with no consumer on it, the depth counts every message left)
QUIET = 0.3

#: why a RabbitMQ subscription cannot be peeked (``Capabilities.peek`` False)
PEEK_REFUSAL = (
    "RabbitMQ hands a queued message out only by delivering it: a basic.get followed by "
    "a requeueing nack (what the management UI's 'Get messages' does too) marks it "
    "redelivered, hides it from the subscription's consumer meanwhile and, on a quorum "
    "queue, counts a delivery against its delivery limit, so the waiting messages cannot "
    "be read without consuming them"
)


class RabbitMQSubscription(SubscriptionHandle):
    """Handle on one subscription queue.  Methods are thread-safe."""

    def __init__(
        self,
        consumers: Consumers,
        spec_: SubscriptionSpec,
        link: Link,
        queue: str,
        prefetch: int,
        forget: Callable[[RabbitMQSubscription], None],
        publish: Callable[[Sequence[OutboundMessage], float], object] | None = None,
    ) -> None:
        self.name = spec_.name
        #: the consuming connection this subscription's channels live on
        self.link = link
        self.spec = spec_
        self.queue = queue
        self._consumers = consumers
        self._forget = forget
        #: the adapter's confirmed ``publish_many`` (``delete_into_dead_letters``)
        self._publish = publish
        #: bindings in place on the broker (as far as this process knows)
        self.bound: set[Binding] = set()
        self.on_message: Callable[[Received], None] | None = None
        self.prefetch = prefetch
        self.consuming = False
        self.deleted = False
        self.consumer: Channel | None = None
        self.puller: Channel | None = None
        #: the queue got its primer from this process (``Declarations.prime``)
        self.primed = False
        #: this process declared the queue and its bindings (``Declarations.deferred``)
        self.declared = False
        #: what this process last declared for it (``Declarations.in_place``)
        self.declared_as: Declared | None = None

    def start(self, on_message: Callable[[Received], None], prefetch: int = 64) -> None:
        c = self._consumers
        self.on_message = on_message
        self.prefetch = max(1, prefetch)
        self.consuming = True
        try:
            c.run(c.start(self), link=self.link)
        except BaseException:
            # not started (core tries again later): a reconnect must not start it either,
            # or its deliveries would reach a stopped channel
            self.consuming = False
            raise

    def stop(self) -> None:
        self.consuming = False
        c = self._consumers
        c.run(c.stop(self), link=self.link)

    def pull(self, max_messages: int, timeout: float = 0.0) -> list[Received]:
        if max_messages <= 0:
            return []
        c = self._consumers
        if timeout <= 0:
            direct = c.pull_direct(self, max_messages)
            if direct is not None:
                return direct
        got: list[Received] = c.run(c.pull(self, max_messages, timeout), timeout, self.link)
        return got

    def take(self, max_messages: int) -> list[Received]:
        """``basic.get`` with auto-ack on one of the connection's shared take channels:
        RabbitMQ removes each message as it delivers it (no ack frame, no unacked state);
        falls back to pull-and-ack when those cannot be opened."""
        direct = self._shared_get(max_messages, no_ack=True)
        return super().take(max_messages) if direct is None else direct

    def hand_out(self, max_messages: int) -> list[Received]:
        """GetMessages: ``basic.get`` with manual acknowledgement on one of the
        connection's shared take channels; each message stays unacknowledged on that
        channel (out of later gets) until core acks or requeues it, and RabbitMQ requeues
        it if the channel or the connection goes first.  Falls back to ``pull``."""
        direct = self._shared_get(max_messages, no_ack=False)
        return super().hand_out(max_messages) if direct is None else direct

    def _shared_get(self, max_messages: int, *, no_ack: bool) -> list[Received] | None:
        """Gets on a shared take channel (opened first if none is); None: none opens."""
        if max_messages <= 0:
            return []
        c = self._consumers
        direct = c.pull_direct(self, max_messages, no_ack=no_ack, shared=True)
        if direct is None:
            c.run(c.open_takers(self.link), link=self.link)
            direct = c.pull_direct(self, max_messages, no_ack=no_ack, shared=True)
        return direct

    def peek(self, max_messages: int) -> list[StoredMessage]:
        """Not possible: see :data:`PEEK_REFUSAL`."""
        raise NotImplementedError(PEEK_REFUSAL)

    def purge(self) -> int | None:
        """``queue.purge``: RabbitMQ drops every ready message (unacknowledged ones
        stay) and says how many."""
        c = self._consumers
        purged: int = c.run(c.purge(self.queue, self.link), link=self.link)
        return purged

    def depth(self) -> int | None:
        c = self._consumers
        try:
            depth: int = c.run(c.depth(self.queue, self.link), link=self.link)
            return depth
        except (AdapterUnavailable, MiddlewareBusy):
            return None

    def delete(self) -> None:
        c = self._consumers
        self.consuming = False
        self.deleted = True
        self._forget(self)
        c.run(c.delete_queue(self.queue, self), link=self.link)

    def forget(self) -> bool:
        """Another instance destroyed it (``Adapter.forget_subscription``): out of the
        pool, and the queue deleted when this process declared it and no message waits
        in it.  This process may have declared it after the other instance deleted it
        (a first consume here while a Subscribe refused there was undone), and nothing
        else would delete it then (deleting a queue that is gone is no error).  A queue
        that holds messages is left to the other instance, unbound: an end that feeds
        a pull point drains them into it before it deletes the queue (deleting it here
        first would delete them; its removal intent fences a crash in between), and
        nothing published after the end goes into it.  True when it was left: core
        writes an intent for it, and the orphan sweep deletes it after the grace if the
        other instance has not (a queue declared here again after the other's delete)."""
        self.consuming = False
        self.deleted = True
        self._forget(self)
        if not self.declared:
            return False
        c = self._consumers
        if c.run(c.delete_unless_waiting(self), link=self.link):
            return False
        log.info(
            "queue %s holds messages: left unbound to the instance that ended it, and to "
            "the orphan sweep after the grace",
            self.queue,
        )
        return True

    def delete_into_dead_letters(
        self, reason: str, context: Mapping[str, str], timeout: float = 30.0
    ) -> int:
        """Stop its consumer (what it held is requeued), consume its messages on a
        consumer of its own (a quorum queue with single-active-consumer, cluster mode,
        refuses ``basic.get``), publish them in batches to the dead-letter topic with
        publisher confirms and acknowledge each batch: first while the queue is still
        bound (up to the depth it had), then unbound (it receives nothing more) until,
        with no consumer on it, it is found empty; then delete it.  A publish not
        confirmed within ``timeout`` gives its batch back (the consumer's channel is
        closed) and raises: the subscription goes on, without what went before; refused
        while still bound, as a lasting refusal is at its first batch, nothing published
        meanwhile misses the queue, and once unbound it is bound again."""
        topic, publish = self.spec.dead_letters, self._publish
        if topic is None or publish is None:
            raise NotImplementedError("this subscription has no dead-letter topic")
        c = self._consumers
        bury = functools.partial(self._dead_letter_round, topic, publish, reason, context, timeout)
        self.stop()
        waiting = self.depth() or 0
        sent = bury(waiting) if waiting else 0
        c.run(c.unbind(self), link=self.link)
        try:
            while True:
                left = self.depth()  # no consumer now: every message left is counted
                if left is None:
                    raise AdapterUnavailable(f"the depth of queue {self.queue} is unknown")
                if left == 0:
                    break
                sent += bury(None)
        except AdapterError:
            c.run(c.declarations.declare_for(self), link=self.link)  # bound again
            raise
        self.delete()
        return sent

    def _dead_letter_round(
        self,
        topic: Topic,
        publish: Callable[[Sequence[OutboundMessage], float], object],
        reason: str,
        context: Mapping[str, str],
        timeout: float,
        limit: int | None,
    ) -> int:
        """Consume the queue until ``limit`` messages (None: any number) were sent, or it
        hands out nothing for :data:`QUIET` seconds, each batch published as dead letters
        and acknowledged; then stop consuming (what it handed out and was not sent goes
        back to the queue in its place).  How many were sent."""
        handed: queue.SimpleQueue[Received] = queue.SimpleQueue()
        sent = 0
        self.start(handed.put, prefetch=BURIAL_BATCH)
        try:
            while limit is None or sent < limit:
                room = BURIAL_BATCH if limit is None else min(BURIAL_BATCH, limit - sent)
                batch: list[Received] = []
                try:
                    batch.append(handed.get(timeout=QUIET))
                    while len(batch) < room:
                        batch.append(handed.get_nowait())
                except queue.Empty:
                    if not batch:
                        break
                # ``timeout`` for each batch: a long queue takes as long as it needs
                publish([_dropped(r, topic, self.name, reason, context) for r in batch], timeout)
                for r in batch:
                    r.ack()
                sent += len(batch)
        finally:
            self.stop()
        return sent

    def __repr__(self) -> str:
        return f"<RabbitMQSubscription {self.name} queue={self.queue}>"


def _dropped(
    r: Received, topic: Topic, name: str, reason: str, context: Mapping[str, str]
) -> OutboundMessage:
    """``r`` as the dead letter of subscription ``name`` on ``topic``."""
    headers = {k: v for k, v in r.headers.items() if isinstance(v, str)}
    if r.topic is not None:
        headers.setdefault(HEADER_TOPIC_NAMESPACE, r.topic.namespace)
        headers.setdefault(HEADER_TOPIC_PATH, "/".join(r.topic.path))
    headers.update(context)
    headers[HEADER_DROPPED_REASON] = reason
    headers[HEADER_DROPPED_FROM] = name
    headers[HEADER_DROPPED_AT] = datetime.now(UTC).isoformat()
    if r.redelivered:
        headers[HEADER_DROPPED_ATTEMPTS] = "1"  # handed out before, at least once
    return OutboundMessage(
        topic=topic,
        body=bytes(r.body),
        message_id=headers.get(HEADER_MESSAGE_ID) or uuid.uuid4().hex,
        headers=headers,
        content_type=r.content_type or "application/xml",
    )
