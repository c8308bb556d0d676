"""Inbound notifications: Notify to the broker or to a pull point, publishing into the
middleware, and the current message per topic (GetCurrentMessage).

A Notify is validated as a whole before anything is published (topics resolved and
checked against the topic set, ``requires_registration`` checked, the fan-out bound) and
answered only once the middleware confirmed every message.  Its new topics are admitted
to the topic set together, once every check passed: a refused Notify admits none.  A
Notify sent to a pull point admits nothing: the topic set is the broker's, the
NotificationProducer's (BN §4.1: the topics it supports), and a pull point is a
NotificationConsumer whose messages go only into its inbox (BN §5.1.1: it accumulates
what it is sent, with no constraint of its own), so its topics are checked only against
their declared namespaces' rules, never against the set's members, its fixedness or
``quotas.ad_hoc_topics``.

With ``requires_registration`` a message is accepted when its ProducerReference address
equals the PublisherReference of a live registration whose topics cover the message's
topic; otherwise the whole Notify is refused with PublisherRegistrationRejectedFault.
A middleware that does not confirm a publish gives ResourceUnavailableFault (Receiver).

The current message of a topic comes from the middleware when it keeps one
(``retained_current_message``), otherwise from the store, which core updates after each
confirmed publish.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

from wsnmom.core import errors, metrics
from wsnmom.core.access import current_principal, may_manage
from wsnmom.core.adapter import AdapterError, PublishReceipt, TopicUnavailable
from wsnmom.core.codec import decode, encode
from wsnmom.core.context import BrokerContext
from wsnmom.core.direct_routing import DirectRouting
from wsnmom.core.filters import concrete_topic, topic_errors
from wsnmom.core.lifetimes import is_expired
from wsnmom.core.log_context import current_request_id
from wsnmom.core.model import (
    EndpointReference,
    ExpressionSource,
    InboundNotification,
    NotificationMessage,
    new_message_ids,
)
from wsnmom.topic_mapping.model import Topic

__all__ = ["Inbound"]

log = logging.getLogger(__name__)


class Inbound:
    """Validates and publishes notifications; answers GetCurrentMessage."""

    def __init__(self, ctx: BrokerContext, direct: DirectRouting) -> None:
        self._ctx = ctx
        self._direct = direct

    def prepare(
        self,
        items: Sequence[InboundNotification],
        *,
        registration_check: bool,
        stamp: bool = False,
        admit: bool = True,
        into_pull_point: bool = False,
    ) -> list[NotificationMessage]:
        """Validate a Notify's messages and make them NotificationMessages.

        With ``stamp`` (Notify to the broker) each message's via list gets this gateway's
        id, and a message that already went through this gateway (or through
        ``loops.max_hops`` gateways) is left out (``core.loops``).

        Work that is the same for every message of one Notify is done once: one timestamp,
        one draw of message ids (``new_message_ids``), each topic expression resolved and
        checked once while consecutive messages repeat it (one shared ``ExpressionSource``),
        each producer/topic pair checked against the registrations once.  A Notify is
        validated in message order and refused as a whole at its first invalid message;
        its new topics are admitted together at the end, all or none (``admit``; False:
        the caller does, :meth:`admit`; ``into_pull_point``: never, see the module's)."""
        ctx = self._ctx
        now = ctx.now()
        ids = new_message_ids(len(items))
        request_id = current_request_id()
        topic_set = ctx.topic_set
        check = registration_check and ctx.settings.requires_registration
        registered: set[tuple[str | None, Topic | None]] = set()
        principal = current_principal()
        acl = principal.notify is not None and not principal.admin
        allowed: set[Topic | None] = set()
        last_source: ExpressionSource | None = None
        last_topic: Topic | None = None
        last_dialect: str | None = None
        guard = ctx.loop_guard
        via_in: tuple[str, ...] | None = None
        via_out: tuple[str, ...] | None = ()
        out: list[NotificationMessage] = []
        new: dict[Topic, None] | None = None if into_pull_point else {}  # None: none kept
        for item, message_id in zip(items, ids, strict=True):
            via = item.via
            if stamp:
                if item.via is not via_in:  # one stamped tuple per Notify (codec reuses it)
                    via_in, via_out = item.via, guard.stamp(item.via)
                if via_out is None:
                    continue
                via = via_out
            source = item.topic
            topic: Topic | None = None
            dialect: str | None = None
            fresh = False
            if source is not None:
                if source is last_source or source == last_source:
                    topic, dialect = last_topic, last_dialect
                else:
                    topic, dialect = concrete_topic(source, topic_set)
                    fresh = True
            producer = item.producer_reference
            self._check_caller(topic, producer, allowed if acl else None, registered, check)
            if fresh and topic is not None:
                self._check_topic(topic, new)
                last_source, last_topic, last_dialect = source, topic, dialect
            out.append(
                NotificationMessage(
                    message_id=message_id,
                    payload=item.payload,
                    topic=topic,
                    topic_dialect=dialect,
                    producer_reference=producer,
                    published_at=now,
                    subscription_reference=item.subscription_reference,
                    request_id=request_id,
                    via=via,
                    headers=item.headers,
                )
            )
        if admit and new:
            self.admit(out)
        return out

    def _check_topic(self, topic: Topic, new: dict[Topic, None] | None) -> None:
        """Check ``topic`` (after the ACL and the registration: refused there, the bound is
        not the reason given) as a Notify's next topic after ``new``, its new topics
        before it (to which it is added if new); nothing is admitted yet.  ``new`` None: a
        Notify to a pull point, whose topics only their namespaces' rules check."""
        if new is None:
            with topic_errors():
                self._ctx.topic_set.check_name(topic)
        elif topic not in new:
            with topic_errors():
                if self._ctx.guard.check_topic(topic, ahead=len(new)):
                    new[topic] = None

    def admit(self, messages: Sequence[NotificationMessage]) -> None:
        """Admit the topics of ``messages`` (a prepared Notify) to the topic set, all of
        them or none (``Guard.admit_topics``)."""
        with topic_errors():
            self._ctx.guard.admit_topics(m.topic for m in messages if m.topic is not None)

    def _check_caller(
        self,
        topic: Topic | None,
        producer: EndpointReference | None,
        allowed: set[Topic | None] | None,
        registered: set[tuple[str | None, Topic | None]],
        check: bool,
    ) -> None:
        """The caller may publish on ``topic``: its Notify ACL (``allowed``: the topics
        it passed already; None: no ACL) and, with ``check``, a registration of
        ``producer`` (``registered``: the pairs that passed already)."""
        if allowed is not None and topic not in allowed:
            self._ctx.guard.check_notify(topic)
            allowed.add(topic)
        if check:
            key = (producer.address if producer is not None else None, topic)
            if key not in registered:
                self.check_registered(producer, topic)
                registered.add(key)

    def check_registered(self, producer: EndpointReference | None, topic: Topic | None) -> None:
        """Raise PublisherRegistrationRejected unless a live registration of the caller
        (the identity that registered: ``core.access``) covers ``producer`` publishing on
        ``topic``."""
        ctx = self._ctx
        if producer is not None:
            now = ctx.now()
            principal = current_principal()
            with ctx.registry.lock:
                regs = list(ctx.registry.registrations.values())
            for reg in regs:
                ref = reg.record.publisher_reference
                if ref is None or ref.address != producer.address:
                    continue
                if not may_manage(principal, reg.record.owner):
                    continue  # registered by another identity: it cannot vouch for this one
                if is_expired(reg.record.termination_time, now):
                    continue
                if not reg.topics or (
                    topic is not None and any(t.matches(topic) for t in reg.topics)
                ):
                    return
        metrics.NOTIFICATIONS_REJECTED.labels(reason="unregistered").inc()
        who = producer.address if producer is not None else "an anonymous producer"
        raise errors.PublisherRegistrationRejected(
            f"this broker requires registration; {who} is not registered for "
            f"{topic if topic is not None else 'topicless notifications'}"
        )

    def publish(self, messages: Sequence[NotificationMessage], route: Topic | None = None) -> None:
        """Publish ``messages`` (on their topics, or all on ``route``) and wait for the
        middleware's confirmation; ResourceUnavailable when it does not confirm."""
        if not messages:
            return
        tracing = self._ctx.tracing
        if tracing is not None:
            with tracing.publish([m.headers for m in messages]):
                self._publish(messages, route)
        else:
            self._publish(messages, route)

    def _publish(self, messages: Sequence[NotificationMessage], route: Topic | None) -> None:
        ctx = self._ctx
        outbound = [encode(m, route=route) for m in messages]
        timeout = ctx.settings.publish_timeout
        capabilities = ctx.adapter.capabilities
        receipts: list[PublishReceipt]
        try:
            if route is None and capabilities.sole_publisher:
                receipts = self._direct.publish(outbound, messages, timeout)
            else:
                receipts = ctx.adapter.publish_many(outbound, timeout)
        except TopicUnavailable as exc:
            raise errors.TopicNotSupported(str(exc)) from exc
        except AdapterError as exc:
            refusal = ctx.gate.refusal(exc)
            if refusal is not None:
                raise refusal from exc
            raise errors.ResourceUnavailable(
                f"the middleware did not confirm the notifications: {exc}"
            ) from exc
        metrics.NOTIFICATIONS_IN.inc(len(messages))
        if route is None:
            ctx.topic_stats.count(m.topic for m in messages)
        ctx.observers.published(messages, receipts)
        if route is None and not capabilities.retained_current_message:
            for m in messages:
                if m.topic is not None:
                    try:
                        ctx.store.put_current_message(m)
                    except Exception:
                        log.exception("storing the current message failed")

    def notify(self, items: Sequence[InboundNotification]) -> None:
        """Notify to the broker: validate, publish, return once confirmed."""
        tracing = self._ctx.tracing
        if tracing is not None:
            with tracing.receive([i.headers for i in items]):
                self._notify(items)
        else:
            self._notify(items)

    def _notify(self, items: Sequence[InboundNotification]) -> None:
        prepared = self.prepare(items, registration_check=True, stamp=True, admit=False)
        self._ctx.guard.check_fanout(prepared)
        self.admit(prepared)  # every check passed: a refused Notify admits nothing
        self.publish(prepared)

    def get_current_message(self, topic: ExpressionSource) -> NotificationMessage:
        """The last notification on exactly one topic (BN §4.3)."""
        ctx = self._ctx
        concrete, _ = concrete_topic(topic, ctx.topic_set)
        ctx.guard.check_read(concrete)
        if not ctx.topic_set.permits(concrete):
            raise errors.TopicNotSupported(f"topic {concrete} is not supported")
        message = self.current(concrete)
        if message is None:
            raise errors.NoCurrentMessageOnTopic(f"no current message on topic {concrete}")
        return message

    def current(self, concrete: Topic) -> NotificationMessage | None:
        """The last notification on ``concrete`` (None: none kept), no access check."""
        ctx = self._ctx
        message: NotificationMessage | None = None
        if ctx.adapter.capabilities.retained_current_message:
            try:
                stored = ctx.adapter.current_message(concrete)
            except AdapterError as exc:
                raise ctx.gate.unavailable(exc) from exc
            if stored is not None:
                message = decode(stored)
        if message is None:
            message = ctx.store.get_current_message(concrete)
        if message is None:
            return None
        dialect = ctx.topic_dialect(message.topic_dialect)
        return (
            message if dialect == message.topic_dialect else replace(message, topic_dialect=dialect)
        )
