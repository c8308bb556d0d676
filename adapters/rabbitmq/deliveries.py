"""Deliveries: what a message taken from a subscription queue becomes for core.

:meth:`Deliveries.delivery` turns an AMQP delivery (``basic.deliver`` or ``basic.get-ok``)
into a :class:`Delivery` (core's ``Received``) with its topic and text headers; it settles
queue primers and messages without a representable topic itself, and names why and from
which subscription RabbitMQ dead-lettered a message (native dead letters).
:meth:`Deliveries.dispatch` hands a consumer's delivery to the subscription's callback.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from wsnmom.core.adapter import (
    DROPPED_MAX_AGE,
    DROPPED_OVERFLOW,
    HEADER_DROPPED_AT,
    HEADER_DROPPED_FROM,
    HEADER_DROPPED_REASON,
    Received,
)
from wsnmom.topic_mapping.errors import NameNotRepresentable
from wsnmom.topic_mapping.model import Topic

from ._link import Channel, Link
from .declarations import PRIMER_HEADER
from .names import RabbitMQNames, headers_of

if TYPE_CHECKING:
    from .subscription import RabbitMQSubscription

log = logging.getLogger("wsnmom.adapters.rabbitmq")

#: what RabbitMQ adds to a message it dead-letters: why, and the queue it left
_DEATH_REASON = "x-first-death-reason"
_DEATH_QUEUE = "x-first-death-queue"
_DEATH_REASONS = {"expired": DROPPED_MAX_AGE, "maxlen": DROPPED_OVERFLOW}


class Delivery(Received):
    """A message taken from a subscription queue; settles on the channel it came from."""

    def __init__(
        self,
        link: Link,
        channel: Channel,
        delivery_tag: int,
        topic: Topic,
        body: bytes,
        headers: Mapping[str, str],
        content_type: str,
        redelivered: bool,
        settled: bool = False,
    ) -> None:
        self.topic = topic
        self.body = body
        self.headers = headers
        self.content_type = content_type
        self.redelivered = redelivered
        self._link = link
        self._channel = channel
        self._tag = delivery_tag
        #: settled at most once: the first ack()/nack() takes the only token (none when
        #: RabbitMQ removed the message on delivery)
        self._token = [] if settled else [True]

    def _settle(self, ack: bool, requeue: bool) -> None:
        try:
            self._token.pop()  # atomic: a second settle finds the list empty
        except IndexError:
            return
        self._link.settle(self._channel, self._tag, ack, requeue)

    def ack(self) -> None:
        self._settle(True, False)

    def nack(self, requeue: bool = True) -> None:
        self._settle(False, requeue)

    def __repr__(self) -> str:
        return f"<RabbitMQ delivery {self.topic} tag={self._tag}>"


class Deliveries:
    """Turns deliveries from subscription queues into :class:`Delivery` objects."""

    def __init__(self, names: RabbitMQNames, queue_prefix: str) -> None:
        self.names = names
        self.queue_prefix = queue_prefix

    def dispatch(
        self,
        sub: RabbitMQSubscription,
        ch: Channel,
        method: Any,
        properties: Any,
        body: bytes,
    ) -> None:
        """Hand a consumer's delivery to ``sub``'s callback (requeued when it has none
        or the callback fails; left unsettled once ``sub`` stops consuming)."""
        delivery = self.delivery(ch, method, properties, body)
        if delivery is None or not sub.consuming:
            # stopping: the channel's close gives it back in its place (a requeue would
            # put it behind the later messages of a quorum queue)
            return
        callback = sub.on_message
        if callback is None:
            delivery.nack(requeue=True)
            return
        try:
            callback(delivery)
        except Exception:
            log.exception("on_message callback failed for %s; message requeued", sub.queue)
            delivery.nack(requeue=True)

    def delivery(
        self, ch: Channel, method: Any, properties: Any, body: bytes, *, no_ack: bool = False
    ) -> Delivery | None:
        """The Received for a delivery, or None (settled here) for a queue primer or a
        message without a representable topic; ``no_ack``: RabbitMQ already removed it."""
        headers = headers_of(properties)
        if PRIMER_HEADER in headers:
            if not no_ack:  # a queue primer (see Declarations.prime), not a message
                ch.pika.basic_ack(method.delivery_tag)
            return None
        if _DEATH_REASON in headers and HEADER_DROPPED_REASON not in headers:
            headers = self.dropped(headers, properties)
        try:
            topic = self.names.topic_of(method.exchange, method.routing_key, headers)
        except NameNotRepresentable as exc:
            # Nothing a WS-N consumer could be told about; do not redeliver it forever.
            log.warning("dropping message without a topic: %s", exc)
            if not no_ack:
                ch.pika.basic_nack(method.delivery_tag, requeue=False)
            return None
        return Delivery(
            ch.link,
            ch,
            method.delivery_tag,
            topic,
            body,
            headers,
            properties.content_type or "application/octet-stream",
            bool(method.redelivered),
            settled=no_ack,
        )

    def dropped(self, headers: Mapping[str, str], properties: Any = None) -> dict[str, str]:
        """``headers`` of a message RabbitMQ dead-lettered, with ``HEADER_DROPPED_REASON``
        (``expired``: max-age, ``maxlen``: overflow, RabbitMQ's word otherwise),
        ``HEADER_DROPPED_FROM`` (the subscription whose queue it left) and
        ``HEADER_DROPPED_AT`` (the time of its first ``x-death`` entry, when it has one)."""
        out = dict(headers)
        deaths = (getattr(properties, "headers", None) or {}).get("x-death")
        if isinstance(deaths, list) and deaths and isinstance(deaths[-1], dict):
            # entries are newest first: the last one is the first death
            when = deaths[-1].get("time")
            if isinstance(when, datetime):
                stamp = when if when.tzinfo is not None else when.replace(tzinfo=UTC)
                out[HEADER_DROPPED_AT] = stamp.isoformat()
        reason = headers[_DEATH_REASON]
        out[HEADER_DROPPED_REASON] = _DEATH_REASONS.get(reason, reason)
        queue = headers.get(_DEATH_QUEUE, "")
        prefix = self.queue_prefix
        out[HEADER_DROPPED_FROM] = queue[len(prefix) :] if queue.startswith(prefix) else queue
        return out
