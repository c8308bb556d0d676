"""``WsnClient``: every WS-BaseNotification / WS-BrokeredNotification operation against a
broker over HTTP.

::

    from datetime import timedelta
    from wsnmom.client import NotificationConsumer, WsnClient

    broker = "http://127.0.0.1:8080/wsn/broker"
    with WsnClient(broker, namespaces={"tns": "urn:example"}) as wsn:
        with NotificationConsumer() as consumer:
            lifetime = timedelta(hours=1)
            sub = wsn.subscribe(consumer, "tns:sensors//*", initial_termination_time=lifetime)
            wsn.notify("<t>21.5</t>", "tns:sensors/room1")
            print(consumer.get(timeout=5).payload_xml)
            sub.unsubscribe()

Topics are :class:`~wsnmom.client.model.TopicExpression` values or text; text may use the
prefixes given as ``namespaces`` (to the client or per call) or Clark notation
(``{urn:example}sensors/room1``).  Resource operations take the handle the broker's answer
was turned into, its endpoint reference, or just its address.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Literal, Self

import requests
from lxml import etree

from wsnmom.core.model import EndpointReference, SoapVersion
from wsnmom.soap_frontend.codec import ACTIONS, BR, Op, T, add, expression
from wsnmom.soap_frontend.message_info import request_header
from wsnmom.soap_frontend.xml import (
    WSNMOM,
    WSRF_RL,
    WSRF_RP,
    children,
    parse_fragment,
    qname,
    text_of,
)
from wsnmom.topic_mapping.dialects import XPATH

from . import DEFAULT_BROKER, wire
from .credentials import Credentials
from .errors import InvalidResourcePropertyQNameFault, TransportError
from .model import Message, Notification, Payload, TerminationTime, TopicExpression
from .resources import PublisherRegistration, PullPoint, Subscription, SubscriptionProperties
from .transport import SoapTransport
from .wire import new

__all__ = ["DEFAULT_BROKER", "Target", "WsnClient"]

#: a resource to act on: its handle, endpoint reference or address
Target = Subscription | PullPoint | PublisherRegistration | EndpointReference | str


def _epr(target: Target) -> EndpointReference:
    if isinstance(target, Subscription | PullPoint | PublisherRegistration):
        return target.reference
    return wire.as_epr(target)


class WsnClient:
    """A client of one WS-N broker (thread-compatible: use one per thread)."""

    def __init__(
        self,
        broker: str = DEFAULT_BROKER,
        *,
        namespaces: Mapping[str, str] | None = None,
        soap_version: SoapVersion = SoapVersion.SOAP12,
        timeout: float = 30.0,
        session: requests.Session | None = None,
        user: str | None = None,
        password: str | None = None,
        token: str | None = None,
        wsse: Literal["digest", "text"] | None = None,
        credentials: Credentials | None = None,
        verify: str | bool | None = None,
        cert: str | tuple[str, str] | None = None,
    ) -> None:
        """``broker``: the NotificationBroker endpoint; ``namespaces``: prefix -> URI for
        the prefixes topic texts use; ``soap_version``: 1.2 (default) or 1.1.

        Credentials for a broker that requires them: ``user`` and ``password`` (HTTP
        Basic, or with ``wsse="digest"`` / ``"text"`` a WS-Security UsernameToken), or a
        bearer ``token``; or a :class:`~wsnmom.client.credentials.Credentials`.  HTTPS:
        ``verify`` (a CA bundle, or False) and ``cert`` (a client certificate for mutual
        TLS: a PEM file with its key, or (certificate, key))."""
        self.broker_url = broker
        self.namespaces: dict[str, str] = dict(namespaces or {})
        if credentials is None and (user is not None or token is not None):
            credentials = Credentials(user, password, token, wsse)
        self.transport = SoapTransport(
            version=soap_version,
            timeout=timeout,
            session=session,
            credentials=credentials,
            verify=verify,
            cert=cert,
        )

    def close(self) -> None:
        """Close the HTTP session."""
        self.transport.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _ns(self, namespaces: Mapping[str, str] | None) -> dict[str, str]:
        return {**self.namespaces, **(namespaces or {})}

    def _call(self, target: Target | None, body: etree._Element, op: Op) -> etree._Element:
        answer = self.transport.call(
            _epr(target) if target is not None else self.broker_url, body, ACTIONS[op][0]
        )
        if answer is None:
            raise TransportError(f"empty answer to {op.local}")
        return answer

    # --- NotificationProducer / NotificationBroker ----------------------------------------
    def subscribe(
        self,
        consumer: EndpointReference | str | object,
        topic: TopicExpression | str | None = None,
        *,
        namespaces: Mapping[str, str] | None = None,
        message_content: str | None = None,
        message_content_dialect: str = XPATH,
        message_content_namespaces: Mapping[str, str] | None = None,
        producer_properties: str | None = None,
        initial_termination_time: TerminationTime | None = None,
        use_raw: bool = False,
        subscription_end_topic: TopicExpression | str | None = None,
        policies: Sequence[etree._Element] = (),
    ) -> Subscription:
        """Subscribe ``consumer`` (an address, an EPR, or anything with an ``address`` such
        as a :class:`~wsnmom.client.consumer.NotificationConsumer` or a
        :class:`~wsnmom.client.resources.PullPoint`).

        ``topic`` filters by topic expression, ``message_content`` by an XPath over the
        payload (namespaces of its prefixes in ``message_content_namespaces``),
        ``initial_termination_time`` asks for a lifetime, ``use_raw`` for raw delivery
        (the payload is the whole SOAP Body), ``subscription_end_topic`` for the NCIA
        SubscriptionEnd notification on that topic; ``policies`` are further
        SubscriptionPolicy elements."""
        consumer_epr = (
            consumer.reference if isinstance(consumer, PullPoint) else wire.as_epr(consumer)
        )
        body = wire.subscribe_body(
            consumer_epr,
            topic,
            self._ns(namespaces),
            message_content=message_content,
            message_content_dialect=message_content_dialect,
            message_content_namespaces=message_content_namespaces or {},
            producer_properties=producer_properties,
            initial_termination_time=initial_termination_time,
            use_raw=use_raw,
            subscription_end_topic=subscription_end_topic,
            policies=policies,
        )
        answer = self._call(None, body, Op.SUBSCRIBE)
        reference = wire.child_epr(answer, T("SubscriptionReference"))
        if reference is None:
            raise TransportError("SubscribeResponse without a SubscriptionReference")
        return Subscription(
            self,
            reference,
            current_time=wire.child_time(answer, T("CurrentTime")),
            termination_time=wire.child_time(answer, T("TerminationTime")),
        )

    def notify(
        self,
        payload: Payload,
        topic: TopicExpression | str | None = None,
        *,
        producer: EndpointReference | str | None = None,
        namespaces: Mapping[str, str] | None = None,
        to: Target | None = None,
    ) -> None:
        """Publish one notification (to the broker, or ``to`` a pull point or a
        registration's consumer reference)."""
        self.notify_many([Message(payload, topic, producer)], namespaces=namespaces, to=to)

    def notify_many(
        self,
        messages: Iterable[Message | tuple[Payload, TopicExpression | str | None]],
        *,
        namespaces: Mapping[str, str] | None = None,
        to: Target | None = None,
        batch_size: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Publish several notifications: one Notify per ``batch_size`` messages (all in
        one when None).  ``progress`` is called with the running count after each
        request.  Returns the number of messages sent."""
        ns = self._ns(namespaces)
        target = _epr(to) if to is not None else EndpointReference(self.broker_url)
        action = ACTIONS[Op.NOTIFY][0]
        sent = 0
        batch: list[Message] = []

        def flush() -> None:
            nonlocal sent
            if batch:
                info = request_header([tuple((m.headers or {}).items()) for m in batch])
                extra = (info,) if info is not None else ()
                self.transport.call(target, wire.notify_body(batch, ns), action, extra)
                sent += len(batch)
                batch.clear()
                if progress is not None:
                    progress(sent)

        for item in messages:
            batch.append(item if isinstance(item, Message) else Message(*item))
            if batch_size is not None and len(batch) >= batch_size:
                flush()
        if not batch and sent == 0:
            raise ValueError("no messages to send")
        flush()
        return sent

    def get_current_message(
        self, topic: TopicExpression | str, *, namespaces: Mapping[str, str] | None = None
    ) -> Notification:
        """The last notification published on a concrete topic
        (:class:`~wsnmom.client.errors.NoCurrentMessageOnTopicFault` when there is none)."""
        body = new(T("GetCurrentMessage"))
        ns = self._ns(namespaces)
        wire.topic_element(body, T("Topic"), topic, ns)
        answer = self._call(None, body, Op.GET_CURRENT_MESSAGE)
        payload = children(answer)
        if not payload:
            raise TransportError("GetCurrentMessageResponse without a message")
        return Notification(
            payload=parse_fragment(etree.tostring(payload[0])),
            topic=TopicExpression.parse(topic, ns),
        )

    # --- SubscriptionManager ---------------------------------------------------------------
    def subscription(self, target: EndpointReference | str) -> Subscription:
        """A handle for an existing subscription, from its address or EPR."""
        return Subscription(self, wire.as_epr(target))

    def renew(
        self, subscription: Target, termination_time: TerminationTime
    ) -> tuple[datetime | None, datetime | None]:
        """Renew: (granted termination time, broker's current time)."""
        body = new(T("Renew"))
        wire.requested_time(body, T("TerminationTime"), termination_time)
        answer = self._call(subscription, body, Op.RENEW)
        return (
            wire.child_time(answer, T("TerminationTime")),
            wire.child_time(answer, T("CurrentTime")),
        )

    def unsubscribe(self, subscription: Target) -> None:
        """End a subscription."""
        self._call(subscription, new(T("Unsubscribe")), Op.UNSUBSCRIBE)

    def pause(self, subscription: Target) -> None:
        """Pause a subscription."""
        self._call(subscription, new(T("PauseSubscription")), Op.PAUSE)

    def resume(self, subscription: Target) -> None:
        """Resume a paused subscription."""
        self._call(subscription, new(T("ResumeSubscription")), Op.RESUME)

    def subscription_properties(self, subscription: Target) -> SubscriptionProperties:
        """A subscription's resource properties: its property document, plus its current
        and termination time and (from wsnmom brokers) whether it is paused."""
        document = self.get_resource_property_document(subscription)
        times = self._optional_properties(
            subscription, [qname(WSRF_RL, "TerminationTime"), qname(WSRF_RL, "CurrentTime")]
        )
        paused = self._optional_properties(subscription, [qname(WSNMOM, "Paused")])
        filt = document.find(T("Filter"))
        topic_el = filt.find(T("TopicExpression")) if filt is not None else None
        content_el = filt.find(T("MessageContent")) if filt is not None else None
        policy = document.find(T("SubscriptionPolicy"))
        holder = new(qname(WSNMOM, "_"))
        for el in times:
            holder.append(el)
        return SubscriptionProperties(
            consumer_reference=wire.child_epr(document, T("ConsumerReference")),
            topic=_topic_of(topic_el),
            message_content=text_of(content_el) if content_el is not None else None,
            message_content_dialect=content_el.get("Dialect") if content_el is not None else None,
            creation_time=wire.child_time(document, T("CreationTime")),
            termination_time=wire.child_time(holder, qname(WSRF_RL, "TerminationTime")),
            current_time=wire.child_time(holder, qname(WSRF_RL, "CurrentTime")),
            paused=(text_of(paused[0]) in ("true", "1")) if paused else None,
            use_raw=policy is not None and policy.find(T("UseRaw")) is not None,
            document=document,
        )

    def _optional_properties(self, target: Target, names: list[str]) -> list[etree._Element]:
        try:
            return self.get_multiple_resource_properties(names, target=target)
        except InvalidResourcePropertyQNameFault:
            return []

    # --- pull points -----------------------------------------------------------------------
    def create_pull_point(
        self,
        *,
        initial_termination_time: TerminationTime | None = None,
        name: str | None = None,
    ) -> PullPoint:
        """Create a pull point (``name``: Apache CXF's ``pullPointQueueName``)."""
        body = new(T("CreatePullPoint"))
        if name is not None:
            body.set(T("pullPointQueueName"), name)
        if initial_termination_time is not None:
            wire.requested_time(body, T("InitialTerminationTime"), initial_termination_time)
        answer = self._call(None, body, Op.CREATE_PULL_POINT)
        reference = wire.child_epr(answer, T("PullPoint"))
        if reference is None:
            raise TransportError("CreatePullPointResponse without a PullPoint")
        return PullPoint(
            self,
            reference,
            termination_time=wire.child_time(answer, qname(WSRF_RL, "TerminationTime")),
        )

    def pull_point(self, target: EndpointReference | str) -> PullPoint:
        """A handle for an existing pull point, from its address or EPR."""
        return PullPoint(self, wire.as_epr(target))

    def get_messages(self, pull_point: Target, maximum: int | None = None) -> list[Notification]:
        """GetMessages: take up to ``maximum`` notifications from a pull point."""
        body = new(T("GetMessages"))
        if maximum is not None:
            add(body, T("MaximumNumber"), str(maximum))
        answer = self._call(pull_point, body, Op.GET_MESSAGES)
        received = wire.notifications(answer)
        wire.apply_message_info(received, wire.soap_headers(answer))
        return received

    def destroy_pull_point(self, pull_point: Target) -> None:
        """DestroyPullPoint."""
        self._call(pull_point, new(T("DestroyPullPoint")), Op.DESTROY_PULL_POINT)

    # --- publisher registrations -----------------------------------------------------------
    def register_publisher(
        self,
        publisher: EndpointReference | str | None = None,
        topics: Sequence[TopicExpression | str] = (),
        *,
        namespaces: Mapping[str, str] | None = None,
        demand: bool = False,
        initial_termination_time: TerminationTime | None = None,
    ) -> PublisherRegistration:
        """RegisterPublisher; ``demand=True`` asks for demand-based publishing (the broker
        then subscribes to ``publisher`` only while someone wants its topics)."""
        publisher_epr = wire.as_epr(publisher) if publisher is not None else None
        body = wire.register_publisher_body(
            publisher_epr, topics, self._ns(namespaces), demand, initial_termination_time
        )
        answer = self._call(None, body, Op.REGISTER_PUBLISHER)
        reference = wire.child_epr(answer, BR("PublisherRegistrationReference"))
        if reference is None:
            raise TransportError("RegisterPublisherResponse without a registration reference")
        return PublisherRegistration(
            self,
            reference,
            consumer_reference=wire.child_epr(answer, BR("ConsumerReference")),
            publisher=publisher_epr,
        )

    def destroy_registration(self, registration: Target) -> None:
        """DestroyRegistration."""
        self._call(registration, new(BR("DestroyRegistration")), Op.DESTROY_REGISTRATION)

    # --- WS-ResourceProperties -------------------------------------------------------------
    def get_resource_property(
        self, name: str, *, target: Target | None = None
    ) -> list[etree._Element]:
        """The values of one resource property (Clark name ``{ns}local``) of the broker,
        or of ``target``."""
        answer = self._call(target, wire.get_resource_property_body(name), Op.GET_RESOURCE_PROPERTY)
        return children(answer)

    def get_multiple_resource_properties(
        self, names: Sequence[str], *, target: Target | None = None
    ) -> list[etree._Element]:
        """The values of several resource properties, in one request."""
        body = wire.get_multiple_resource_properties_body(names)
        return children(self._call(target, body, Op.GET_MULTIPLE_RESOURCE_PROPERTIES))

    def get_resource_property_document(self, target: Target | None = None) -> etree._Element:
        """The resource property document of the broker or of ``target``."""
        body = etree.Element(
            qname(WSRF_RP, "GetResourcePropertyDocument"), nsmap={"wsrf-rp": WSRF_RP}
        )
        answer = self._call(target, body, Op.GET_RESOURCE_PROPERTY_DOCUMENT)
        kids = children(answer)
        if not kids:
            raise TransportError("GetResourcePropertyDocumentResponse without a document")
        return kids[0]

    def topic_expression_dialects(self) -> list[str]:
        """The topic expression dialects the broker supports."""
        return [text_of(el) for el in self.get_resource_property(T("TopicExpressionDialect"))]


def _topic_of(el: etree._Element | None) -> TopicExpression | None:
    return TopicExpression.from_source(expression(el)) if el is not None else None
