"""Dead letters: the messages the gateway gives up on, kept in the middleware with why.

A message the gateway will not deliver (its retries ran out, its subscription's filter
exceeded its evaluation budget, it is older than ``limits.max_age``) is published, before
it is settled, on a *dead-letter destination*: the internal topic
``urn:wsnmom:internal:dead-letters`` / ``<name>`` (``destination_topic``), through the
adapter's ordinary ``publish_many``.  The body, content type and wsnmom headers are the
original ones (so ``core.codec.decode`` gives back the original notification, topic
included); the context travels as more headers (``wsnmom-dl-*``, ``CONTEXT_HEADERS``).
Only once the middleware confirmed the dead letter is the original acknowledged; when the
publish fails the original stays unsettled and comes back (``DeadLetters.send`` is False).

Each destination is read through one durable subscription of the gateway's own,
``wsnmom-dead-letters-<name>`` (a queue on RabbitMQ and embedded, a cursor over the topic
on Kafka and the file log, a session queue on MQTT), created before the first dead letter
is published to it.  ``DeadLetterBox`` consumes it in push mode and *holds* what it
received unsettled (at most ``dead_letters.list_max``): listing and showing read what is
held, replay and purge settle.  What is held and not settled goes back to the middleware
when the gateway stops, so nothing is lost; where the adapter needs acknowledgements in
order, a settled dead letter is acknowledged once those before it are.

What the adapter drops for the queue limits (the middleware's own ``max_age`` and
``max_messages`` where it enforces them, and what ``SubscriptionHandle.discard`` drops
where core enforces them) reaches the same destination where the adapter can
send it there (``Capabilities.native_dead_letters``: RabbitMQ's dead-letter exchange, the
embedded and MQTT queues in the transaction that drops it, a log before the cursor
commits past it): core names the
destination's topic in the subscription's ``SubscriptionSpec.dead_letters``
(:meth:`DeadLetters.native_target`), and the adapter marks what arrives there with
``HEADER_DROPPED_REASON`` / ``HEADER_DROPPED_FROM`` / ``HEADER_DROPPED_AT``; such a dead
letter gets its reason (``max-age``, ``overflow``), subscription and time from those (the
time from when the box received it where the adapter gave none), its attempts from
``HEADER_DROPPED_ATTEMPTS`` (0 without), and no consumer.

The metric ``wsnmom_dead_letters_total{reason, source}`` counts each dead letter once,
where that is exact: one the gateway publishes (``source="gateway"``) when the middleware
confirmed its publish (a publish is never repeated, restarts or not); one an adapter
dropped (``source="middleware"``, published by no gateway) when a box first reads it back
and the middleware does not flag it ``redelivered`` (a dead letter held when a gateway
stops comes back flagged, so the next box does not count it again where the adapter's
flag outlives the process: embedded, MQTT and RabbitMQ, not the logs).
``wsnmom_dead_letters_held`` is how many a box holds now.

The name of a destination: :func:`~wsnmom.core.dead_letter_records.check_destination` (one
rule, used for the setting and the Subscribe policy element ``wsnmom:DeadLetters``).

Its parts: what a dead letter is, the names, headers and records
(``core.dead_letter_records``), the box that holds one destination's
(``core.dead_letter_box``), and here :class:`DeadLetters`, which publishes them and opens
the boxes; what operators do with them: ``core.dead_letter_admin``.
"""

from __future__ import annotations

import copy
import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime

from wsnmom.core import metrics
from wsnmom.core.adapter import (
    HEADER_DROPPED_REASON,
    HEADER_MESSAGE_ID,
    HEADER_TOPIC_NAMESPACE,
    HEADER_TOPIC_PATH,
    Adapter,
    AdapterError,
    OutboundMessage,
    QueueLimits,
    Received,
    SubscriptionSpec,
)
from wsnmom.core.dead_letter_box import DeadLetterBox
from wsnmom.core.dead_letter_records import (
    CONTEXT_HEADERS,
    H_ATTEMPTS,
    H_CONSUMER,
    H_COUNTED,
    H_ERROR,
    H_ID,
    H_REASON,
    H_SUBSCRIPTION,
    H_TIME,
    DeadLetterContext,
    box_name,
    check_destination,
    destination_topic,
)
from wsnmom.core.model import Subscription
from wsnmom.core.redaction import redact_url
from wsnmom.topic_mapping.model import PathPattern, Topic

__all__ = ["DeadLetters"]

log = logging.getLogger(__name__)

#: the longest last error kept with a dead letter (headers stay small)
_ERROR_CHARS = 1000


class DeadLetters:
    """Publishes dead letters and opens the boxes that read them back."""

    def __init__(
        self,
        adapter: Adapter,
        *,
        enabled: bool,
        default: str,
        list_max: int,
        clock: Callable[[], datetime],
        publish_timeout: float,
    ) -> None:
        self._adapter = adapter
        self.enabled = enabled
        self.default = check_destination(default)
        self._list_max = list_max
        self._clock = clock
        self._timeout = publish_timeout
        self._lock = threading.Lock()
        self._boxes: dict[str, DeadLetterBox] = {}

    def box(self, name: str) -> DeadLetterBox:
        """The box of destination ``name``: its durable subscription is created (or
        re-attached) and consumed the first time it is asked for."""
        with self._lock:
            box = self._boxes.get(name)
            if box is None:
                topic = destination_topic(name)
                handle = self._adapter.subscription(
                    SubscriptionSpec(
                        name=box_name(name),
                        patterns=(PathPattern(topic.namespace, topic.path),),
                        limits=QueueLimits(),
                    )
                )
                box = DeadLetterBox(
                    name,
                    handle,
                    in_order=self._adapter.capabilities.settles_in_order,
                    clock=self._clock,
                )
                box.start(self._list_max)
                self._boxes[name] = box
            return box

    def native_target(self, sub: Subscription | None) -> Topic | None:
        """The topic the adapter is to send what it drops for the limits from ``sub``'s
        durable subscription to (``SubscriptionSpec.dead_letters``), its box opened first;
        ``sub`` None: a pull point's, the gateway's default destination.  None when
        disabled or the adapter cannot (``Capabilities.native_dead_letters``).

        A box that cannot be opened raises the ``AdapterError`` (the same class, its text
        naming the destination), so the Subscribe or CreatePullPoint is refused (a restored
        subscription stays unattached, reported by ``ready``): the topic without its box
        would lose what the adapter drops where it routes dead letters to the
        subscriptions existing then (embedded, MQTT), and None would make the adapter drop
        them without dead letters for the subscription's whole life."""
        if not self.enabled or not self._adapter.capabilities.native_dead_letters:
            return None
        name = (sub.dead_letters if sub is not None else None) or self.default
        try:
            self.box(name)
        except AdapterError as exc:
            log.warning("dead letters %s: cannot open its box: %s", name, exc)
            text = f"dead letters {name}: cannot open its box: {exc}"
            try:
                named = copy.copy(exc)  # its class and attributes (``retry_after``) kept
            except TypeError:  # an error class that cannot be copied from its args
                named = AdapterError(text)
            named.args = (text,)
            raise named from exc
        return destination_topic(name)

    def sink(self, messages: Sequence[OutboundMessage]) -> None:
        """Publish what an adapter dropped to a dead-letter topic, marked
        :data:`H_COUNTED`, and count each one (``source="middleware"``) once the middleware
        confirmed it (``SubscriptionSpec.dead_letter_sink``; raises ``AdapterError`` when
        it did not).  Counted at the publish, a log's drop is counted once however often
        boxes read it back (a log flags a redelivery within one process only)."""
        marked = [
            OutboundMessage(
                topic=m.topic,
                body=m.body,
                message_id=m.message_id,
                headers={**m.headers, H_COUNTED: "1"},
                content_type=m.content_type,
            )
            for m in messages
        ]
        self._adapter.publish_many(marked, timeout=self._timeout)
        for m in messages:
            reason = m.headers.get(HEADER_DROPPED_REASON) or "unknown"
            metrics.DEAD_LETTERS.labels(reason=reason, source="middleware").inc()

    def ending_context(self, sub: Subscription, error: str) -> dict[str, str] | None:
        """The context headers an adapter adds to a subscription's backlog it sends to
        the dead letters as it deletes the subscription
        (``SubscriptionHandle.delete_into_dead_letters``): the consumer and ``error`` (the
        subscription, reason and time come from the adapter's ``HEADER_DROPPED_*``).
        None when the adapter sends nothing there (disabled, or no
        ``Capabilities.native_dead_letters``)."""
        if not self.enabled or not self._adapter.capabilities.native_dead_letters:
            return None
        return {H_CONSUMER: redact_url(sub.consumer.address), H_ERROR: error[:_ERROR_CHARS]}

    def boxes(self) -> list[DeadLetterBox]:
        """The default destination's box and every other one opened since start."""
        self.box(self.default)
        with self._lock:
            return list(self._boxes.values())

    def close(self) -> None:
        """Stop every box (what is held goes back to the middleware)."""
        with self._lock:
            boxes = list(self._boxes.values())
            self._boxes.clear()
        for box in boxes:
            try:
                box.stop()
            except Exception:
                log.debug("stopping dead letters %s failed", box.name, exc_info=True)

    def bury(
        self,
        sub: Subscription,
        messages: Sequence[Received],
        reason: str,
        attempts: int,
        error: str | None,
    ) -> bool:
        """``send`` ``messages`` given up on by subscription ``sub`` to its destination."""
        return self.send(
            messages,
            DeadLetterContext(
                subscription_id=sub.id,
                consumer=redact_url(sub.consumer.address),
                reason=reason,
                attempts=attempts,
                last_error=error,
                destination=sub.dead_letters or self.default,
            ),
        )

    def bury_pull_point(
        self, pull_point_id: str, messages: Sequence[Received], reason: str, error: str | None
    ) -> bool:
        """``send`` ``messages`` given up on from a pull point's own inbox to the default
        destination, naming the pull point as their subscription and no consumer (as
        what an adapter drops from a pull point: replayed, they go back into it)."""
        return self.send(
            messages,
            DeadLetterContext(
                subscription_id=pull_point_id,
                consumer="",
                reason=reason,
                attempts=0,
                last_error=error,
                destination=self.default,
            ),
        )

    def send(self, messages: Sequence[Received], context: DeadLetterContext) -> bool:
        """Publish ``messages`` as dead letters with ``context``; True once the middleware
        confirmed every one (the caller may then settle them), False when it did not
        (they are to stay unsettled).  Disabled: True at once (given up as before)."""
        if not messages or not self.enabled:
            return True
        error = (context.last_error or "")[:_ERROR_CHARS]
        when = self._clock().isoformat()
        topic = destination_topic(context.destination)
        out: list[OutboundMessage] = []
        for received in messages:
            headers = {k: v for k, v in received.headers.items() if k not in CONTEXT_HEADERS}
            if HEADER_TOPIC_PATH not in headers and received.topic is not None:
                headers[HEADER_TOPIC_NAMESPACE] = received.topic.namespace
                headers[HEADER_TOPIC_PATH] = "/".join(received.topic.path)
            letter_id = uuid.uuid4().hex
            headers.update(
                {
                    H_ID: letter_id,
                    H_SUBSCRIPTION: context.subscription_id,
                    H_CONSUMER: context.consumer,
                    H_REASON: context.reason,
                    H_ATTEMPTS: str(context.attempts),
                    H_TIME: when,
                }
            )
            if error:
                headers[H_ERROR] = error
            out.append(
                OutboundMessage(
                    topic=topic,
                    body=bytes(received.body),
                    message_id=headers.get(HEADER_MESSAGE_ID) or letter_id,
                    headers=headers,
                    content_type=received.content_type or "application/xml",
                )
            )
        try:
            self.box(context.destination)  # exists before the first dead letter reaches it
            self._adapter.publish_many(out, timeout=self._timeout)
        except AdapterError as exc:
            log.error(
                "subscription %s: %d dead letter(s) (%s) not confirmed, kept unsettled: %s",
                context.subscription_id,
                len(out),
                context.reason,
                exc,
            )
            return False
        metrics.DEAD_LETTERS.labels(reason=context.reason, source="gateway").inc(len(out))
        log.warning(
            "subscription %s: %d message(s) to dead letters %s (%s)",
            context.subscription_id,
            len(out),
            context.destination,
            context.reason,
        )
        return True
